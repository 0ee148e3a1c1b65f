"""``orthoplex simulate``: the failure simulator (``service.failure_sim``): goodput of one large job under
failures, every recovery policy on one trace.

Exit codes: 0 done; 2 bad input (the message names the field; never a traceback). See docs/goodput.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to ``app``."""

    @app.command("simulate")
    def simulate(
        gpus: int = typer.Option(16_384, "--gpus", help="GPUs in the cluster."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node (G)."),
        days: float = typer.Option(54.0, "--days", help="Simulated days."),
        seed: int = typer.Option(0, "--seed", help="Seed of the failure trace."),
        policy: list[str] = typer.Option(None, "--policy",
                                         help="Policy (repeatable): restart, replan_storage, replan_memory, "
                                              "replica_group. Default: all."),
        spares: int = typer.Option(16, "--spares", help="Hot spare nodes k; each policy also runs with them."),
        rates: str = typer.Option("llama3", "--rates", help="Failure rates: llama3 (per cause) or rsc (6.5/1000 "
                                                            "node-days, Llama 3's mix)."),
        restart_s: float = typer.Option(600.0, "--restart-s", help="Baseline restart time (published: 600 s)."),
        stall_s: float = typer.Option(None, "--stall-s",
                                      help="Replica-group stall per failure (default: from our measured phases)."),
        save_s: float = typer.Option(None, "--save-s", help="Blocking checkpoint save to storage (default: model)."),
        layout: str = typer.Option(None, "--layout", help="The job's layout (e.g. a plan's, tp=8,pp=16,...; "
                                                          "default: the planner's fastest)."),
        groups: int = typer.Option(None, "--groups", help="Replica groups (default: every DP replica)."),
        calibration: str = typer.Option("prior", "--calibration",
                                        help="Recovery phases: prior (published: bench/results/recovery.json) or "
                                             "cluster (the recoveries recorded in the service's database)."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON document only."),
        plot: Path = typer.Option(None, "--plot", help="Write ETTR vs cluster size (1k..131k GPUs) to FILE.png."),
    ) -> None:
        """Simulate failures and recovery of one large training job; compare the policies."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from service.failure_sim.policies import KINDS, policies_for
        from service.failure_sim.recovery import PRIOR
        from service.failure_sim.report import plot as draw
        from service.failure_sim.report import print_table
        from service.failure_sim.simulation import PLOT_SIZES, Config, ConfigError, sweep
        from service.failure_sim.simulation import simulate as run

        if calibration not in ("prior", "cluster"):
            _fail(f"calibration: must be prior or cluster, got {calibration!r}")
        cal = PRIOR
        if calibration == "cluster":
            from service.cluster_history import calibration_at
            from service.settings import get_settings

            try:
                cal = calibration_at(get_settings().database_url)
            except Exception as exc:  # no database there: say so, never a traceback
                _fail(f"calibration: cannot read the service's database: {exc}")
        config = Config(gpus=gpus, gpus_per_node=gpus_per_node, days=days, seed=seed,
                        policies=tuple(policy) if policy else KINDS, spares=spares, rates=rates,
                        restart_s=restart_s, stall_s=stall_s, save_s=save_s, layout=layout, groups=groups,
                        calibration=cal)
        try:
            config.validate()
        except ConfigError as exc:
            _fail(str(exc))
        if plot is not None and plot.suffix.lower() != ".png":
            _fail(f"plot: must be a .png file, got {plot}")
        console = Console(stderr=True)
        names = [p.name for p in policies_for(config.policies, config.spares)]
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("planning and simulating", total=len(names))
            try:
                sim = run(config, on_policy=lambda name: progress.update(task, advance=1, description=name))
            except ConfigError as exc:
                _fail(str(exc))
            except ValueError as exc:  # the planner found nothing for this size
                _fail(str(exc))
            points = None
            if plot is not None:
                sweep_task = progress.add_task("ETTR vs cluster size", total=len(PLOT_SIZES))
                points = sweep(config, PLOT_SIZES,
                               on_point=lambda n: progress.update(sweep_task, advance=1,
                                                                  description=f"{n:,} GPUs done"))
        if points is not None:
            draw(points, plot, f"{config.days:g} days, {config.rates} rates, seed {config.seed}, k={config.spares}")
        if as_json:
            typer.echo(json.dumps(sim.as_json()))
            return
        print_table(sim)
        if plot is not None:
            Console().print(f"plot written to {plot}")
