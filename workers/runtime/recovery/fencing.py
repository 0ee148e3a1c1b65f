"""Fencing: ranks of an old gang cannot write checkpoints or report steps once a newer gang started.

A partitioned node's processes live on. If the node comes back after it was declared lost (the job
has been re-planned onto other nodes meanwhile), its old ranks must not commit a checkpoint into the
job's directory nor hand in a step. Each gang start advances an *epoch* kept in the checkpoint
directory (``.orthoplex-fence``, replaced atomically); every rank learns its gang's epoch at setup
and checks it before each step and each save: a rank whose epoch is older raises :class:`Fenced`
and does nothing. The checkpoint directory is the one thing every rank of every gang of a job
shares (it must be shared storage for resharded restores anyway), so the fence needs no service.
On an object store (``s3://``) the fence is one object, replaced by one PUT.

The check runs before the save starts; a rank that passed it just before a newer gang advanced the
epoch can still finish that one save (the save is a collective of the old gang, so it needs all of
the old gang's ranks alive and connected, which a node declared lost and re-planned around does not
have). Ray fences the node itself as well: a raylet the GCS marked dead exits when it reconnects,
taking its workers with it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from workers import object_store

FENCE_FILE = ".orthoplex-fence"


class Fenced(RuntimeError):
    """This rank belongs to a gang that a newer gang has replaced."""


def _path(checkpoint_dir: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_dir) / FENCE_FILE


def current(checkpoint_dir: str | os.PathLike[str]) -> int:
    """The epoch of the newest gang (0 when none was started)."""
    try:
        if object_store.is_url(checkpoint_dir):
            raw = object_store.read_bytes(object_store.join(str(checkpoint_dir), FENCE_FILE)).decode()
        else:
            raw = _path(checkpoint_dir).read_text()
        return int(json.loads(raw)["epoch"])
    except FileNotFoundError:
        return 0


def advance(checkpoint_dir: str | os.PathLike[str], *, owner: str = "") -> int:
    """Start a new epoch (a new gang); every older epoch is fenced from now on. Returns the epoch."""
    epoch = current(checkpoint_dir) + 1
    body = json.dumps({"epoch": epoch, "owner": owner, "ts": time.time()})
    if object_store.is_url(checkpoint_dir):
        object_store.write_bytes(object_store.join(str(checkpoint_dir), FENCE_FILE), body.encode())
        return epoch
    path = _path(checkpoint_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{FENCE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(body)
    tmp.replace(path)
    return epoch


def check(checkpoint_dir: str | os.PathLike[str], epoch: int, what: str = "write") -> None:
    """Raise :class:`Fenced` unless ``epoch`` is still the newest."""
    now = current(checkpoint_dir)
    if now != epoch:
        raise Fenced(f"fenced: this rank's gang epoch {epoch} is not the current epoch {now}; "
                     f"refusing to {what}")
