"""``orthoplex bench``: run the benchmarks, each against a baseline measured in the same run; and
``orthoplex bench render [--check]``: render every bench/results/*.md from its JSON (``bench.render``)."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import typer

BENCHES = ("planner", "scheduler", "engine", "tp_forward", "checkpoint", "api", "recovery", "recovery_peers", "snapshot_cpu",
           "simulate", "data", "dashboard", "netchaos")
EXPLICIT_ONLY = ("netchaos",)  # root and 10+ minutes: never part of "all"


def _render(results_dir: Path, check: bool) -> None:
    from bench.render import stale, write_all

    if check:
        bad = stale(results_dir)
        for p in bad:
            typer.echo(f"{p.name}: differs from its render of {p.stem}.json (run `orthoplex bench render`)", err=True)
        if bad:
            raise typer.Exit(1)
        typer.echo(f"bench render --check: every Markdown file of {results_dir.name}/ is its render")
        return
    for p in write_all(results_dir):
        typer.echo(f"rendered {p.name}")


def register(app: typer.Typer) -> None:
    """Add ``bench`` to ``app``."""

    @app.command("bench")
    def bench(
        which: list[str] = typer.Argument(
            None, help=f"Benchmarks to run: {', '.join(BENCHES)} or all; or `render` to render the results' Markdown."),
        quick: bool = typer.Option(False, "--quick", help="Smaller sizes (a smoke run, not for reporting)."),
        out: Path = typer.Option(None, "--out", help="Results folder (default bench/results)."),
        check: bool = typer.Option(False, "--check", help="With `render`: exit 1 when a Markdown file differs from "
                                                          "its render, write nothing."),
        note: list[str] = typer.Option(None, "--note", help="A note on this run, recorded in its JSON and history "
                                                            "(repeatable)."),
        parts: str = typer.Option(None, "--parts", help="recovery only: the parts to run, comma-separated "
                                                        "(baseline,compare,replan,product; product-single or product-replica: one job of product); the others are carried over."),
        repeat: int = typer.Option(1, "--repeat", min=1, help="recovery only: rounds of the compare part, reported "
                                                              "as medians with their spread."),
    ) -> None:
        """Run benchmarks; write bench/results/<name>.json, append history/<name>.jsonl, render the .md."""
        from rich.console import Console
        from rich.markdown import Markdown

        from bench.common import RESULTS_DIR, write_result

        names = list(which or ["all"])
        results_dir = out or RESULTS_DIR
        if names == ["render"]:
            _render(results_dir, check)
            return
        if check:
            typer.echo("Error: --check goes with `orthoplex bench render` only", err=True)
            raise typer.Exit(2)
        if "all" in names:
            names = [n for n in BENCHES if n not in EXPLICIT_ONLY]
        unknown = [n for n in names if n not in BENCHES]
        if unknown:
            typer.echo(f"Error: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}, all, "
                       "render", err=True)
            raise typer.Exit(2)
        if (parts is not None or repeat != 1) and names != ["recovery"]:
            typer.echo("Error: --parts and --repeat go with `orthoplex bench recovery` only", err=True)
            raise typer.Exit(2)
        part_list = None
        if parts is not None:
            from bench.recovery import PARTS

            part_list = [p.strip() for p in parts.split(",") if p.strip()]
            bad = [p for p in part_list if p not in PARTS]
            if bad or not part_list:
                typer.echo(f"Error: --parts: unknown part(s) {', '.join(bad) or '(none given)'}; choose from "
                           f"{', '.join(PARTS)}", err=True)
                raise typer.Exit(2)
        console = Console()
        failed: list[str] = []
        for name in names:
            console.rule(f"bench {name}")
            module = importlib.import_module(f"bench.{name}")
            kwargs: dict[str, object] = {"quick": quick}
            if "repeat" in inspect.signature(module.run).parameters:
                kwargs.update({"parts": part_list, "repeat": repeat})
            load = os.getloadavg()[0]
            try:
                result = module.run(**kwargs)
            except Exception as exc:  # a failed benchmark is reported, the others still run
                console.print(f"[red]bench {name} failed: {exc!r}")
                failed.append(name)
                continue
            _, md_path = write_result(result, results_dir, notes=list(note or []), load_at_start=load)
            console.print(Markdown(md_path.read_text()))
        if failed:
            raise typer.Exit(1)
