"""``build_dataset``: a dataset from the trainer's data configuration."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers import object_store
from workers.data_area import DataArea, resolve_data_paths
from workers.engine.data.builtin import builtin_dataset
from workers.engine.data.text import TEXT_SUFFIXES, collect_text_files, text_dataset
from workers.engine.data.tokens import TokenDataset, open_token_file

TOKEN_SUFFIXES = (".bin", ".tok", ".tokens", ".npy", ".u16", ".u32")
KINDS = ("builtin", "text", "tokens")


def _field(cfg: Any, name: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def _paths(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, (str, os.PathLike)):
        return [str(raw)]
    return [str(p) for p in raw]


def _local(f: Path | str, kind: str) -> Path | str:
    """A selected file where the readers can open it: an object (``s3://...``) staged on this node,
    with a token file's sidecar (``F.json`` or ``F``'s suffix replaced by ``.json``) when there is one."""
    if not object_store.is_url(f):
        return f
    if kind == "tokens":
        suffix = Path(object_store.name(f)).suffix
        for side in (f"{f}.json", f"{f[:-len(suffix)]}.json" if suffix else None):
            if side and side != f and object_store.exists(side):
                object_store.stage(side)
    return object_store.stage(f)


def tokens_dataset(paths: list[str], seq_len: int, dtype: str | None = None) -> TokenDataset:
    """Token files (with header, sidecar JSON, ``.npy``, or raw of ``dtype``) in the given order;
    a directory contributes its token files (``*.bin *.tok *.tokens *.npy *.u16 *.u32``) sorted."""
    files = collect_text_files(paths, suffixes=TOKEN_SUFFIXES)
    opened = [open_token_file(f, dtype) for f in files]
    vocabs = {t.vocab_size for t in opened if t.vocab_size}
    name = Path(paths[0]).name if len(paths) == 1 else f"{len(files)} token files"
    return TokenDataset([t.tokens for t in opened], seq_len, name=f"tokens:{name}",
                        vocab_size=max(vocabs) if vocabs else None, sources=[str(f) for f in files])


def build_dataset(data_cfg: Any, seq_len: int, cache_dir: str | os.PathLike | None = None) -> TokenDataset:
    """The dataset ``data_cfg`` describes, cut into samples of ``seq_len + 1`` tokens.

    ``data_cfg`` is a ``DataConfig``, any object with ``kind``/``paths``/``dtype`` attributes, a dict
    with those keys, or ``None`` (the built-in corpus). ``kind``: ``"builtin"`` (stdlib sources,
    cached as a token file under ``cache_dir`` when given), ``"text"`` (files/directories/globs, byte
    tokens) or ``"tokens"`` (token files; ``dtype`` is used for raw files without header or sidecar).
    """
    kind = _field(data_cfg, "kind", "builtin")
    paths = _paths(_field(data_cfg, "paths", ()))
    dtype = _field(data_cfg, "dtype", None)
    area = _field(data_cfg, "area", None)
    if kind not in KINDS:
        raise ValueError(f"data kind must be one of {'|'.join(KINDS)}, got {kind!r}")
    if kind == "builtin":
        return builtin_dataset(seq_len, cache_dir=cache_dir)
    if not paths:
        raise ValueError(f"data kind {kind!r} needs at least one path")
    tokenizer = _field(data_cfg, "tokenizer", None)
    if area is not None:
        # a tenant's job: the same confinement as at submission, again where the files are read
        # (a symlink swapped in since then is caught here); names stay the tenant's own
        suffixes = TEXT_SUFFIXES if kind == "text" else TOKEN_SUFFIXES
        if kind == "text" and tokenizer:
            from workers.engine.data.hf_tokenizer import DOC_SUFFIXES

            suffixes = DOC_SUFFIXES
        files = [_local(f, kind) for f in resolve_data_paths(paths, DataArea.from_dict(area), suffixes)]
        shown = paths[0] if len(paths) == 1 else f"{len(paths)} paths"
        if kind == "text" and tokenizer:
            from workers.engine.data.hf_tokenizer import tokenized_dataset

            ds = tokenized_dataset([str(f) for f in files], seq_len, str(tokenizer))
        else:
            ds = (text_dataset([str(f) for f in files], seq_len) if kind == "text"
                  else tokens_dataset([str(f) for f in files], seq_len, dtype))
        ds.name = f"{kind}:{shown}"
        ds.sources = list(paths)  # what the tenant wrote, never the absolute paths
        return ds
    if kind == "text" and tokenizer:
        from workers.engine.data.hf_tokenizer import tokenized_dataset

        return tokenized_dataset(paths, seq_len, str(tokenizer))
    if kind == "text":
        return text_dataset(paths, seq_len, name="text:" + (Path(paths[0]).name if len(paths) == 1
                                                               else f"{len(paths)} paths"))
    return tokens_dataset(paths, seq_len, dtype)
