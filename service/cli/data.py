"""``orthoplex data prepare``: tokenize text/jsonl/parquet into token files with a validation split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from service.cli.train import EXIT_BAD_INPUT


def prepare_cmd(
    tokenizer: Annotated[Path, typer.Option("--tokenizer", help="tokenizer.json or an HF tokenizer dir")],
    inputs: Annotated[list[str], typer.Option("--input", help="text/jsonl/parquet file, directory or glob "
                                                            "(repeatable)")],
    out: Annotated[Path, typer.Option("--out", help="directory for train.tok, val.tok, prepare.json")],
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="share of documents held out")] = 0.01,
    as_json: Annotated[bool, typer.Option("--json", help="print the counts and files as JSON")] = False,
) -> None:
    """Tokenize documents in parallel into the engine's token files (EOS after each document)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    from workers.engine.data.hf_tokenizer import check_sources, load_tokenizer
    from workers.engine.data.prepare import input_bytes, prepare

    try:
        load_tokenizer(tokenizer)
        check_sources(inputs)
        total = input_bytes(inputs)
    except (ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=EXIT_BAD_INPUT) from None
    progress = Progress(TextColumn("[bold]tokenize[/]"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeElapsedColumn())
    with progress:
        task = progress.add_task("tokenize", total=total)
        try:
            res = prepare(inputs, str(tokenizer), out, val_fraction,
                          on_progress=lambda n: progress.advance(task, n))
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(code=EXIT_BAD_INPUT) from None
        progress.update(task, completed=total)
    if as_json:
        typer.echo(json.dumps({**dataclasses.asdict(res), "tokens_per_s": res.tokens_per_s,
                               "train": str(out / "train.tok"), "val": str(out / "val.tok")}))
        return
    typer.echo(f"train: {res.train_docs} documents, {res.train_tokens} tokens -> {out / 'train.tok'}\n"
               f"val:   {res.val_docs} documents, {res.val_tokens} tokens -> {out / 'val.tok'}\n"
               f"{res.tokens_per_s:,.0f} tokens/s")


def register(app: typer.Typer) -> None:
    """Add ``data prepare`` to the ``orthoplex data`` group."""
    from service.cli.client import data_group

    group = data_group(app)
    if not any(c.name == "prepare" for c in group.registered_commands):
        group.command("prepare")(prepare_cmd)
