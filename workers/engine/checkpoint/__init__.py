"""Checkpoints: an atomic, verified store (``store``, no torch) and the DCP save/load on top of it.

The torch-dependent names (``save_checkpoint``, ``load_latest``, ``Checkpointer``,
``ModelOptimizerState``, ...) are imported lazily, so ``workers.engine.checkpoint.store`` can be used
(e.g. by tooling that only lists or verifies checkpoints) without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from workers.engine.checkpoint.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
)
from workers.engine.checkpoint.store import (
    CheckpointCorrupt,
    CheckpointRecord,
    PendingCheckpoint,
    apply_retention,
    begin_checkpoint,
    commit_checkpoint,
    find_latest_verified,
    gc_temporary,
    list_checkpoints,
    read_latest_pointer,
    step_dirname,
    verify_checkpoint,
)

_LAZY = {
    "CheckpointError": "workers.engine.checkpoint.dcp_io",
    "CheckpointInfo": "workers.engine.checkpoint.dcp_io",
    "Checkpointer": "workers.engine.checkpoint.dcp_io",
    "LoadResult": "workers.engine.checkpoint.dcp_io",
    "load_latest": "workers.engine.checkpoint.dcp_io",
    "save_checkpoint": "workers.engine.checkpoint.dcp_io",
    "ModelOptimizerState": "workers.engine.checkpoint.state",
    "capture_rng_state": "workers.engine.checkpoint.rng",
    "restore_rng_state": "workers.engine.checkpoint.rng",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CheckpointCorrupt",
    "CheckpointRecord",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "PendingCheckpoint",
    "apply_retention",
    "begin_checkpoint",
    "commit_checkpoint",
    "find_latest_verified",
    "gc_temporary",
    "list_checkpoints",
    "read_latest_pointer",
    "step_dirname",
    "verify_checkpoint",
    *_LAZY,
]
