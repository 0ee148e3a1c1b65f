"""A submitted job's model, tokenizer and data inputs, checked inside the tenant's data area: the
one home of these rules, used by the API at submission (``service.api.routes.jobs``: 422 naming the
field) and by the translation into the runtime's spec at every attempt
(``workers.runtime.contract.attempt_spec``: the files are resolved again where the job starts).

A job spec (its REST shape, as stored) may name:

- ``model: {"hf": DIR, "seq_len": S}``: an HF Llama checkpoint directory. Its ``config.json`` gives
  the shape (what the planner plans), its safetensors headers are checked against it; the runtime
  gets the shape as ``model``, with the resolved directory as ``model.hf``.
- ``tokenizer: PATH``: a ``tokenizer.json`` or an HF tokenizer directory whose vocabulary fits the
  model; the runtime's ``data`` (and ``eval_data``) carry the resolved path.
- ``data`` / ``eval_data``: paths resolved by :mod:`workers.data_area` (the engine resolves them
  again where it reads); ``eval_every`` (+ ``eval_batches``) validation on ``eval_data``.
- ``export: {"format": "hf"}``: the runtime writes ``<job dir>/export`` (``export.dir``) after the last step.
- ``tracking``: TensorBoard files always go to ``<job dir>/tensorboard``; MLflow to the job's
  ``tracking.mlflow_uri`` or the service's default URI.

No torch here or in what it imports: an HF checkpoint is checked from ``config.json`` and the
safetensors headers (:mod:`workers.engine.hf.headers`); the tokenizer with ``tokenizers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.data_area import DataArea, DataPathError, TenantFileError, resolve_data_paths, resolve_path

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
    from workers.engine.hf.headers import HFWeightsError, check_checkpoint

    shown = str(model.get("hf"))
    try:
        data = read_hf_config(path)
        seq_len = model.get("seq_len") or min(2048, int(data.get("max_position_embeddings") or 2048))
        cfg = model_config_from_hf(data, int(seq_len), name=Path(shown).name or "hf")
        check_checkpoint(path, cfg, tied=bool(data.get("tie_word_embeddings", False)))
    except (HFConfigError, HFWeightsError, TenantFileError) as exc:
        # messages name files by their absolute path: show the tenant's own name instead
        raise InputError(("model", "hf"), str(exc).replace(str(path), shown)[:400]) from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        # a value of the tenant's config.json of the wrong type (e.g. "rope_theta": [1])
        raise InputError(("model", "hf"), f"{shown}/config.json: unusable value "
                                          f"({type(exc).__name__}: {str(exc).replace(str(path), shown)[:200]})") from None
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
        msg = str(exc).removeprefix("tokenizer: ").replace(str(path), raw)
        raise InputError(("tokenizer",), msg.replace(str(area.root.resolve()) + "/", "")[:300]) from None
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
