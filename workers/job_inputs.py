"""A submitted job's model, tokenizer and data inputs, checked inside the tenant's data area and
turned into the runtime's fields: the one home of these rules, used by the API at submission
(``service.api.routes.jobs``: 422 naming the field) and by the controller at every attempt
(``service.controller.apply``: the files are resolved again where the job starts).

A job spec (its REST shape, as stored) may name:

- ``model: {"hf": DIR, "seq_len": S}``: an HF Llama checkpoint directory. Its ``config.json`` gives
  the shape (what the planner plans), its safetensors headers are checked against it; the runtime
  gets the shape as ``model`` and the resolved directory as ``init_hf``.
- ``tokenizer: PATH``: a ``tokenizer.json`` or an HF tokenizer directory whose vocabulary fits the
  model; the runtime's ``data`` (and ``val_data``) carry the resolved path.
- ``data`` / ``eval_data``: paths resolved by :mod:`workers.data_area` (the engine resolves them
  again where it reads); ``eval_every`` (+ ``eval_batches``) validation on ``eval_data``.
- ``export: {"format": "hf"}``: the runtime writes ``<job dir>/export`` after the last step.
- ``tracking``: TensorBoard files always go to ``<job dir>/tensorboard``; MLflow to the job's
  ``tracking.mlflow_uri`` or the service's default URI.

Model and tokenizer checks import torch and safetensors lazily (only jobs that use them pay).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers import object_store
from workers.data_area import DataArea, DataPathError, resolve_data_paths, resolve_path

Loc = tuple[str | int, ...]

#: under a job's directory (``<storage>/jobs/<id>``): what its artifacts are
EXPORT_DIR = "export"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"


class InputError(ValueError):
    """A job input the tenant may not use or the engine cannot train on: ``loc`` is the field."""

    def __init__(self, loc: Loc, msg: str) -> None:
        super().__init__(f"{'.'.join(str(p) for p in loc)}: {msg}")
        self.loc = loc
        self.msg = msg


def hf_model(model: Mapping[str, Any], area: DataArea) -> tuple[Path, dict[str, Any]]:
    """(resolved checkpoint directory, engine ``ModelConfig`` dict) of ``{"hf": DIR, "seq_len": S}``."""
    try:
        path = resolve_path(str(model.get("hf")), area, want="dir")
    except DataPathError as exc:
        raise InputError(("model", "hf"), exc.msg) from None
    from workers.engine.hf.config import HFConfigError, model_config_from_hf, read_hf_config
    from workers.engine.hf.weights import HFCheckpoint, HFWeightsError

    shown = str(model.get("hf"))
    try:
        data = read_hf_config(path)
        seq_len = model.get("seq_len") or min(2048, int(data.get("max_position_embeddings") or 2048))
        cfg = model_config_from_hf(data, int(seq_len), name=Path(shown).name or "hf")
        HFCheckpoint(path).check_against(cfg, tied=bool(data.get("tie_word_embeddings", False)))
    except (HFConfigError, HFWeightsError) as exc:
        # messages name files by their absolute path: show the tenant's own name instead
        raise InputError(("model", "hf"), str(exc).replace(str(path), shown)) from None
    return path, cfg.to_dict()


def model_shape(model: str | Mapping[str, Any], area: DataArea | None) -> dict[str, Any]:
    """The engine shape a spec's ``model`` trains (a preset's, an explicit one, or an HF config's)."""
    from workers.engine.config import ModelConfig

    if isinstance(model, str):
        return ModelConfig.preset(model).to_dict()
    if "hf" in model:
        if area is None:
            raise InputError(("model", "hf"), "needs the tenant's data area")
        return hf_model(model, area)[1]
    return dict(model)


def tokenizer_path(raw: str, area: DataArea, vocab: int) -> Path:
    """The resolved tokenizer, its vocabulary checked to fit a model of ``vocab`` tokens."""
    try:
        path = resolve_path(raw, area)
    except DataPathError as exc:
        raise InputError(("tokenizer",), exc.msg) from None
    from workers.engine.data.hf_tokenizer import eos_id, load_tokenizer

    try:
        tok = load_tokenizer(path)
        eos_id(tok, path)  # documents are separated by it
    except ValueError as exc:
        raise InputError(("tokenizer",), str(exc).removeprefix("tokenizer: ").replace(str(path), raw)[:300]) from None
    size = tok.get_vocab_size()
    if size > vocab:
        raise InputError(("tokenizer",), f"vocabulary of {size} does not fit the model's vocab {vocab}")
    return path


def _data_files(field: str, data: Mapping[str, Any], area: DataArea, tokenizer: bool) -> list[Path | str]:
    paths = list(data.get("paths") or [])
    try:
        files = resolve_data_paths(paths, area)
    except DataPathError as exc:
        loc: Loc = (field, "paths") if exc.index is None else (field, "paths", exc.index)
        raise InputError(loc, exc.msg) from None
    if tokenizer and data.get("kind") == "text":
        from workers.engine.data.hf_tokenizer import check_sources

        try:
            check_sources([str(f) for f in files])
        except (ValueError, OSError) as exc:
            raise InputError((field, "paths"), str(exc).replace(str(area.root.resolve()) + "/", "")) from None
    return files


def check_inputs(spec: Mapping[str, Any], area: DataArea) -> dict[str, Any]:
    """Check a stored job spec's inputs in ``area``; :class:`InputError` naming the field. Returns
    the engine shape of its model (what the planner plans)."""
    shape = model_shape(spec.get("model", "tiny"), area)
    tok = spec.get("tokenizer")
    if tok:
        tokenizer_path(str(tok), area, int(shape["vocab"]))
    for field in ("data", "eval_data"):
        data = spec.get(field)
        if isinstance(data, Mapping) and data.get("kind", "builtin") != "builtin":
            _data_files(field, data, area, bool(tok))
    return shape


def runtime_fields(spec: Mapping[str, Any], area: DataArea, job_dir: Path | str, *, job_id: int,
                   mlflow_uri: str | None = None) -> dict[str, Any]:
    """The runtime spec's fields for a stored job spec's inputs (``model``, ``init_hf``, ``data``,
    ``val_data``, ``eval_every``, ``eval_batches``, ``export_hf``, ``tracking``): the HF model and the
    tokenizer resolved again in ``area`` (:class:`InputError` when one is gone or moved outside since
    submission); data paths go with the area, which the engine resolves them in where it reads."""
    out: dict[str, Any] = {}
    model = spec.get("model", "tiny")
    if isinstance(model, Mapping) and "hf" in model:
        path, shape = hf_model(model, area)
        out["model"] = shape
        out["init_hf"] = str(path)
    else:
        shape = model_shape(model, None)
    tok = spec.get("tokenizer")
    tok_path = str(tokenizer_path(str(tok), area, int(shape["vocab"]))) if tok else None
    for field, key in (("data", "data"), ("eval_data", "val_data")):
        data = spec.get(field)
        if not isinstance(data, Mapping):
            continue
        d = dict(data)
        if d.get("kind", "builtin") != "builtin":
            d["area"] = area.to_dict()  # the engine resolves the paths in it where it reads
            if tok_path and d.get("kind") == "text":
                d["tokenizer"] = tok_path
        out[key] = d
    if spec.get("eval_every"):
        out["eval_every"] = int(spec["eval_every"])
        if spec.get("eval_batches"):
            out["eval_batches"] = int(spec["eval_batches"])
    export = spec.get("export")
    if isinstance(export, Mapping) and export.get("format") == "hf":
        out["export_hf"] = str(object_store.under(job_dir, EXPORT_DIR))
    tracking = dict(spec.get("tracking") or {})
    out["tracking"] = {"tensorboard_dir": str(object_store.under(job_dir, TENSORBOARD_DIR)),
                       "mlflow_uri": tracking.get("mlflow_uri") or mlflow_uri,
                       "experiment": tracking.get("experiment", "orthoplex"),
                       "run_name": f"job-{job_id}"}
    return out
