"""``orthoplex bench``: run the benchmarks, each against a baseline measured in the same run."""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

BENCHES = ("planner", "scheduler", "engine", "tp_forward", "checkpoint", "api", "recovery", "recovery_peers", "snapshot_cpu",
           "simulate", "data", "dashboard", "netchaos")
EXPLICIT_ONLY = ("netchaos",)  # root and 10+ minutes: never part of "all"


def register(app: typer.Typer) -> None:
    """Add ``bench`` to ``app``."""

    @app.command("bench")
    def bench(
        which: list[str] = typer.Argument(None, help=f"Benchmarks to run: {', '.join(BENCHES)} or all."),
        quick: bool = typer.Option(False, "--quick", help="Smaller sizes (a smoke run, not for reporting)."),
        out: Path = typer.Option(None, "--out", help="Results folder (default bench/results)."),
    ) -> None:
        """Run benchmarks; write bench/results/<name>.json and .md and print the tables."""
        from rich.console import Console
        from rich.markdown import Markdown

        from bench.common import RESULTS_DIR, write_result

        names = list(which or ["all"])
        if "all" in names:
            names = [n for n in BENCHES if n not in EXPLICIT_ONLY]
        unknown = [n for n in names if n not in BENCHES]
        if unknown:
            typer.echo(f"Error: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}, all", err=True)
            raise typer.Exit(2)
        console = Console()
        results_dir = out or RESULTS_DIR
        failed: list[str] = []
        for name in names:
            console.rule(f"bench {name}")
            module = importlib.import_module(f"bench.{name}")
            try:
                result = module.run(quick=quick)
            except Exception as exc:  # a failed benchmark is reported, the others still run
                console.print(f"[red]bench {name} failed: {exc!r}")
                failed.append(name)
                continue
            _, md_path = write_result(result, results_dir)
            text = md_path.read_text()
            console.print(Markdown(text))
        # SUMMARY.md gathers the latest table of every benchmark, not only those run now.
        tables = [f.read_text() for f in sorted(results_dir.glob("*.md")) if f.name != "SUMMARY.md"]
        (results_dir / "SUMMARY.md").write_text("\n".join(tables))
        if failed:
            raise typer.Exit(1)
