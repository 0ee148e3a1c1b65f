"""What the checkpoint store hands around, on a filesystem and on an object store alike: records,
pending saves, the naming of step directories, fault hooks. No I/O here."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers import object_store
from workers.engine.checkpoint.manifest import Manifest

MIN_KEEP = 2
LATEST_NAME = "latest"
#: a committed checkpoint directory on a filesystem
COMMITTED = re.compile(r"^step-(\d{8,})$")
#: an uncommitted (``.tmp-``) or half-deleted (``.del-``) directory on a filesystem
TEMPORARY = re.compile(r"^step-(\d{8,})\.(tmp|del)-[0-9A-Za-z]+$")
#: a checkpoint prefix on an object store: committed once its manifest (the commit marker) exists
OBJECT = re.compile(r"^step-(\d{8,})\.ckpt-([0-9A-Za-z]+)$")

Fault = Callable[[str], None] | None
#: a checkpoint root or directory: a local path, or an object-store URL (``s3://bucket/prefix``)
Location = Path | str


class CheckpointCorrupt(Exception):
    """A checkpoint directory failed verification; ``str(exc)`` is the reason."""


def step_dirname(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:08d}"


def hit(fault: Fault, point: str) -> None:
    if fault is not None:
        fault(point)


def as_location(root: str | os.PathLike[str]) -> Location:
    """An object-store URL (normalised) stays a string; anything else is a local ``Path``."""
    if object_store.is_url(root):
        return object_store.check_url(str(root))
    return Path(root)


def is_remote(loc: Location) -> bool:
    return isinstance(loc, str)


def loc_name(loc: Location) -> str:
    return object_store.name(loc) if isinstance(loc, str) else loc.name


def loc_join(loc: Location, name: str) -> Location:
    return object_store.join(loc, name) if isinstance(loc, str) else loc / name


def step_of(loc: Location) -> int:
    """The step a checkpoint directory (committed, either kind) holds."""
    m = COMMITTED.match(loc_name(loc)) or OBJECT.match(loc_name(loc))
    if not m:
        raise ValueError(f"not a checkpoint directory name: {loc_name(loc)}")
    return int(m.group(1))


@dataclass(frozen=True)
class CheckpointRecord:
    """A committed checkpoint directory; ``manifest`` is None when it could not be read (``problem``)."""

    step: int
    path: Location
    manifest: Manifest | None = None
    problem: str | None = None


@dataclass(frozen=True)
class PendingCheckpoint:
    """A save in progress. On a filesystem the ranks write ``step-N.tmp-<nonce>/`` and the commit
    renames it to ``step-N/``; on an object store (no atomic rename) they write ``step-N.ckpt-<nonce>/``
    and the commit writes its manifest there last: both paths are that one prefix."""

    root: Location
    step: int
    nonce: str

    @property
    def tmp_path(self) -> Location:
        if is_remote(self.root):
            return loc_join(self.root, f"{step_dirname(self.step)}.ckpt-{self.nonce}")
        return loc_join(self.root, f"{step_dirname(self.step)}.tmp-{self.nonce}")

    @property
    def final_path(self) -> Location:
        if is_remote(self.root):
            return self.tmp_path
        return loc_join(self.root, step_dirname(self.step))
