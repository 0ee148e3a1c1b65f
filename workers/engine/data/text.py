"""Text corpora: files given by path (files, directories or glob patterns) read as byte tokens."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from workers.engine.data.tokenizer import ByteTokenizer
from workers.engine.data.tokens import TokenDataset

TEXT_SUFFIXES = (".txt", ".py", ".md")


def _walk(directory: Path, suffixes: Sequence[str]) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(tuple(suffixes)))
    return sorted(found, key=lambda p: p.relative_to(directory).as_posix())


def collect_text_files(paths: Iterable[str | os.PathLike], suffixes: Sequence[str] = TEXT_SUFFIXES
                       ) -> list[Path]:
    """The files named by ``paths``, in a deterministic order.

    A file is taken as is; a directory contributes its ``suffixes`` files recursively, sorted by
    relative path; a string with ``*?[`` is a glob (sorted). Duplicates keep their first position.
    Raises ``FileNotFoundError`` for a path that does not exist and ``ValueError`` for a directory or
    glob that matches nothing, naming the path.
    """
    out: list[Path] = []
    given = [str(p) for p in paths]
    if not given:
        raise ValueError("no data paths given")
    for raw in given:
        p = Path(raw).expanduser()
        if any(ch in raw for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(str(p), recursive=True) if Path(m).is_file())
            if not matches:
                raise ValueError(f"data path pattern matches no files: {raw}")
            out.extend(matches)
        elif p.is_file():
            out.append(p)
        elif p.is_dir():
            files = _walk(p, suffixes)
            if not files:
                raise ValueError(f"data directory has no {'/'.join('*' + s for s in suffixes)} files: {raw}")
            out.extend(files)
        else:
            raise FileNotFoundError(f"data path does not exist: {raw}")
    seen: set[Path] = set()
    unique = []
    for f in out:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def read_documents(files: Sequence[Path], *, max_bytes: int | None = None) -> tuple[list[bytes], list[Path]]:
    """File contents in order, stopping before the file that would pass ``max_bytes`` in total."""
    docs: list[bytes] = []
    used: list[Path] = []
    total = 0
    for f in files:
        data = f.read_bytes()
        if max_bytes is not None and total + len(data) > max_bytes and docs:
            break
        docs.append(data)
        used.append(f)
        total += len(data)
    return docs, used


def text_dataset(paths: Iterable[str | os.PathLike], seq_len: int, *, name: str = "text") -> TokenDataset:
    """Byte tokens of every file under ``paths``, one document per file, separated by EOD."""
    given = [str(p) for p in paths]
    files = collect_text_files(given)
    docs, used = read_documents(files)
    if not any(docs):
        raise ValueError(f"data files are all empty: {', '.join(given)}")
    stream = ByteTokenizer().encode_documents(docs)
    return _dataset(stream, seq_len, name, used)


def _dataset(stream: np.ndarray, seq_len: int, name: str, files: Sequence[Path]) -> TokenDataset:
    return TokenDataset([stream], seq_len, name=name, vocab_size=ByteTokenizer.vocab_size,
                        sources=[str(f) for f in files])
