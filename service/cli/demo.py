"""``orthoplex demo``: the main job end to end (see ``service.demo.runner``)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app``."""

    @app.command("demo")
    def demo(
        nodes: int = typer.Option(3, min=2, max=8, help="Worker nodes of the local Ray cluster."),
        gpus_per_node: int = typer.Option(4, min=2, max=8, help="Declared GPUs per node."),
        steps: int = typer.Option(30, min=4, max=10_000, help="Training steps per job."),
        kill_at_step: int = typer.Option(10, min=1, help="Kill a node once the big job has done this many steps."),
        global_batch: int = typer.Option(8, min=1, help="Global batch (sequences) per step."),
        keep: bool = typer.Option(False, "--keep", help="Leave the service and cluster up afterwards (Ctrl-C stops)."),
        json_out: Path = typer.Option(None, "--json-out", help="Once the jobs have ended, write the API and dashboard "
                                      "URLs, the admin token and each tenant's token and job ids to this JSON file."),
        workdir: Path = typer.Option(None, help="Where the database, checkpoints, logs and the loss PNG go."),
        timeout_s: float = typer.Option(900.0, min=30, help="Give up when the jobs have not finished by then."),
    ) -> None:
        """Local cluster + service + two tenants + a real job that survives a killed node."""
        from rich.console import Console

        from service.demo.runner import Demo, DemoConfig, DemoError

        if kill_at_step >= steps:
            typer.echo(f"Error: --kill-at-step ({kill_at_step}) must be below --steps ({steps})", err=True)
            raise typer.Exit(2)
        console = Console()
        cfg = DemoConfig(nodes=nodes, gpus_per_node=gpus_per_node, steps=steps, kill_at_step=kill_at_step,
                         global_batch=global_batch, keep=keep, json_out=json_out, workdir=workdir, timeout_s=timeout_s)
        runner = Demo(cfg, console)
        try:
            code = runner.run()
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the service and the cluster")
            runner.stop()
            raise typer.Exit(130) from None
        except DemoError as exc:
            console.print(f"[red]demo failed: {exc}")
            raise typer.Exit(1) from None
        raise typer.Exit(code)
