"""The outside baselines of the recovery benchmark (issue #14): the same model, batch and node failure
under Ray Train + torchft (``TorchftConfig``: replica groups, per-step quorum, the failed group
replaced and healed from a peer) and under Ray Train's plain restart (the worker group restarts from
its last checkpoint).

Cluster: a local ``cluster_utils`` cluster, head (0 GPUs) + 4 nodes x 2 declared GPUs (CPU torch,
gloo). Ray 2.60's ``TorchftConfig`` makes every Ray Train worker its own replica group (the worker
group is built with ``replica_group_size=1``), so the nearest thing to "3 replica groups of 2 GPUs"
is 3 workers holding 2 declared GPUs each: one group per node, a spare node, and a node kill takes
exactly one replica group. Each group trains the whole model (no TP inside a group: one process).

Model and data: the engine's ``tiny`` Llama (``workers.engine.model.build_model``), AdamW, lr
schedule and clipping of the engine (``build_adamw``, ``lr_at``, ``grad_clip``), trained with plain
torch in the train function; the global batch of a step is the engine's ``GlobalBatchSampler``
batch, replica group ``g`` of ``G`` takes rows ``g*B/G .. (g+1)*B/G``. Gradients and the logged loss
are averaged over the groups in the step's quorum, so with all groups present a step is the
engine's data-parallel step on the same global batch.

Failure: in step ``kill_at``, after its backward pass and before the cross-group reduction, the last
group's worker SIGKILLs its node's raylet (the hook the Orthoplex benchmark uses, at the same point of
the step as Orthoplex's ``kill_node`` fault in a replica group: the survivors have done the step's
work and wait in the reduction), once per run (a marker file keeps the replacement from doing it
again).

Known problem (2026-12-04): of four torchft runs that day, three never started the replacement and
``fit()`` never returned (the survivors finished all their steps at 2 groups, then nothing): two with
this kill point and one with the kill before the step (the kill point before that day), while the
first run of the day and every run of the days before joined the replacement. The cause is not found.
A hung peer no longer hangs the benchmark: ``fit()`` gets ``fit_timeout_s`` (:func:`fit_with_deadline`:
then Ray Train's own Ctrl-C path aborts the run), and the run is reported with ``fit_hung`` set, its
numbers taken from the ranks' logs as far as they go (the stall is measured; the time to full
strength is none when the replacement never committed a step).

Measured from the ranks' own logs (one JSON line per event, wall clock of the one machine):
``stall_s`` the survivors' longest gap between two of their committed steps that ends after the
crash (survivors: the groups / world ranks whose node was not killed), ``steps_redone`` (per survivor: step attempts minus distinct
committed steps, the worst survivor), ``full_strength_s`` (the crash until the first committed step
with every group in it), ``final_loss`` (the loss of the last step, averaged over the quorum).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

NODES, GPUS_PER_NODE, GROUPS, GPUS_PER_GROUP = 4, 2, 3, 2
GLOBAL_BATCH, KILL_AT, SAVE_EVERY = 12, 6, 2
# No step padding (issue 37: a sleep made the peer's stall about two padded steps by construction).
# The tiny model's step takes ~40 ms here, far less than the seconds a replacement needs to start, so
# the torchft peer runs past ``steps`` until it has been back at full strength for SETTLE_STEPS steps
# (at most MAX_STEPS): the same work per step as Orthoplex's groups, measured in its own steps.
STEPS, SETTLE_STEPS, MAX_STEPS = 60, 5, 3000
# torchft's lighthouse: a step's quorum needs 2 of the 3 groups; a replica whose heartbeat is older
# than HEARTBEAT_TIMEOUT_MS is out (the default 5 s; 2 s here, near Orthoplex's ~1 s heartbeat
# detection, without dropping live replicas of this loaded 2-core machine).
MIN_REPLICAS, HEARTBEAT_TIMEOUT_MS = 2, 2000
PeerKind = Literal["torchft", "restart"]


def _train_config(steps: int, work: Path, tag: str) -> dict[str, Any]:
    from workers.runtime.contract.job_spec import parse_job

    return parse_job({"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH,
                      "checkpoint_dir": str(work / f"ckpt-{tag}")}).train


class _Run:
    """What a train function shares between both peers: model, optimizer, data, the log."""

    def __init__(self, config: dict[str, Any], group: int, groups: int) -> None:
        import torch

        from workers.engine.config import TrainConfig
        from workers.engine.data import GlobalBatchSampler, build_dataset
        from workers.engine.model import build_model
        from workers.engine.optim import build_adamw

        torch.set_num_threads(1)
        self.group, self.groups = group, groups
        self.log = Path(config["log"])
        self.work: list[list[float]] = []  # [start, end] of this rank's work since its last row (note)
        self.note("enter")
        self.cfg = TrainConfig.from_dict(config["train"])
        self.model = build_model(self.cfg.model, self.cfg.seed)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_adamw(list(self.model.named_parameters()), self.cfg)
        self.sampler = GlobalBatchSampler(build_dataset(self.cfg.data, self.cfg.model.seq_len),
                                          self.cfg.global_batch, self.cfg.seed)
        self.kill_at, self.kill_group = config["kill_at"], config["kill_group"]
        self.marker = Path(config["log"] + ".killed")
        self.done = Path(config["log"] + ".done")  # a survivor finished: a late replacement stops
        self.kill = str(config.get("kill", "node"))  # "node": the node's raylet; "process": this process
        self.settle, self.max_steps = int(config.get("settle_steps", 0)), int(config.get("max_steps", self.cfg.steps))
        self.degraded = False  # a step after the fault ran without every group
        self.full_at: int | None = None  # the first step after that with every group in it

    def keep_going(self, step: int) -> bool:
        """Train step ``step``? Until ``steps``, then on until the job has been back at full strength
        for ``settle`` steps (each group decides from the quorums it saw; every group of a quorum saw
        the same ones), never past ``max_steps``; a survivor that finished stops a late replacement."""
        if self.done.exists() or step >= self.max_steps:
            return False
        if step < self.cfg.steps:
            return True
        return self.settle > 0 and (self.full_at is None or step < self.full_at + self.settle)

    def saw(self, step: int, participants: int, healing: bool) -> None:
        """Record a committed step's quorum for :meth:`keep_going`: a step after the fault without
        every group (or this group's own healing step, for a replacement), then the first step with
        every group computing (``full_at``), the same step for every group of that quorum."""
        if self.marker.exists() and (healing or participants < self.groups):
            # after the fault only (groups heal at step 0 too); a replacement's healing step counts, so it
            # stops with the survivors
            self.degraded = True
        elif self.degraded and participants >= self.groups and not healing and self.full_at is None:
            self.full_at = step

    @contextlib.contextmanager
    def working(self) -> Any:
        """Time a piece of this rank's own work (forward/backward, optimizer step); the next log row
        carries it (``work``)."""
        t0 = time.time()
        try:
            yield
        finally:
            self.work.append([t0, time.time()])

    def wait_for_all(self, event: str, timeout_s: float) -> None:
        """Until every group logged ``event`` (the first start only: all replica managers heartbeat
        before the first quorum, so the lighthouse forms it with every group)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]
            if len({r["group"] for r in rows if r["event"] == event}) >= self.groups:
                return
            time.sleep(0.1)

    def note(self, event: str, **kw: Any) -> None:
        work, self.work = self.work, []
        with self.log.open("a") as f:
            f.write(json.dumps({"ts": time.time(), "event": event, "group": self.group,
                                "pid": os.getpid(), "work": work, **kw}) + "\n")

    def maybe_kill(self, step: int) -> None:
        """The benchmark's failure: this group's node crashes in step ``kill_at`` (the callers: after the
        backward pass, before the reduction; once per run; ``>=``: a group that joined late may have
        healed past it)."""
        if step >= self.kill_at and self.group == self.kill_group and not self.marker.exists():
            from workers.runtime.cluster.rank_worker import _kill_own_node

            self.marker.touch()
            self.note("fault", step=step)
            if self.kill == "process":  # torchft used directly: the group's process crashes
                os.kill(os.getpid(), signal.SIGKILL)
            _kill_own_node()

    def forward_backward(self, step: int) -> Any:
        """This group's rows of the step's global batch; gradients in ``.grad``; the loss tensor."""
        import torch.nn.functional as F

        batch = self.sampler.local_batch(step, self.group, self.groups)
        x, y = batch[:, :-1], batch[:, 1:]
        self.optimizer.zero_grad(set_to_none=False)
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        return loss.detach().reshape(1)

    def flat_grads(self) -> Any:
        import torch

        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def set_grads(self, flat: Any) -> None:
        i = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[i:i + n].view_as(p.grad))
            i += n

    def optimizer_step(self, step: int) -> None:
        import torch

        from workers.engine.optim import lr_at

        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(step, self.cfg)
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])


def _torchft_train_fn(config: dict[str, Any]) -> None:
    """One Ray Train worker = one torchft replica group (group size 1, whole model)."""
    from datetime import timedelta

    import ray.train
    import torch
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    ctx = ray.train.get_context()
    run = _Run(config, ctx.get_world_rank(), ctx.get_world_size())
    timeout = timedelta(seconds=config["timeout_s"])
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(
        pg=pg, min_replica_size=config["min_replicas"], load_state_dict=run.load_state_dict,
        state_dict=run.state_dict, world_size=1, rank=0, replica_id=f"rg{run.group}",
        timeout=timeout, quorum_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    torchft_loop(run, manager, config["timeout_s"])


def torchft_loop(run: _Run, manager: Any, timeout_s: float) -> None:
    """The torchft peers' training loop, the same for Ray Train's workers and plain processes: per
    step a quorum, this group's rows forward and backward, the fault hook, the cross-group average,
    ``should_commit``, the optimizer step; until :meth:`_Run.keep_going` says stop."""
    run.note("manager_up", step=manager.current_step())
    if not run.marker.exists():
        run.wait_for_all("manager_up", timeout_s=timeout_s)
    while run.keep_going(manager.current_step()):
        step = manager.current_step()
        manager.start_quorum()
        with run.working():
            loss = run.forward_backward(step)
            flat = run.flat_grads()
        run.maybe_kill(step)  # the step's work done, before the cross-group reduction
        manager.allreduce(flat).wait()  # AVG over the quorum's participating groups
        manager.allreduce(loss).wait()
        participants = manager.num_participants()
        healing = not manager.is_participating()
        # should_commit applies a healing replica's state from its peer, then votes on the step
        if manager.should_commit():
            with run.working():
                run.set_grads(flat)
                run.optimizer_step(step)
            run.note("step", step=step, loss=float(loss.item()), participants=participants, healing=healing)
            run.saw(step, participants, healing)
        else:
            run.note("abort", step=step, participants=participants)
    run.note("done", step=manager.current_step())
    run.done.touch()
    manager.shutdown()


def _restart_train_fn(config: dict[str, Any]) -> None:
    """Ray Train's plain path: one process group, every ``save_every`` steps a Ray Train
    checkpoint; on a failure the whole worker group restarts from the latest one."""
    import ray.train
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    run = _Run(config, ctx.get_world_rank(), ctx.get_world_size())
    start = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(Path(d) / "state.pt", weights_only=False)
        run.load_state_dict(state)
        start = int(state["next_step"])
    run.note("restored", step=start)
    for step in range(start, run.cfg.steps):
        with run.working():
            loss = run.forward_backward(step)
            flat = run.flat_grads()
        run.maybe_kill(step)  # the step's work done, before the reduction
        dist.all_reduce(flat)
        flat /= run.groups
        dist.all_reduce(loss)
        loss /= run.groups
        with run.working():
            run.set_grads(flat)
            run.optimizer_step(step)
        run.note("step", step=step, loss=float(loss.item()), participants=run.groups)
        if (step + 1) % config["save_every"] == 0 or step + 1 == run.cfg.steps:
            with tempfile.TemporaryDirectory() as d:
                if run.group == 0:
                    torch.save({**run.state_dict(), "next_step": step + 1}, Path(d) / "state.pt")
                ray.train.report({"step": step, "loss": float(loss.item())},
                                 checkpoint=ray.train.Checkpoint.from_directory(d) if run.group == 0 else None)


def summarize(rows: list[dict[str, Any]], kind: str, groups: int, kill_group: int) -> dict[str, Any]:
    """The peer's numbers from its ranks' log rows (pure: the smoke test and the benchmark share it)."""
    faults = [r for r in rows if r["event"] == "fault"]
    if len(faults) != 1:
        raise RuntimeError(f"{kind}: expected one fault in the log, found {len(faults)}")
    fault_ts = faults[0]["ts"]
    steps = [r for r in rows if r["event"] == "step"]
    survivors = sorted({r["group"] for r in steps} - {kill_group})
    stall, redone, redone_after, intervals = 0.0, 0, 0, []
    for g in survivors:
        mine = sorted((r for r in steps if r["group"] == g), key=lambda r: r["ts"])
        gaps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(mine) if b["ts"] > fault_ts]
        stall = max([stall, *gaps])
        intervals += [b["ts"] - a["ts"] for a, b in itertools.pairwise(mine) if b["ts"] < fault_ts]
        aborts = sum(1 for r in rows if r["event"] == "abort" and r["group"] == g)
        redone = max(redone, len(mine) + aborts - len({r["step"] for r in mine}))
        # the same, counting only attempts after the crash: an attempt of a step this survivor had tried
        # before the crash, or one of a later step that it tried more than once
        tries = [r for r in rows if r["event"] in ("step", "abort") and r["group"] == g]
        before = {r["step"] for r in tries if r["ts"] <= fault_ts}
        after = [r["step"] for r in tries if r["ts"] > fault_ts]
        redone_after = max(redone_after, len(after) - len(set(after) - before))
    full = [r["ts"] for r in steps if r["ts"] > fault_ts and r.get("participants") == groups
            and not r.get("healing")]
    last = max(r["step"] for r in steps)
    final = [r["loss"] for r in steps if r["step"] == last]
    by_step: dict[int, float] = {}
    for r in sorted(steps, key=lambda r: r["ts"]):
        by_step[r["step"]] = r["loss"]  # the last commit of a step wins (a restart redoes steps)
    aborted = max((sum(1 for r in rows if r["event"] == "abort" and r["group"] == g) for g in survivors),
                  default=0)
    degraded = sorted({r["step"] for r in steps if r.get("participants", groups) < groups and r["ts"] > fault_ts})
    attempts: dict[int, int] = {}
    for r in rows:
        if r["event"] in ("step", "abort") and r["group"] in survivors:
            attempts[r["step"]] = attempts.get(r["step"], 0) + 1
    repeated = sorted(st for st, n in attempts.items() if n > len(survivors))
    return {
        "system": {"torchft": "Ray Train + torchft (replica groups)", "restart": "Ray Train restart",
                   "torchft-direct": "torchft Manager, plain processes"}[kind],
        "kind": kind,
        "stall_s": round(stall, 3),
        "steady_step_s": round(statistics.median(intervals), 3) if intervals else None,
        "steps_redone": redone,
        "steps_redone_after_fault": redone_after,  # of steps_redone: the attempts after the crash
        "aborted_attempts": aborted,  # of steps_redone: attempts torchft's should_commit voted down
        "full_strength_s": round(min(full) - fault_ts, 3) if full else None,
        "final_loss": round(statistics.fmean(final), 6),
        "last_step": last,
        "degraded_steps": degraded,  # after the crash, steps some group sat out (smaller global batch)
        "repeated_steps": repeated,  # steps a survivor attempted more than once
        "losses": [by_step[s] for s in sorted(by_step)],
        "fault_step": faults[0]["step"],
        # the raw times the recovery bench's common stall window is computed from (bench.recovery_replicas)
        "fault_ts": fault_ts,
        "full_strength_ts": min(full) if full else None,
        "survivor_step_ts": {str(g): [[r["step"], r["ts"]] for r in sorted((r for r in steps if r["group"] == g),
                                                                           key=lambda r: r["ts"])]
                             for g in survivors},
        # and their own work ([start, end]: forward/backward, optimizer step, step padding), from every row
        "survivor_work": {str(g): [w for r in rows if r["group"] == g for w in r.get("work", [])] for g in survivors},
    }


def _release_ray_train_actors(sigint: Any) -> None:
    """Ray Train 2.60's ``fit()`` leaves its controller actor (and the torchft lighthouse and the
    dataset manager it owns) alive: the SIGINT handler it installs holds the controller's handle.
    Put the previous handler back so the handle is freed, and kill Ray Data's detached
    ``AutoscalingCoordinator`` that the run created."""
    import gc

    import ray

    signal.signal(signal.SIGINT, sigint)
    gc.collect()
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator"))


_LAST_DIAGNOSIS: dict[str, Any] = {}


def fit_with_deadline(fit: Callable[[], Any], timeout_s: float, grace_s: float = 20.0,
                      on_deadline: Callable[[], Any] | None = None) -> bool:
    """Run ``fit()`` on this (the main) thread; past ``timeout_s`` interrupt it as Ctrl-C would: SIGINT
    to this thread, whose handler (Ray Train's: the first aborts the run through its controller, the
    third exits) ends it; again every ``grace_s`` until it does. True when ``fit()`` returned by
    itself; False when it was interrupted (whatever it raised then is swallowed). ``on_deadline``
    runs on the watchdog's thread at the deadline, before the interrupt (its result:
    ``_LAST_DIAGNOSIS["value"]``)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("fit_with_deadline must run on the main thread (it interrupts it with SIGINT)")
    done, fired = threading.Event(), threading.Event()
    main = threading.main_thread().ident

    def watchdog() -> None:
        if done.wait(timeout_s):
            return
        if on_deadline is not None:  # before the interrupt tears the run down: what it hangs on
            try:
                _LAST_DIAGNOSIS["value"] = on_deadline()
            except Exception as exc:  # a diagnosis must never keep the run from being ended
                _LAST_DIAGNOSIS["value"] = {"error": repr(exc)}
        fired.set()
        while not done.is_set():
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
            done.wait(grace_s)

    threading.Thread(target=watchdog, name="fit-deadline", daemon=True).start()
    try:
        fit()
    except (KeyboardInterrupt, SystemExit, Exception):
        if not fired.is_set():
            raise
    finally:
        done.set()
    return not fired.is_set()


def wait_for_free_gpus(timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until every alive node's GPUs are free (a run before may still hold some: its placement
    groups and actors go away asynchronously); returns the seconds waited and the GPUs still held."""
    import ray

    t0 = time.monotonic()
    held = 0.0
    while time.monotonic() - t0 < timeout_s:
        held = ray.cluster_resources().get("GPU", 0.0) - ray.available_resources().get("GPU", 0.0)
        if held <= 0:
            break
        time.sleep(0.5)
    return {"waited_s": round(time.monotonic() - t0, 2), "gpus_held": held}


def hang_diagnosis() -> dict[str, Any]:
    """What the cluster looks like when ``fit()`` hung: placement groups not placed and where their
    bundles are, the free GPUs per alive node, and the nodes the GCS still counts alive."""
    import ray
    from ray.util import placement_group_table

    pgs = [{"name": v.get("name"), "state": v.get("state"), "bundles_to_node": v.get("bundles_to_node_id"),
            "bundles": v.get("bundles")} for v in placement_group_table().values() if v.get("state") != "REMOVED"]
    return {"placement_groups": pgs, "available": ray.available_resources(), "total": ray.cluster_resources(),
            "alive_nodes": [n["NodeID"] for n in ray.nodes() if n.get("Alive")]}


def run_peer(kind: PeerKind, steps: int = STEPS, kill_at: int = KILL_AT, cluster: Any = None,
             work: Path | None = None, timeout_s: float = 30.0,
             gpus_per_group: int = GPUS_PER_GROUP, heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
             fit_timeout_s: float = 240.0, settle_steps: int = SETTLE_STEPS,
             max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """Train ``steps`` steps under the peer ``kind`` on a local cluster, crash the last group's node
    in step ``kill_at`` (after its backward pass), and return the numbers of :func:`summarize` plus
    ``wall_s``. No step padding; torchft runs on past ``steps`` until back at full strength for
    ``settle_steps`` steps (at most ``max_steps``). Before ``fit()``, waits until no GPU of the
    cluster is held (``gpus_free``); a ``fit()`` that hangs is ended and reported with
    ``fit_hung`` and ``hang_diagnosis``.

    ``cluster``: a connected Ray cluster with ``GROUPS + 1`` alive nodes of ``gpus_per_group``
    declared GPUs (one group per node, one spare); ``None`` starts (and shuts down) the benchmark's
    head + 4 x 2-GPU ``InProcessCluster``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if kind not in ("torchft", "restart"):
        raise ValueError(f"kind must be 'torchft' or 'restart', got {kind!r}")
    if not 0 < kill_at < steps:
        raise ValueError(f"kill_at must be in 1..steps-1, got {kill_at} for {steps} steps")
    own = cluster is None
    if own:
        from workers.testbed.local_cluster import InProcessCluster

        cluster = InProcessCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE).start()
    tmp = work is None
    work = Path(tempfile.mkdtemp(prefix=f"orthoplex-peer-{kind}-")) if work is None else work
    log = work / f"{kind}.jsonl"
    log.unlink(missing_ok=True)
    # a run before in the same folder (the compare's rounds) leaves Ray Train's run and checkpoints:
    # the restart peer would resume from its last checkpoint, past every step, and never fault
    shutil.rmtree(work / "ray_results" / f"peer-{kind}", ignore_errors=True)
    shutil.rmtree(work / f"ckpt-{kind}", ignore_errors=True)
    for marker in (".killed", ".done"):
        Path(str(log) + marker).unlink(missing_ok=True)
    config = {"train": _train_config(steps, work, kind), "log": str(log), "kill_at": kill_at,
              "kill_group": GROUPS - 1, "save_every": SAVE_EVERY, "timeout_s": timeout_s,
              "min_replicas": MIN_REPLICAS, "settle_steps": settle_steps if kind == "torchft" else 0,
              "max_steps": max_steps}
    if kind == "torchft":
        from ray.train.v2.torch.torchft_config import TorchftConfig

        fn = _torchft_train_fn
        torch_config: Any = TorchftConfig(
            lighthouse_kwargs={"min_replicas": MIN_REPLICAS, "heartbeat_timeout_ms": heartbeat_timeout_ms},
            backend="gloo")
    else:
        fn, torch_config = _restart_train_fn, TorchConfig(backend="gloo")
    trainer = TorchTrainer(
        fn, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=GROUPS, use_gpu=True,
                                     resources_per_worker={"CPU": 0.05, "GPU": gpus_per_group}),
        torch_config=torch_config,
        run_config=RunConfig(storage_path=str(work / "ray_results"), name=f"peer-{kind}",
                             failure_config=FailureConfig(max_failures=3)),
    )
    free = wait_for_free_gpus()
    t0 = time.time()
    sigint = signal.getsignal(signal.SIGINT)
    _LAST_DIAGNOSIS.clear()
    try:
        returned = fit_with_deadline(trainer.fit, fit_timeout_s, on_deadline=hang_diagnosis)
        wall = time.time() - t0
        rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        out = summarize(rows, kind, GROUPS, GROUPS - 1)
        out["fit_hung"] = not returned
    finally:
        _release_ray_train_actors(sigint)
        if own:
            cluster.shutdown()
        if tmp:
            shutil.rmtree(work, ignore_errors=True)
    if not returned:
        out["hang_diagnosis"] = _LAST_DIAGNOSIS.get("value")
    return {**out, "wall_s": round(wall, 2), "ended_ts": t0 + wall, "steps": steps, "groups": GROUPS,
            "global_batch": GLOBAL_BATCH, "gpus_free": free, "settle_steps": config["settle_steps"],
            **({"heartbeat_timeout_ms": heartbeat_timeout_ms} if kind == "torchft" else {})}


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| system | survivors' longest stall (s) | steady step (s) | steps redone | "
             "crash -> full strength (s) | steps at reduced batch | repeated steps | final loss | run wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        full = "-" if r["full_strength_s"] is None else f"{r['full_strength_s']:.2f}"
        lines.append(f"| {r['system']} | {r['stall_s']:.2f} | {r['steady_step_s'] or 0:.3f} | "
                     f"{r['steps_redone']} | {full} | {len(r['degraded_steps'])} | "
                     f"{', '.join(map(str, r['repeated_steps'])) or '-'} | "
                     f"{r['final_loss']:.4f} | {r['wall_s']:.1f} |")
    lines += ["", LIMITS]
    return "\n".join(lines)


LIMITS = (
    f"Workload: tiny Llama, global batch {GLOBAL_BATCH}, {GROUPS} replica groups (Ray Train workers) "
    f"of {GPUS_PER_GROUP} declared GPUs on a head + {NODES} x {GPUS_PER_NODE}-GPU local Ray cluster, "
    f"CPU torch with gloo on a 2-core machine shared with other work; the node of the last group "
    f"crashed (raylet SIGKILL) in step {KILL_AT}; no step padding: torchft runs on until back at full "
    f"strength for {SETTLE_STEPS} steps (the tiny model's step is ~40 ms, shorter than a replacement's start). Limits: Ray 2.60's TorchftConfig makes each "
    f"worker its own replica group, so a group is one process holding the whole model (no TP inside "
    f"a group). torchft: lighthouse min_replicas {MIN_REPLICAS}, heartbeat timeout "
    f"{HEARTBEAT_TIMEOUT_MS} ms, gloo/PG-transport timeouts 30 s; while a group is missing the "
    f"survivors average over their own rows only (global batch {GLOBAL_BATCH * (GROUPS - 1) // GROUPS}"
    f" for those steps), so the loss curve differs from a no-fault run. Restart: a Ray Train "
    f"checkpoint every {SAVE_EVERY} steps, the whole group restarts from the latest one."
)


def run(quick: bool = False) -> dict[str, Any]:
    """Both peers, same workload and failure, one cluster, one invocation."""
    from workers.testbed.local_cluster import InProcessCluster

    steps = 30 if quick else STEPS
    cluster = InProcessCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE).start()
    rows: list[dict[str, Any]] = []
    try:
        for kind in ("torchft", "restart"):
            rows.append(run_peer(kind, steps=steps, cluster=cluster))  # type: ignore[arg-type]
            cluster.restore()
    finally:
        cluster.shutdown()
    return {"name": "recovery_peers", "rows": rows, "markdown": _markdown(rows)}


if __name__ == "__main__":
    from bench.common import write_result

    out = run(quick=bool(os.environ.get("QUICK")))
    print(out["markdown"])
    write_result(out)
