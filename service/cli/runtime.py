"""``orthoplex run`` (an elastic job on a local or given Ray cluster) and ``orthoplex cluster up|down``.

Heavy imports (ray, torch) happen inside the commands so ``orthoplex --help`` stays fast.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

from service.cli.client import cluster_group
from service.cli.plan import recovery_line
from workers.states import ATTEMPT_TERMINAL


def build_spec(
    *,
    model: str,
    steps: int,
    global_batch: int,
    min_gpus: int,
    layout_hint: str | None,
    checkpoint_dir: str,
    kill_node_at_step: int | None,
    slow_node_at_step: int | None,
    slow_factor: float,
    events_out: str | None,
    metrics_out: str | None,
    max_checkpoint_every: int,
    hang_timeout_s: float,
    max_gpus: int | None = None,
    snapshots: bool | None = None,
    snapshot_every: int | None = None,
    warm_ranks: int | None = None,
    replica_groups: int = 0,
    faults: list[dict[str, Any]] | None = None,
    recovery: str = "auto",
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> dict[str, Any]:
    """The job spec ``orthoplex run`` submits (faults only when a fault option is given; ``faults``:
    more of them as job-spec fault objects, e.g. the ``net_*`` kinds). Its recovery is the service's
    (``service.recovery.job_recovery`` on the best plan for up to ``max_gpus``, or every GPU of
    ``nodes`` x ``gpus_per_node``; then the one translation, ``attempt_spec.recovery_settings``):
    ``auto``, snapshots and warm ranks on unless turned off. ``replica_groups`` N names
    ``replica_groups`` with N groups (without ``max_gpus``: N groups of the hint's layout).
    ``ValueError`` naming the option when the block cannot hold."""
    from planner.recovery_choice import ChoiceError, check_block
    from service.recovery import plan_recovery, runnable
    from workers.runtime.contract.attempt_spec import recovery_settings

    if max_gpus is not None and max_gpus < min_gpus:
        raise ValueError(f"--max-gpus: {max_gpus} is below --min-gpus {min_gpus}")
    from planner.layout import parse_hint

    faults = list(faults or [])
    if kill_node_at_step is not None:
        faults.append({"kind": "kill_node", "at_step": kill_node_at_step, "rank": -1})
    if slow_node_at_step is not None:
        faults.append({"kind": "slow_node", "at_step": slow_node_at_step, "rank": -1, "factor": slow_factor})
    spec: dict[str, Any] = {
        "model": model,
        "steps": steps,
        "global_batch": global_batch,
        "min_gpus": min_gpus,
        "checkpoint_dir": checkpoint_dir,
        "checkpoint": {"min_every_steps": 1, "max_every_steps": max_checkpoint_every},
        "runtime": {"hang_timeout_s": hang_timeout_s},
        "faults": faults,
    }
    if max_gpus is not None:
        spec["max_gpus"] = max_gpus
    if layout_hint:
        spec["layout_hint"] = dict(parse_hint(layout_hint))
    block: dict[str, Any] = {"policy": "replica_groups" if replica_groups else recovery}
    if replica_groups:
        block["groups"] = replica_groups
    snaps = {k: v for k, v in (("enabled", snapshots), ("every", snapshot_every)) if v is not None}
    if snaps:
        block["snapshots"] = snaps
    if warm_ranks is not None:
        block["warm_ranks"] = warm_ranks
    flags = {"recovery.policy": "--recovery", "recovery.groups": "--replica-groups",
             "recovery.snapshots.enabled": "--snapshots", "recovery.snapshots.every": "--snapshot-every",
             "recovery.warm_ranks": "--warm-ranks"}
    if replica_groups:
        flags["recovery.policy"] = "--replica-groups"
    try:
        check_block(block)
        gpus = max_gpus or (nodes * gpus_per_node if nodes and gpus_per_node else min_gpus)
        if replica_groups and max_gpus is None:  # R groups of the hint's layout (its tp, pp, cp, dp; default 1)
            hint = spec.get("layout_hint") or {}
            gpus = replica_groups * int(hint.get("tp", 1)) * int(hint.get("pp", 1)) * int(hint.get("cp", 1)) * int(
                hint.get("dp", 1))
        job = {**spec, "recovery": block}
        # as the runtime will run it: auto re-plans where the runtime has no replica path for the plan
        choice = runnable(job, plan_recovery(job, gpus, gpu_type="CPU", gpus_per_node=gpus_per_node), strict=True)
    except ChoiceError as exc:
        raise ValueError(f"{flags.get(exc.field, exc.field)}: {exc.msg}") from None
    recovery_settings(spec, spec, choice.to_dict())
    spec["recovery"] = choice.to_dict()  # what the run chose, and why (the summary prints it)
    if events_out:
        spec["events_out"] = str(Path(events_out).resolve())
    if metrics_out:
        spec["metrics_out"] = str(Path(metrics_out).resolve())
    return spec


def _progress_line(e: dict[str, Any], t0: float) -> str | None:
    t = f"[{e['ts'] - t0:7.1f}s]"
    kind = e["type"]
    if kind == "step":
        return f"{t} step {e['step']:>5}  loss {e['loss']:.4f}  {e['wall_s']:.2f}s  world {e['world_size']}"
    if kind == "plan":
        return f"{t} plan      {e['short']} on {e['num_gpus']} GPUs ({e['reason']})"
    if kind == "replan":
        return (f"{t} replan    {e['old_short']} -> {e['new_short']} [{e['decision']}] "
                f"predicted {e['old_tokens_per_s']:.0f} -> {e['new_tokens_per_s']:.0f} tok/s ({e['reason']})")
    if kind == "recovery":
        ph = "  ".join(f"{k} {v:.2f}s" for k, v in e["phases"].items())
        return f"{t} recovery  {e['total_s']:.2f}s = {ph}"
    if kind in ("ranks_mapped", "started"):
        return None
    return f"{t} {kind:<9} {e.get('reason', '')}"


def summarize(result: dict[str, Any]) -> str:
    """The final summary: plans used, failures, recovery time by phase, final loss."""
    lines = [f"state: {result['state']}  steps: {result['steps_done']}  final loss: {result['final_loss']}"]
    lines.append("plans: " + " -> ".join(f"{p['short']} ({p['num_gpus']} GPUs)" for p in result["plans"]))
    for f in result["failures"]:
        lines.append(f"failure at step {f['step']}: {f['kind']}: {f['reason']}")
    for r in result["recoveries"]:
        ph = ", ".join(f"{k} {v:.2f}s" for k, v in r["phases"].items())
        lines.append(f"recovery ({r['cause']}): {r['total_s']:.2f}s = {ph}")
    reps = result.get("replicas")
    if reps:
        lines.append(f"replica groups: {len(reps['live'])} of {reps['want']} at the end; dropped "
                     + (", ".join(f"group {d['group']} at step {d['step']}" for d in reps["dropped"]) or "none"))
    if result.get("error"):
        lines.append(f"error: {result['error']}")
    return "\n".join(lines)


def run_job(spec: dict[str, Any], *, address: str | None, nodes: int, gpus_per_node: int, job_id: str,
            echo: Any = typer.echo, poll_s: float = 0.5) -> dict[str, Any]:
    """Run ``spec`` to an end on ``address`` (or on a fresh local cluster); returns the supervisor's summary."""
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor
    from workers.testbed.local_cluster import InProcessCluster, local_env

    local_env()
    local = None
    if address is None and not ray.is_initialized():
        echo(f"starting a local Ray cluster: {nodes} nodes x {gpus_per_node} GPUs (declared)")
        local = InProcessCluster(nodes=nodes, gpus_per_node=gpus_per_node).start()
    elif not ray.is_initialized():
        from service.controller.ray_access import use_cluster_token
        from service.settings import get_settings

        # the cluster's token: ORTHOPLEX_RAY_TOKEN_FILE, Ray's RAY_AUTH_TOKEN(_PATH), or `cluster up`'s
        use_cluster_token(get_settings().model_copy(update={"ray_address": address}))
        ray.init(address=address, namespace="orthoplex", log_to_driver=False)
    try:
        handle = start_supervisor(job_id, 1, spec, enable_fault_injection=bool(spec.get("faults")))
        seq, t0 = 0, time.time()
        while True:
            for e in ray.get(handle.events.remote(seq)):
                seq = e["seq"]
                line = _progress_line(e, t0)
                if line:
                    echo(line)
            if ray.get(handle.status.remote())["state"] in ATTEMPT_TERMINAL:
                break
            time.sleep(poll_s)
        result = ray.get(handle.run.remote())
        for e in ray.get(handle.events.remote(seq)):
            line = _progress_line(e, t0)
            if line:
                echo(line)
        stop_supervisor(job_id, 1)
        return result
    finally:
        if local is not None:
            local.shutdown()


def _parse_fault_options(options: list[str], address: str | None) -> list[dict[str, Any]]:
    """``--fault`` JSON objects, validated (``fault_spec``); network kinds refused without ``--address``
    (the local cluster ``run`` would start is in-process: no network namespaces)."""
    from workers.runtime.contract.fault_spec import parse_fault

    out = []
    for raw in options:
        try:
            item = json.loads(raw)
            f = parse_fault(item)
        except (json.JSONDecodeError, ValueError) as e:
            raise typer.BadParameter(str(e), param_hint="--fault") from None
        if f.network and address is None:
            raise typer.BadParameter(f"{f.kind} needs a namespaced cluster: start one with `orthoplex cluster up "
                                     "--netns` and pass its --address (the local cluster is in-process)",
                                     param_hint="--fault")
        out.append(item)
    return out


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``cluster up|down`` to ``app``."""

    @app.command("run")
    def run(
        nodes: int = typer.Option(3, "--nodes", min=1, help="Local cluster: worker nodes."),
        gpus_per_node: int = typer.Option(4, "--gpus-per-node", min=1, help="Local cluster: declared GPUs per node."),
        model: str = typer.Option("tiny", "--model", help="Engine model preset."),
        steps: int = typer.Option(20, "--steps", min=1),
        global_batch: int = typer.Option(12, "--global-batch", min=1),
        min_gpus: int = typer.Option(1, "--min-gpus", min=1, help="Shrink no further than this."),
        max_gpus: int | None = typer.Option(None, "--max-gpus", min=1,
                                            help="Use at most this many GPUs (also after a re-plan)."),
        recovery: str = typer.Option("auto", "--recovery",
                                     help="auto (default: replica groups when the plan's dp holds two or more full "
                                     "replicas in memory, else re-plan from memory), replica_groups, replan or "
                                     "restart (from storage, no snapshots): as a service job's recovery.policy."),
        snapshots: bool | None = typer.Option(None, "--snapshots/--no-snapshots",
                                              help="Snapshot steps into two nodes' memory; re-plans restore from it. "
                                              "Default: on (off with --recovery restart)."),
        snapshot_every: int | None = typer.Option(None, "--snapshot-every", min=1,
                                                  help="A snapshot after every N-th step only (at most N steps lost); "
                                                  "default: the service's."),
        warm_ranks: int | None = typer.Option(None, "--warm-ranks", min=0,
                                              help="Pre-started rank actors kept idle per node (a re-plan's ranks start "
                                              "warm); default: the service's; 0 turns them off."),
        layout_hint: str | None = typer.Option(None, "--layout-hint", help="Fix fields of the first plan, e.g. tp=2,pp=2."),
        replica_groups: int = typer.Option(0, "--replica-groups", min=0,
                                           help="Run this many replica groups (= --recovery replica_groups with this "
                                           "many groups); a lost group is replaced from a live one while the others "
                                           "keep stepping."),
        kill_node_at_step: int | None = typer.Option(None, "--kill-node-at-step", help="Test hook: crash a node."),
        slow_node_at_step: int | None = typer.Option(None, "--slow-node-at-step", help="Test hook: slow a node."),
        slow_factor: float = typer.Option(2.0, "--slow-factor", help="With --slow-node-at-step."),
        fault: list[str] = typer.Option([], "--fault", help="Test hook: a job-spec fault as JSON, repeatable, e.g. "
                                        "'{\"kind\": \"net_partition\", \"at_step\": 5, \"duration_s\": 2}'. "
                                        "The net_* kinds need --address of `orthoplex cluster up --netns`."),
        events_out: str | None = typer.Option(None, "--events-out", help="Write events as JSONL."),
        metrics_out: str | None = typer.Option(None, "--metrics-out", help="Write per-step metrics as JSONL."),
        address: str | None = typer.Option(None, "--address", help="Use this Ray cluster instead of a local one."),
        checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Default: a fresh temp dir."),
        max_checkpoint_every: int = typer.Option(10, "--max-checkpoint-every", min=1,
                                                 help="Upper bound of the Young checkpoint interval (steps)."),
        hang_timeout_s: float = typer.Option(60.0, "--hang-timeout", help="A step without progress this long is a hang."),
        job_id: str | None = typer.Option(None, "--job-id"),
        as_json: bool = typer.Option(False, "--json", help="Print the job's summary as JSON."),
    ) -> None:
        """Run a job elastically: plan, place, train; survive node loss and stragglers by re-planning."""
        if max_gpus is not None and max_gpus < min_gpus:
            raise typer.BadParameter(f"{max_gpus} is below --min-gpus {min_gpus}", param_hint="--max-gpus")
        extra = _parse_fault_options(fault, address)
        ckpt = checkpoint_dir or tempfile.mkdtemp(prefix="orthoplex-run-")
        try:
            spec = build_spec(model=model, steps=steps, global_batch=global_batch, min_gpus=min_gpus,
                              layout_hint=layout_hint, checkpoint_dir=ckpt, kill_node_at_step=kill_node_at_step,
                              slow_node_at_step=slow_node_at_step, slow_factor=slow_factor, events_out=events_out,
                              metrics_out=metrics_out, max_checkpoint_every=max_checkpoint_every,
                              hang_timeout_s=hang_timeout_s, max_gpus=max_gpus, snapshots=snapshots,
                              snapshot_every=snapshot_every, warm_ranks=warm_ranks, replica_groups=replica_groups,
                              faults=extra, recovery=recovery, nodes=nodes, gpus_per_node=gpus_per_node)
        except ValueError as exc:
            flag, _, msg = str(exc).partition(": ")
            raise typer.BadParameter(msg or str(exc), param_hint=flag if flag.startswith("--") else None) from None
        typer.echo(recovery_line(spec.pop("recovery"), recovery), err=as_json)
        result = run_job(spec, address=address, nodes=nodes, gpus_per_node=gpus_per_node,
                         job_id=job_id or f"run-{int(time.time())}")
        typer.echo(json.dumps(result, default=str) if as_json else summarize(result))
        if result["state"] != "SUCCEEDED":
            raise typer.Exit(1)

    cluster_app = cluster_group(app)  # shared with `cluster drain|undrain` (service.cli.client)

    @cluster_app.command("up")
    def up(
        nodes: int = typer.Option(3, "--nodes", min=1),
        gpus_per_node: int = typer.Option(4, "--gpus-per-node", min=1),
        cpus_per_node: float = typer.Option(2.0, "--cpus-per-node"),
        data_dir: Path | None = typer.Option(None, "--data-dir", help="Where the cluster record lives."),
        netns: bool = typer.Option(False, "--netns", help="Every node in its own network namespace with its "
                                   "own IP on a bridge (needs root and `ip netns`), for real network faults."),
        as_json: bool = typer.Option(False, "--json", help="Print only the cluster's JSON line."),
    ) -> None:
        """Start a head and NODES worker nodes as ``ray start`` processes that outlive this command."""
        from workers.testbed.cluster_up import cluster_up

        if netns:
            from workers.testbed.cluster_up import netns_cluster_up
            from workers.testbed.netns_cluster import netns_available

            ok, why = netns_available()
            if ok:
                rec = netns_cluster_up(nodes, gpus_per_node, cpus_per_node=cpus_per_node, data_dir=data_dir)
                ips = {n["name"]: n["ip"] for n in rec["nodes"]}
                typer.echo(json.dumps({"address": rec["address"], "mode": "netns", "nodes": nodes,
                                       "gpus_per_node": gpus_per_node, "ips": ips, "bridge": rec["bridge"],
                                       "auth": "token", "token_file": rec["token_file"]}))
                if not as_json:
                    typer.echo(f"use it with: orthoplex run --address {rec['address']} ...; "
                               "stop it with: orthoplex cluster down")
                return
            typer.echo(f"network namespaces unavailable ({why}): starting the single-IP local cluster instead",
                       err=True)
        rec = cluster_up(nodes, gpus_per_node, cpus_per_node=cpus_per_node, data_dir=data_dir)
        typer.echo(json.dumps({"address": rec["address"], "mode": "local", "nodes": nodes,
                               "gpus_per_node": gpus_per_node, "auth": "token", "token_file": rec["token_file"]}))
        if not as_json:
            typer.echo(f"use it with: orthoplex run --address {rec['address']} ...; the service: "
                       f"ORTHOPLEX_RAY_ADDRESS={rec['address']} (its token is found beside the record; "
                       "`orthoplex cluster token` prints it); stop it with: orthoplex cluster down")

    @cluster_app.command("token")
    def token(data_dir: Path | None = typer.Option(None, "--data-dir", help="Where the cluster record lives."),
              path_only: bool = typer.Option(False, "--path", help="Print the token file's path, not the token.")
              ) -> None:
        """Print the Ray auth token of the cluster ``cluster up`` started (for ``RAY_AUTH_TOKEN`` of a
        client elsewhere); it is shown on request only, never by ``up``."""
        from workers.runtime.cluster.ray_auth import read_token
        from workers.testbed.cluster_up import read_record

        rec = read_record(data_dir)
        if rec is None or not rec.get("token_file"):
            typer.echo("error: no local cluster with a token is recorded (orthoplex cluster up)", err=True)
            raise typer.Exit(1)
        try:
            secret = read_token(Path(rec["token_file"]))
        except (OSError, ValueError) as exc:
            typer.echo(f"error: cannot read the cluster's token file: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(rec["token_file"] if path_only else secret)

    @cluster_app.command("down")
    def down(data_dir: Path | None = typer.Option(None, "--data-dir"),
             as_json: bool = typer.Option(False, "--json", help="Print {\"stopped\": N} as JSON.")) -> None:
        """Stop the local cluster started by ``cluster up``: its own processes (Ray's agents included) and,
        for ``--netns``, its namespaces and links; also after a crash of ``up``."""
        from workers.testbed.cluster_up import cluster_down

        n = cluster_down(data_dir)
        if as_json:
            typer.echo(json.dumps({"stopped": n}))
        else:
            typer.echo(f"stopped {n} processes" if n else "no local cluster is recorded")

