"""``orthoplex eval`` (loss on fixed windows of a text file) and ``orthoplex export`` (a DCP
checkpoint as an HF Llama directory). Heavy imports happen inside the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.train import EXIT_BAD_INPUT, hf_model_config
from workers import object_store


def _refuse(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def _layout(spec: str | None, cfg: Any, global_batch: int) -> Any:
    from planner.layout import Layout, LayoutError
    from workers.engine.validate import layout_problems

    try:
        lay = Layout.parse(spec) if spec else Layout()
    except LayoutError as e:
        _refuse(f"layout: {e}")
    problems = layout_problems(cfg, lay, global_batch)
    if problems:
        _refuse(f"layout {lay.short()} refused for model {cfg.name}: " + "; ".join(problems))
    return lay.with_global_batch(global_batch)


def _check_storage(flag: str, where: str | None) -> None:
    problem = object_store.location_problem(where) if where is not None else None
    if problem:
        _refuse(f"{flag} {where}: {problem}")


def eval_cmd(
    data: Annotated[Path, typer.Option("--data", help="a plain text file")],
    init_hf: Annotated[Path | None, typer.Option("--init-hf", help="an HF Llama checkpoint directory")] = None,
    checkpoint_dir: Annotated[str | None, typer.Option(
        "--checkpoint-dir", help="an Orthoplex checkpoint root (a directory or s3:// prefix)")] = None,
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="tokenizer.json or an HF tokenizer dir; "
                                                                      "default: byte tokens")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=2)] = 64,
    batches: Annotated[int, typer.Option("--batches", min=1, help="number of windows")] = 8,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="windows per forward "
                                                                              "(default: all)")] = None,
    layout: Annotated[str | None, typer.Option("--layout")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print {\"loss\": ..., \"tokens\": ...}")] = False,
) -> None:
    """Mean next-token loss over the first N windows of a text file (definition: docs/engine.md)."""
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.evaluate import checkpoint_config, eval_rank, text_stream, windows
    from workers.engine.launch import RankError, run_ranks

    if (init_hf is None) == (checkpoint_dir is None):
        _refuse("give exactly one of --init-hf DIR or --checkpoint-dir CK")
    _check_storage("--checkpoint-dir", checkpoint_dir)
    if not data.is_file():
        _refuse(f"data: {data} is not a file")
    bs = batch_size or batches
    if batches % bs:
        _refuse(f"batch-size: {bs} does not divide --batches {batches}")
    try:
        if init_hf is not None:
            mcfg = hf_model_config(init_hf, seq_len)
            cfg = TrainConfig(model=mcfg, steps=1, global_batch=bs)  # mcfg.hf: the weights come from it
        else:
            train, _, _ = checkpoint_config(checkpoint_dir)  # type: ignore[arg-type]
            train["model"] = {**train["model"], "seq_len": seq_len}
            train["global_batch"] = bs
            cfg = TrainConfig.from_dict(train)
        mcfg = cfg.model
        stream = text_stream(data, tokenizer)
        if len(stream) and int(stream.max()) >= mcfg.vocab:
            _refuse(f"tokenizer: token id {int(stream.max())} does not fit the model vocabulary {mcfg.vocab}")
        rows = windows(stream, seq_len, batches)
    except (ValueError, OSError) as e:
        _refuse(str(e))
    assert isinstance(mcfg, ModelConfig)
    lay = _layout(layout, mcfg, bs)
    groups = list(rows.split(bs))
    try:
        loss = run_ranks(eval_rank, lay.world_size, cfg.to_dict(), lay.to_dict(), groups,
                         str(checkpoint_dir) if checkpoint_dir else None, timeout_s=24 * 3600)[0]
    except RankError as e:
        typer.echo(f"eval failed: {e}", err=True)
        raise typer.Exit(code=1) from None
    result = {"loss": loss, "tokens": batches * seq_len}
    typer.echo(json.dumps(result) if as_json else f"loss {loss:.6f} over {batches * seq_len} tokens")


def export_cmd(
    checkpoint_dir: Annotated[str, typer.Option(
        "--checkpoint-dir", help="an Orthoplex checkpoint root (a directory or s3:// prefix)")],
    out: Annotated[str, typer.Option("--out", help="the HF directory (or s3:// prefix) to write")],
    layout: Annotated[str | None, typer.Option("--layout", help="ranks to gather with (default: the "
                                                                "checkpoint's own layout)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print {\"checkpoint_dir\", \"out\"} as JSON")] = False,
) -> None:
    """Write the newest verified checkpoint as an HF Llama directory (config, sharded safetensors)."""
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.evaluate import checkpoint_config, export_rank
    from workers.engine.launch import RankError, run_ranks

    _check_storage("--checkpoint-dir", checkpoint_dir)
    _check_storage("--out", out)
    try:
        train, saved_layout, base = checkpoint_config(checkpoint_dir)
        cfg = TrainConfig.from_dict(train)
    except (ValueError, OSError) as e:
        _refuse(str(e))
    lay = _layout(layout, cfg.model, cfg.global_batch) if layout else Layout.from_dict(saved_layout)
    try:
        path = run_ranks(export_rank, lay.world_size, cfg.to_dict(), lay.to_dict(), str(checkpoint_dir),
                         object_store.local_resolved(out), base, timeout_s=24 * 3600)[0]
    except RankError as e:
        typer.echo(f"export failed: {e}", err=True)
        raise typer.Exit(code=1) from None
    if as_json:
        typer.echo(json.dumps({"checkpoint_dir": str(checkpoint_dir), "out": str(path)}))
    else:
        typer.echo(f"exported {checkpoint_dir} -> {path}")


def register(app: typer.Typer) -> None:
    """Add ``eval`` and ``export`` to the ``orthoplex`` app."""
    app.command("eval")(eval_cmd)
    app.command("export")(export_cmd)
