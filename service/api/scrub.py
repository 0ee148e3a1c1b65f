"""What tenants see of the runtime's words: event payloads and job reasons with absolute paths
replaced by their last name (``/srv/storage/jobs/7/checkpoints/step_10`` → ``step_10``) and Ray
node ids (56 hex digits) by an opaque name (``node-1a2b3c4d``, stable for one node). Paths inside the
tenant's own area are shown the same way (its own relative names are what it wrote)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

_ABS_PATH = re.compile(r"(?<![\w:/.])(?:~|/)(?:[^\s'\"(),;:]+/)*([^\s'\"(),;:/]*)")
_NODE_ID = re.compile(r"\b[0-9a-f]{56}\b")


def _node(m: re.Match[str]) -> str:
    return "node-" + hashlib.sha256(m.group(0).encode()).hexdigest()[:8]


def scrub_text(text: str) -> str:
    """``text`` without absolute paths or Ray node ids."""
    text = _NODE_ID.sub(_node, text)
    return _ABS_PATH.sub(lambda m: m.group(1) or "<path>", text)


def scrub(value: Any) -> Any:
    """A JSON value with every string scrubbed (keys kept)."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
