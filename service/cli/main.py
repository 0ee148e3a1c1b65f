"""The ``orthoplex`` command line.

Each part adds its commands from its own module (``register(app)``); heavy imports (torch, ray,
fastapi) happen inside the command functions so ``orthoplex --help`` stays fast.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import typer

COMMAND_MODULES = (
    "service.cli.plan",  # orthoplex plan
    "service.cli.train",  # orthoplex train
    "service.cli.runtime",  # orthoplex run, orthoplex cluster up|down
    "service.cli.server",  # orthoplex serve, orthoplex admin ...
    "service.cli.client",  # orthoplex submit|status|events|cancel
    "service.cli.demo",  # orthoplex demo
    "service.cli.bench",  # orthoplex bench ...
    "service.cli.simulate",  # orthoplex simulate (goodput under failures)
)

app = typer.Typer(
    name="orthoplex",
    help="Orthoplex: an elastic 4D-parallel (TP/PP/CP/DP) training service on Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version() -> str:
    try:
        return version("orthoplex")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0+unknown"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"orthoplex {_version()}")
        raise typer.Exit()


@app.callback()
def main(
    version_: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True,
        help="More log lines: -v adds libraries' request logs, -vv everything at DEBUG.",
    ),
) -> None:
    """Orthoplex command line."""
    from service.log import configure_logging

    configure_logging(verbosity=verbose)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)
