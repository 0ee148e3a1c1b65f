"""Token streams and the fixed-length samples cut from them; token files on disk.

A dataset is one logical stream of token ids (possibly spread over several arrays or memory-mapped
files). Sample ``i`` is the window ``stream[i*seq_len : i*seq_len + seq_len + 1]``: ``seq_len``
inputs plus the shifted target, the last token of one sample being the first of the next.

Token files (``write_token_file``/``open_token_file``) are flat little-endian arrays of
``uint8``/``uint16``/``uint32`` with a 32-byte header::

    magic  b"OPXTOK1\\n"  (8 bytes)
    dtype  ASCII, NUL-padded (8 bytes), e.g. b"uint16\\0\\0"
    count  uint64 LE, number of tokens
    vocab  uint64 LE, vocabulary size (0 = unknown)

Files without the header are raw arrays; their dtype comes from a sidecar JSON (``F.json`` next to
``F``, or ``F`` with its suffix replaced by ``.json``: ``{"dtype": "uint16", "vocab_size": 50257}``),
or else from the caller. ``.npy`` files are opened with ``numpy.load(mmap_mode="r")``.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.data_area import referenced_path
from workers.tenant_json import load_file

MAGIC = b"OPXTOK1\n"
HEADER_BYTES = 32
TOKEN_DTYPES = ("uint8", "uint16", "uint32")


@dataclass(frozen=True)
class TokenFile:
    """A memory-mapped token file and what its header or sidecar said."""

    path: Path
    tokens: np.ndarray
    dtype: str
    vocab_size: int | None
    source: str  # "header" | "sidecar" | "npy" | "caller"


def _check_dtype(dtype: str, where: str) -> np.dtype:
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"{where}: token dtype must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")
    return np.dtype(dtype).newbyteorder("<")


def write_token_file(path: str | os.PathLike, tokens: np.ndarray | Sequence[int], dtype: str = "uint16",
                     *, vocab_size: int | None = None) -> Path:
    """Write ``tokens`` with the header, atomically (temp file + fsync + rename)."""
    path = Path(path)
    dt = _check_dtype(dtype, str(path))
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{path}: tokens must be a 1-D array, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(dt).max):
        raise ValueError(f"{path}: token ids do not fit {dtype}")
    header = MAGIC + dtype.encode("ascii").ljust(8, b"\x00") + struct.pack("<QQ", arr.size, vocab_size or 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(arr.astype(dt, copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _sidecar(path: Path) -> Path | None:
    """``<name>.json`` or ``<stem>.json`` next to ``path``, under the data area's rule for files a
    file names (inside its directory, symlinks followed)."""
    for cand in (path.with_name(path.name + ".json"), path.with_suffix(".json")):
        if cand != path:
            found = referenced_path(path.parent, cand.name, str(cand), required=False)
            if found is not None:
                return found
    return None


def open_token_file(path: str | os.PathLike, dtype: str | None = None) -> TokenFile:
    """Memory-map a token file; dtype from the header, else ``.npy``, else a sidecar, else ``dtype``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token file not found: {path}")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"token file is empty: {path}")
    if path.suffix == ".npy":
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 1 or arr.dtype.kind != "u":
            raise ValueError(f"{path}: a .npy token file must be a 1-D unsigned array, got "
                             f"{arr.dtype} {arr.shape}")
        return TokenFile(path, arr, str(arr.dtype), None, "npy")
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if head[:8] == MAGIC:
        if len(head) < HEADER_BYTES:
            raise ValueError(f"{path}: truncated token-file header")
        name = head[8:16].rstrip(b"\x00").decode("ascii", errors="replace")
        dt = _check_dtype(name, str(path))
        count, vocab = struct.unpack("<QQ", head[16:32])
        if size != HEADER_BYTES + count * dt.itemsize:
            raise ValueError(f"{path}: header says {count} {name} tokens "
                             f"({HEADER_BYTES + count * dt.itemsize} bytes) but the file has {size} bytes")
        arr = np.memmap(path, dtype=dt, mode="r", offset=HEADER_BYTES, shape=(count,))
        return TokenFile(path, arr, name, vocab or None, "header")
    vocab_size: int | None = None
    side = _sidecar(path)
    if side is not None:
        try:
            meta = load_file(side, str(side))
            name, vocab_size = str(meta["dtype"]), meta.get("vocab_size")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{side}: sidecar must be a JSON object with a 'dtype' key ({exc})") from exc
        source = "sidecar"
    elif dtype is not None:
        name, source = dtype, "caller"
    else:
        raise ValueError(f"{path}: no token-file header, no sidecar {path.name}.json and no dtype given; "
                         "cannot tell uint16 from uint32")
    dt = _check_dtype(name, str(side or path))
    if size % dt.itemsize:
        raise ValueError(f"{path}: {size} bytes is not a whole number of {name} tokens")
    arr = np.memmap(path, dtype=dt, mode="r", shape=(size // dt.itemsize,))
    return TokenFile(path, arr, name, int(vocab_size) if vocab_size else None, source)


class TokenDataset:
    """Fixed-length samples over a stream made of one or more token arrays, in order.

    ``ds[i]`` is an ``int64`` array of ``seq_len + 1`` tokens; windows may cross array boundaries.
    """

    def __init__(self, chunks: Sequence[np.ndarray], seq_len: int, *, name: str = "tokens",
                 vocab_size: int | None = None, sources: Sequence[str] = ()) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.chunks = [c for c in chunks if len(c)]
        self.seq_len = seq_len
        self.name = name
        self.vocab_size = vocab_size
        self.sources = list(sources)
        self._ends = np.cumsum([len(c) for c in self.chunks], dtype=np.int64)
        self.num_tokens = int(self._ends[-1]) if len(self._ends) else 0
        self.num_samples = max(0, (self.num_tokens - 1) // seq_len)
        if self.num_samples == 0:
            raise ValueError(f"dataset {name!r} has {self.num_tokens} tokens, fewer than one sample of "
                             f"seq_len+1 = {seq_len + 1}")

    def __len__(self) -> int:
        return self.num_samples

    def tokens(self, start: int, end: int) -> np.ndarray:
        """``stream[start:end]`` as ``int64`` (may span several chunks)."""
        if not 0 <= start <= end <= self.num_tokens:
            raise IndexError(f"token range [{start}, {end}) outside [0, {self.num_tokens})")
        out = np.empty(end - start, dtype=np.int64)
        i = int(np.searchsorted(self._ends, start, side="right"))
        pos = start
        while pos < end:
            chunk_start = int(self._ends[i - 1]) if i else 0
            take = min(end, int(self._ends[i])) - pos
            out[pos - start:pos - start + take] = self.chunks[i][pos - chunk_start:pos - chunk_start + take]
            pos += take
            i += 1
        return out

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside [0, {self.num_samples})")
        start = index * self.seq_len
        return self.tokens(start, start + self.seq_len + 1)

    def describe(self) -> dict[str, object]:
        """A small JSON-able summary (for logs and checkpoint manifests)."""
        return {"name": self.name, "num_tokens": self.num_tokens, "num_samples": self.num_samples,
                "seq_len": self.seq_len, "vocab_size": self.vocab_size, "sources": len(self.sources)}
