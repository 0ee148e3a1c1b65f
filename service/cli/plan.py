"""``orthoplex plan --spec FILE.json [--top K] [--json] [--duration-days D] [--failure-rates R]
[--calibration prior|cluster]``: the planner from the command line.

With a duration (``--duration-days`` or the spec's ``duration_days``) the plans are ranked by
effective tokens/s (healthy x ETTR) and each shows its recovery settings (docs/goodput.md).

Exit codes: 0 at least one plan; 1 nothing fits (the reasons are printed); 2 bad input (the
message names the field; never a traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

TIME_GROUPS = {
    "compute": ("gemm", "attention", "elementwise", "logits", "optimizer"),
    "recompute": ("recompute",),
    "comm": ("tp_comm", "cp_comm", "pp_p2p", "zero3_comm", "dp_comm"),
    "bubble": ("bubble",),
}


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load_spec(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        _fail(f"--spec: cannot read {path}: {exc.strerror or exc}", 2)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"--spec: {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", 2)


def _print_table(result: Any) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=170)
    table = Table(title=f"Top {len(result.plans)} plans", show_lines=False)
    for col in ("#", "layout", "b x m", "sp/zero/recompute", "GiB/GPU", "step s", "compute", "recompute",
                "comm", "bubble", "MFU", "tokens/s", "tok/s/GPU"):
        table.add_column(col, justify="left" if col in ("layout", "sp/zero/recompute") else "right")
    for i, plan in enumerate(result.plans, 1):
        lay, est = plan.layout, plan.estimate
        split = {g: sum(est.time_breakdown_s.get(k, 0.0) for k in keys) for g, keys in TIME_GROUPS.items()}
        spans = "" if not plan.spanning_counts.get("tp") else " (TP spans nodes)"
        table.add_row(
            str(i), f"{lay.short()} {lay.schedule}{' ' + lay.cp_method if lay.cp > 1 else ''}{spans}",
            f"{lay.micro_batch} x {lay.num_micro_batches}", f"{'on' if lay.sp else 'off'}/{lay.zero}/{lay.recompute}",
            f"{est.memory_gb_per_gpu:.1f}", f"{est.step_time_s:.3f}", f"{split['compute']:.3f}",
            f"{split['recompute']:.3f}", f"{split['comm']:.3f}", f"{split['bubble']:.3f} ({100 * est.bubble_fraction:.0f}%)",
            f"{100 * est.mfu:.1f}%", f"{est.tokens_per_s:,.0f}", f"{est.tokens_per_s_per_gpu:,.1f}",
        )
    if result.plans:
        console.print(table)
    console.print(f"searched {result.searched:,} candidates, fully costed {result.evaluated:,}, "
                  f"in {result.search_time_s * 1000:.1f} ms")
    if result.rejected_counts:
        summary = ", ".join(f"{kind}: {n:,}" for kind, n in sorted(result.rejected_counts.items(),
                                                                   key=lambda kv: -kv[1]))
        console.print(f"rejected: {summary}")
        seen: set[str] = set()
        for rej in result.rejected:
            if rej.kind in seen:
                continue
            seen.add(rej.kind)
            shape = ", ".join(f"{k}={v}" for k, v in rej.layout.items() if k in ("tp", "pp", "cp", "dp", "vpp",
                                                                                   "micro_batch", "zero", "recompute"))
            console.print(f"  e.g. ({escape(shape)}) {escape(rej.reason)}")


def recovery_line(choice: dict[str, Any], asked: str) -> str:
    """One line saying what a recovery block came to, and why (``orthoplex plan``, the CLI's job view)."""
    what = choice["policy"]
    if what == "replica_groups":
        what += f": {choice['groups']} groups of {choice['group_gpus']} GPU(s)"
    snaps = f"snapshots every {choice['snapshot_every']} step(s)" if choice["snapshots"] else "no snapshots"
    return (f"recovery ({asked}): {what}; {snaps}; {choice['warm_ranks']} warm rank(s) per node; "
            f"because {choice['reason']}")


def _print_goodput(result: Any, note: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    g = result.goodput
    if g is None:
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=170)
    rates, cal = g["failure_rates"], g["recovery_phases"]
    console.print(f"goodput over {g['duration_days']:g} days: failure rates {escape(rates['name'])} "
                  f"({rates['unexpected_per_node_day'] * 1000:.2f} per 1000 node-days; {escape(rates['source'])}); "
                  f"recovery phases {escape(cal['source'])}")
    if note:
        console.print(escape(note))
    table = Table(title="Ranked by effective tokens/s (healthy x ETTR)")
    for col in ("#", "layout", "tokens/s", "ETTR", "effective tok/s", "recovery", "groups", "snapshot every",
                "checkpoint every", "spares"):
        table.add_column(col, justify="left" if col in ("layout", "recovery") else "right")
    for i, p in enumerate(result.plans, 1):
        r = p.recovery or {}
        ckpt = "-" if r.get("checkpoint_every_steps") is None else f"{r['checkpoint_every_steps']} steps"
        table.add_row(str(i), p.layout.short(), f"{p.estimate.tokens_per_s:,.0f}", f"{100 * (p.ettr or 0):.2f}%",
                      f"{p.effective_tokens_per_s or 0:,.0f}", str(r.get("policy", "")), str(r.get("groups", "")),
                      f"{r.get('snapshot_every', 0)} steps" if r.get("snapshot_every") else "-", ckpt,
                      str(r.get("warm_spares", 0)))
    console.print(table)
    if result.plans:
        best = result.plans[0]
        console.print(f"chosen: {escape(str((best.recovery or {}).get('reason', '')))}")
        for o in best.recovery_options:
            what = f"{o['policy']} x{o['groups']}" if o["policy"] == "replica_group" else o["policy"]
            console.print(f"  not {escape(what)}: {escape(o['lost_because'])}")
    for row in g["ranking"][1:]:
        console.print(f"  not {escape(row['layout'])}: {escape(row['lost_because'])}")


def plan_command(
    spec: Path = typer.Option(..., "--spec", help="JSON spec (model, cluster, parallel, precision, training)"),
    top: int = typer.Option(5, "--top", min=1, help="how many plans to show"),
    recovery: str = typer.Option("auto", "--recovery", help="recovery policy to resolve on the best plan: "
                                 "auto, replica_groups, replan or restart (a job spec's recovery.policy)"),
    as_json: bool = typer.Option(False, "--json", help="print the plans as JSON"),
    duration_days: float = typer.Option(None, "--duration-days",
                                        help="expected days of training: rank by effective tokens/s (healthy x ETTR) "
                                             "and choose each layout's recovery settings"),
    failure_rates: str = typer.Option(None, "--failure-rates",
                                      help="llama3 (default), rsc, or cluster (node losses per node-day in the "
                                           "service's database)"),
    calibration: str = typer.Option("prior", "--calibration",
                                    help="recovery phases: prior (published) or cluster (the recoveries recorded "
                                         "in the service's database)"),
) -> None:
    """Search every TP/PP/CP/DP layout for a model on a cluster and show the best plans, and what
    the recovery policy comes to on the best one (``auto``: replica groups when its data parallelism
    holds two or more full replicas in memory, else re-plan from memory)."""
    from planner import LayoutError, SpecError, plan
    from planner.failure_rates import FAILURE_RATE_NAMES
    from planner.recovery_choice import ChoiceError, choose

    raw = _load_spec(spec)
    if not isinstance(raw, dict):
        _fail("spec: must be a JSON object", 2)
    if failure_rates is not None and failure_rates not in FAILURE_RATE_NAMES:
        _fail(f"--failure-rates: must be one of {', '.join(FAILURE_RATE_NAMES)}, got {failure_rates!r}", 2)
    if calibration not in ("prior", "cluster"):
        _fail(f"--calibration: must be prior or cluster, got {calibration!r}", 2)
    if duration_days is not None:
        raw["duration_days"] = duration_days
    if failure_rates is not None:
        raw["failure_rates"] = failure_rates
    note = ""
    if raw.get("failure_rates") == "cluster" or calibration == "cluster":
        from service.cluster_history import from_database
        from service.settings import get_settings

        gpn = (raw.get("cluster") or {}).get("gpus_per_node") or 8
        try:
            keys, note = from_database(get_settings().database_url, int(gpn),
                                       failure_rates="cluster" if raw.get("failure_rates") == "cluster" else None,
                                       phases=calibration == "cluster")
        except Exception as exc:  # no database there: say so, never a traceback
            _fail(f"--calibration/--failure-rates cluster: cannot read the service's database: {exc}", 2)
        raw.update(keys)
    try:
        result = plan(raw, top_k=top)
    except (SpecError, LayoutError) as exc:
        _fail(str(exc), 2)
    choice = None
    if result.plans:
        try:
            choice = choose(result.plans[0], {"policy": recovery}, raw).to_dict()
        except ChoiceError as exc:
            _fail(f"--recovery: {exc.msg}", 2)
    if as_json:
        out = result.cli_dict()
        if note and "goodput" in out:
            out["goodput"]["note"] = note
        typer.echo(json.dumps({**out, "recovery": choice}, indent=2))
    else:
        _print_table(result)
        _print_goodput(result, note)
        if choice is not None:
            typer.echo(recovery_line(choice, recovery))
    if not result.plans:
        if as_json:
            typer.echo("error: no layout fits; see 'rejected'", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``plan`` command to the ``orthoplex`` app."""
    app.command("plan")(plan_command)
