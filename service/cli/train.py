"""``orthoplex train``: run the 4D-parallel engine locally, one process per rank.

Heavy imports (torch, the engine) happen inside the command so ``orthoplex --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_BAD_INPUT = 2


def _refuse(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def train(
    model: Annotated[str | None, typer.Option("--model", help="model preset (tiny, small, llama3-8b, ...)")] = None,
    model_json: Annotated[Path | None, typer.Option("--model-json", help="model shape as JSON")] = None,
    layout: Annotated[str | None, typer.Option(
        "--layout", help="tp=2,cp=2,pp=2,dp=1[,vpp=2,micro_batch=1,zero=1,cp_method=ring|ulysses,"
                         "dp_replicate=R (replica groups, zero 1|3)]; "
                         "omitted = single process")] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", min=1)] = 8,
    steps: Annotated[int, typer.Option("--steps", min=1)] = 10,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    data: Annotated[str | None, typer.Option("--data", help="text file/dir or token file; default: "
                                                                 "the built-in stdlib corpus")] = None,
    checkpoint_dir: Annotated[str | None, typer.Option(
        "--checkpoint-dir", help="a directory, or an object-store prefix (s3://BUCKET/PREFIX; docs/storage.md)")] = None,
    save_every: Annotated[int, typer.Option("--save-every", min=0)] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the newest verified checkpoint")] = False,
    stop_at_step: Annotated[int | None, typer.Option(
        "--stop-at-step", min=1, help="end after step K with a checkpoint, keeping the schedule of --steps")] = None,
    metrics_out: Annotated[Path | None, typer.Option("--metrics-out", help="JSON lines, one per step")] = None,
    lr: Annotated[float, typer.Option("--lr")] = 3e-3,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", min=0)] = 2,
    keep: Annotated[int, typer.Option("--keep", min=2)] = 2,
    timeout: Annotated[float, typer.Option("--timeout", help="collective timeout per rank, seconds")] = 120.0,
    init_hf: Annotated[Path | None, typer.Option(
        "--init-hf", help="start from an HF Llama checkpoint directory (config.json + *.safetensors)")] = None,
    seq_len: Annotated[int | None, typer.Option(
        "--seq-len", min=2, help="training sequence length (with --init-hf; default min(2048, max positions))")] = None,
    export_hf: Annotated[str | None, typer.Option(
        "--export-hf", help="at the end, write the weights as an HF Llama checkpoint directory (or s3:// prefix)")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="tokenizer.json or an HF tokenizer dir for text/jsonl/parquet --data "
                            "(default: byte tokens)")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", min=0, help="validation loss every K steps "
                                                                          "(and after the last)")] = 0,
    eval_data: Annotated[str | None, typer.Option("--eval-data", "--val-data", help="validation text or token "
                                                    "file (e.g. data prepare's val.tok)")] = None,
    mlflow_uri: Annotated[str | None, typer.Option(
        "--mlflow-uri", envvar="ORTHOPLEX_MLFLOW_TRACKING_URI",
        help="also log to this MLflow tracking URI (sqlite:///FILE, http://HOST:PORT)")] = None,
    mlflow_experiment: Annotated[str, typer.Option("--mlflow-experiment")] = "orthoplex",
    tensorboard_dir: Annotated[str | None, typer.Option(
        "--tensorboard-dir", help="TensorBoard event files, a directory or s3:// prefix "
                                  "(default: CHECKPOINT_DIR/tensorboard)")] = None,
) -> None:
    """Train a Llama-style model with a 4D-parallel layout on local processes."""
    from planner.layout import Layout, LayoutError
    from workers import object_store
    from workers.engine.config import DataConfig, ExportConfig, ModelConfig, TrainConfig
    from workers.engine.validate import layout_problems

    if sum(x is not None for x in (model, model_json, init_hf)) != 1:
        _refuse("give exactly one of --model NAME, --model-json FILE or --init-hf DIR")
    if seq_len is not None and init_hf is None:
        _refuse("--seq-len applies to --init-hf (presets and --model-json carry their own seq_len)")
    try:
        if init_hf is not None:
            mcfg = hf_model_config(init_hf, seq_len)
        else:
            mcfg = ModelConfig.from_json(model_json) if model_json is not None else ModelConfig.preset(str(model))
    except (ValueError, OSError) as e:
        _refuse(str(e))
    try:
        lay = Layout.parse(layout) if layout else Layout()
    except LayoutError as e:
        _refuse(f"bad layout: {e}")
    if eval_every and not eval_data:
        _refuse("--eval-every needs --eval-data")
    if eval_data and not Path(eval_data).exists():
        _refuse(f"--eval-data {eval_data}: no such file or directory")
    if (resume or stop_at_step or save_every) and checkpoint_dir is None:
        _refuse("--resume, --stop-at-step and --save-every need --checkpoint-dir")
    for flag, where in (("--checkpoint-dir", checkpoint_dir), ("--tensorboard-dir", tensorboard_dir),
                        ("--export-hf", export_hf)):
        if where is not None:
            problem = object_store.location_problem(where)
            if problem:
                _refuse(f"{flag} {where}: {problem}")
    problems = layout_problems(mcfg, lay, global_batch)
    if problems:
        _refuse(f"layout {lay.short()} refused for model {mcfg.name}: " + "; ".join(problems))
    try:
        cfg = TrainConfig(model=mcfg, steps=steps, global_batch=global_batch, seed=seed, lr=lr,
                          min_lr=lr / 10, warmup_steps=min(warmup_steps, steps), data=DataConfig.from_path(data),
                          checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None, save_every=save_every,
                          keep_checkpoints=keep,
                          export=ExportConfig("hf", object_store.local_resolved(export_hf)) if export_hf else None,
                          eval_every=eval_every, eval_data=DataConfig.from_path(eval_data) if eval_data else None)
    except ValueError as e:
        _refuse(str(e))
    if data and not Path(data).exists():
        _refuse(f"--data {data}: no such file or directory")
    if tokenizer is not None:
        if cfg.data.kind != "text":
            _refuse("--tokenizer applies to text, jsonl or parquet --data")
        from workers.engine.data.hf_tokenizer import check_sources, load_tokenizer

        try:
            size = load_tokenizer(tokenizer).get_vocab_size()
            check_sources(cfg.data.paths)
        except (ValueError, OSError) as e:
            _refuse(str(e))
        if size > mcfg.vocab:
            _refuse(f"--tokenizer {tokenizer}: vocabulary of {size} does not fit the model's vocab {mcfg.vocab}")
        cfg.data = dataclasses.replace(cfg.data, tokenizer=str(tokenizer.resolve()))
        if cfg.eval_data is not None and cfg.eval_data.kind == "text":
            cfg.eval_data = dataclasses.replace(cfg.eval_data, tokenizer=str(tokenizer.resolve()))

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from workers.engine.launch import RankError, run_ranks, train_rank
    from workers.engine.tracking import RunTracker

    console = Console(stderr=True)
    out = metrics_out.open("a") if metrics_out is not None else None
    if tensorboard_dir is None and checkpoint_dir is not None:
        tensorboard_dir = object_store.join_location(checkpoint_dir, "tensorboard")
    params = {"model": mcfg.name, "layout": lay.short(), "global_batch": global_batch, "steps": steps,
              "seq_len": mcfg.seq_len, "lr": lr, "seed": seed, "init_hf": cfg.model.hf or "",
              "data": data or "builtin"}
    try:
        import torch

        # MFU's peak: the CUDA device's planner profile; on CPU the planner's CPU stand-in
        gpu_type = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        tracker: RunTracker | None = RunTracker(tensorboard_dir, mcfg, gpu_type=gpu_type, mlflow_uri=mlflow_uri,
                                                experiment=mlflow_experiment,
                                                run_name=f"{mcfg.name} {lay.short()}", params=params)
    except Exception as e:  # mlflow raises its own MlflowException and connection errors
        _refuse(f"--mlflow-uri {mlflow_uri}: {e}")
    progress = Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
    task = progress.add_task(f"{mcfg.name} {lay.short()}", total=steps, info="starting ranks")

    def on_event(ev: dict[str, Any]) -> None:
        kind = ev.pop("event")
        if kind == "start":
            progress.update(task, completed=ev["step"], info=f"from step {ev['step']}")
        elif kind == "step":
            line = {k: ev[k] for k in ("step", "loss", "grad_norm", "lr", "tokens_per_s")}
            if tracker is not None:
                line["mfu"] = tracker.log_step(ev["step"], loss=ev["loss"], grad_norm=ev["grad_norm"], lr=ev["lr"],
                                               tokens_per_s=ev["tokens_per_s"], devices=lay.world_size)["mfu"]
            if out is not None:
                out.write(json.dumps(line) + "\n")
                out.flush()
            else:
                typer.echo(json.dumps(line))
            progress.update(task, completed=ev["step"],
                            info=f"loss {ev['loss']:.4f}  {ev['tokens_per_s']:.0f} tok/s")
        elif kind == "eval":
            line = {"step": ev["step"], "val_loss": ev["val_loss"]}
            if out is not None:
                out.write(json.dumps(line) + "\n")
                out.flush()
            else:
                typer.echo(json.dumps(line))
            if tracker is not None:
                tracker.log_eval(ev["step"], ev["val_loss"])
        elif kind == "export":
            progress.console.print(f"exported HF checkpoint -> {ev['path']}")
        elif kind == "checkpoint":
            progress.console.print(f"checkpoint step {ev['step']} -> {ev['path']} ({ev['seconds']:.2f}s)")

    try:
        with progress:
            results = run_ranks(train_rank, lay.world_size, cfg.to_dict(), lay.to_dict(), resume, stop_at_step,
                                timeout_s=24 * 3600, collective_timeout_s=timeout, on_event=on_event)
    except RankError as e:
        console.print(f"[red]training failed[/]: {e}")
        if tracker is not None:
            tracker.close("FAILED")
            tracker = None
        raise typer.Exit(code=1) from None
    finally:
        if out is not None:
            out.close()
        if tracker is not None:
            tracker.close()
    r = results[0]
    console.print(f"done: steps {r['start']}..{r['end']} under {lay.short()}"
                  + (f", checkpoints at {r['saved']}" if r["saved"] else ""))


def hf_model_config(path: Path, seq_len: int | None) -> Any:
    """The model shape of an HF checkpoint directory, its tensors checked against it (headers only):
    refusals (``model_type``, a missing or corrupt safetensors file, a wrong shape) before any rank
    starts."""
    from workers.engine.hf import check_checkpoint, model_config_from_hf, read_hf_config

    data = read_hf_config(path)
    if seq_len is None:
        seq_len = min(2048, int(data.get("max_position_embeddings") or 2048))
    mcfg = model_config_from_hf(data, seq_len, name=path.name)
    check_checkpoint(path, mcfg, tied=bool(data.get("tie_word_embeddings", False)))
    return dataclasses.replace(mcfg, hf=str(path.resolve()))


def register(app: typer.Typer) -> None:
    """Add ``train`` to the ``orthoplex`` app."""
    app.command("train")(train)
