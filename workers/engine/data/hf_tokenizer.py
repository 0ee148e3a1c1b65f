"""Documents from text, jsonl and parquet files, tokenized with a Hugging Face ``tokenizers``
tokenizer into one stream ``doc0 EOS doc1 EOS ...``.

- ``*.jsonl``: one document per line, its ``text`` field; ``*.parquet``: one per row of the
  ``text`` column (``pyarrow``); any other file: the whole file is one document.
- The tokenizer: a ``tokenizer.json`` or an HF tokenizer directory; its EOS is the
  ``eos_token`` of ``tokenizer_config.json`` next to it, else the first of ``</s>``,
  ``<|end_of_text|>``, ``<|endoftext|>``, ``<eos>`` in its vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workers.data_area import referenced_path
from workers.engine.data.text import collect_text_files
from workers.engine.data.tokens import TokenDataset
from workers.tenant_json import load_file, loads

DOC_SUFFIXES = (".txt", ".md", ".py", ".jsonl", ".parquet")
EOS_CANDIDATES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>")
TEXT_FIELD = "text"


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` or a directory holding one."""
    from tokenizers import Tokenizer

    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if p.is_dir():  # the data area's rule: tokenizer.json inside the directory, symlinks followed
        found = referenced_path(p, "tokenizer.json", f"tokenizer: {f}", required=False)
        if found is None:
            raise ValueError(f"tokenizer: {f} not found (a tokenizer.json or a directory holding one)")
        f = found
    elif not f.is_file():
        raise ValueError(f"tokenizer: {f} not found (a tokenizer.json or a directory holding one)")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a plain Exception
        raise ValueError(f"tokenizer: {f} is not a tokenizers JSON file ({e})") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_files(path: str | os.PathLike | None) -> dict[str, bytes]:
    """The files an HF export carries for the tokenizer at ``path`` (none for ``None``)."""
    if not path:
        return {}
    p = Path(path)
    if p.is_file():
        return {"tokenizer.json": p.read_bytes()}
    found = {name: referenced_path(p, name, f"tokenizer: {p / name}", required=False) for name in TOKENIZER_FILES}
    return {name: f.read_bytes() for name, f in found.items() if f is not None}


def eos_id(tokenizer: Any, path: str | os.PathLike) -> int:
    p = Path(path)
    base = p if p.is_dir() else p.parent
    shown = str(base / "tokenizer_config.json")
    cfg = referenced_path(base, "tokenizer_config.json", shown, required=False)
    names: list[str] = []
    if cfg is not None:
        eos = load_file(cfg, shown).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            names.append(eos)
    for name in [*names, *EOS_CANDIDATES]:
        i = tokenizer.token_to_id(name)
        if i is not None:
            return int(i)
    raise ValueError(f"tokenizer: {path} has no end-of-sequence token ({', '.join(EOS_CANDIDATES)} or "
                     f"tokenizer_config.json eos_token)")


def documents(path: Path) -> Iterator[str]:
    """The documents of one file (see the module docstring); a missing ``text`` is refused naming it."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = loads(line, f"{path}:{n}", expect=None)
                if not isinstance(row, dict) or not isinstance(row.get(TEXT_FIELD), str):
                    raise ValueError(f"{path}:{n}: no string field '{TEXT_FIELD}'")
                yield row[TEXT_FIELD]
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        if TEXT_FIELD not in pf.schema_arrow.names:
            raise ValueError(f"{path}: parquet file has no column '{TEXT_FIELD}' "
                             f"(columns: {', '.join(pf.schema_arrow.names)})")
        for batch in pf.iter_batches(columns=[TEXT_FIELD]):
            yield from (t for t in batch.column(0).to_pylist() if t)
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def check_sources(paths: Iterable[str]) -> list[Path]:
    """The files under ``paths``, each checked cheaply before any rank starts: a parquet file's
    schema has the ``text`` column, a jsonl file's first record has the ``text`` field."""
    files = collect_text_files(list(paths), suffixes=DOC_SUFFIXES)
    for f in files:
        if f.suffix in (".jsonl", ".parquet"):
            next(iter(documents(f)), None)
    return files


def tokenize_files(files: Iterable[Path], tokenizer: Any, eos: int, batch: int = 256) -> np.ndarray:
    """One stream of every document of ``files``, each followed by ``eos`` (``encode_batch``: the
    tokenizer's own threads)."""
    parts: list[np.ndarray] = []
    pending: list[str] = []

    def flush() -> None:
        for enc in tokenizer.encode_batch(pending, add_special_tokens=False):
            parts.append(np.asarray([*enc.ids, eos], dtype=np.int64))
        pending.clear()

    for f in files:
        for doc in documents(f):
            pending.append(doc)
            if len(pending) >= batch:
                flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def tokenized_dataset(paths: Iterable[str], seq_len: int, tokenizer_path: str) -> TokenDataset:
    """A dataset of the documents under ``paths`` tokenized with ``tokenizer_path``."""
    tok = load_tokenizer(tokenizer_path)
    files = collect_text_files(list(paths), suffixes=DOC_SUFFIXES)
    stream = tokenize_files(files, tok, eos_id(tok, tokenizer_path))
    dtype = np.uint16 if tok.get_vocab_size() <= 65536 else np.uint32
    return TokenDataset([stream.astype(dtype)], seq_len, name=f"tokenized:{Path(tokenizer_path).name}",
                        vocab_size=tok.get_vocab_size(), sources=[str(f) for f in files])
