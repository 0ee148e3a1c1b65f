"""Durable file-system primitives: fsync of files and directories, hashing, atomic small writes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HASH_CHUNK = 1 << 20


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def list_files(base: Path) -> list[str]:
    """Every regular file under ``base`` as a sorted relative POSIX path."""
    out = []
    for dirpath, _, filenames in os.walk(base):
        for name in filenames:
            out.append((Path(dirpath) / name).relative_to(base).as_posix())
    return sorted(out)
