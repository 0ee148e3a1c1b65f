"""The built-in corpus: the Python standard library's own sources, present offline on every machine.

Files are ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` (without site-packages, test suites and
``__pycache__``), sorted by relative path, taken in order until ``max_bytes``. The same Python
version therefore gives the same corpus everywhere. With a ``cache_dir`` the token stream is written
once as a token file (named after the Python version and a key of the file list) and memory-mapped
afterwards; concurrent ranks may race to write it, which is harmless (atomic rename, same content).
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

from workers.engine.data.text import _dataset, read_documents
from workers.engine.data.tokenizer import ByteTokenizer
from workers.engine.data.tokens import TokenDataset, open_token_file, write_token_file

BUILTIN_MAX_BYTES = 4 * 1024 * 1024
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(max_bytes: int = BUILTIN_MAX_BYTES, root: Path | None = None) -> list[Path]:
    """The sorted source files of the corpus, capped to ``max_bytes`` in total."""
    root = root or stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"Python standard library not found at {root}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    out, total = [], 0
    for f in found:
        size = f.stat().st_size
        if total + size > max_bytes and out:
            break
        out.append(f)
        total += size
    if not out:
        raise ValueError(f"no Python sources under {root}")
    return out


def _cache_key(files: list[Path], root: Path, max_bytes: int) -> str:
    h = hashlib.sha256(f"{sys.version_info[:3]}|{max_bytes}".encode())
    for f in files:
        h.update(f"{f.relative_to(root).as_posix()}:{f.stat().st_size}\n".encode())
    return h.hexdigest()[:12]


def builtin_dataset(seq_len: int, cache_dir: str | os.PathLike | None = None,
                    max_bytes: int = BUILTIN_MAX_BYTES) -> TokenDataset:
    """The stdlib corpus as byte tokens (one document per file), cached under ``cache_dir`` if given."""
    root = stdlib_root()
    files = stdlib_files(max_bytes, root)
    name = f"builtin-stdlib-py{sys.version_info.major}.{sys.version_info.minor}"
    if cache_dir is None:
        docs, used = read_documents(files)
        return _dataset(ByteTokenizer().encode_documents(docs), seq_len, name, used)
    path = Path(cache_dir) / f"{name}-{_cache_key(files, root, max_bytes)}.tok"
    if not path.is_file():
        docs, _ = read_documents(files)
        write_token_file(path, ByteTokenizer().encode_documents(docs), "uint16",
                         vocab_size=ByteTokenizer.vocab_size)
    tf = open_token_file(path)
    return TokenDataset([tf.tokens], seq_len, name=name, vocab_size=ByteTokenizer.vocab_size,
                        sources=[str(f) for f in files])
