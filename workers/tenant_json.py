"""JSON from a tenant's files, read as hostile input: bounded size and nesting, a type check, and a
:class:`~workers.data_area.TenantFileError` naming the file (never a ``RecursionError`` or an
``AttributeError`` deep inside a reader).

Every JSON a tenant can hand the engine goes through here: an HF ``config.json`` and
``model.safetensors.index.json``, ``tokenizer_config.json``, a token file's sidecar, each line of a
``.jsonl`` corpus. (``tokenizer.json`` and safetensors headers are parsed by Rust libraries with
their own nesting limits; their errors are caught where they are read.) The nesting is measured
before parsing, in linear time, so a 5,000-deep document costs one scan.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from workers.data_area import TenantFileError

#: the deepest nesting any of these files needs is about 4; the API's request bodies allow 32
MAX_DEPTH = 64
#: the largest JSON file read whole (an HF index of a 405B model is well under 1 MiB)
MAX_FILE_BYTES = 32 << 20
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def nesting_depth(raw: bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text (strings skipped), without parsing it."""
    brackets = np.frombuffer(_STRINGS.sub(b'""', raw), dtype=np.uint8)
    steps = np.zeros(brackets.shape, dtype=np.int32)
    steps[(brackets == ord("[")) | (brackets == ord("{"))] = 1
    steps[(brackets == ord("]")) | (brackets == ord("}"))] = -1
    return int(np.cumsum(steps).max()) if steps.size else 0


def loads(raw: bytes | str, shown: str, expect: type | None = dict, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` (from the file ``shown``, as the tenant names it); :class:`TenantFileError`
    when it is not JSON, nests deeper than ``max_depth`` or is not an ``expect`` (e.g. ``dict``)."""
    import json

    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = nesting_depth(data)
    if depth > max_depth:
        raise TenantFileError(f"{shown}: JSON nested {depth} levels deep (at most {max_depth})")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TenantFileError(f"{shown}: not valid JSON ({str(exc)[:160]})") from None
    if expect is not None and not isinstance(value, expect):
        want = {dict: "an object", list: "an array", str: "a string"}.get(expect, expect.__name__)
        raise TenantFileError(f"{shown}: expected {want}, got {_kind(value)}")
    return value


def load_file(path: str | Path, shown: str, expect: type | None = dict, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """:func:`loads` of the file at ``path`` (at most ``max_bytes``)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise TenantFileError(f"{shown}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > max_bytes:
        raise TenantFileError(f"{shown}: larger than {max_bytes} bytes")
    return loads(raw, shown, expect)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
