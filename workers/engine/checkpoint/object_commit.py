"""The checkpoint store on an object store (``s3://``, ``gs://``): no rename, so the marker commits.

::

    root/step-00000042.ckpt-<nonce>/   every rank's DCP files, then rank 0's ``.metadata``
        manifest.json                  the commit marker: written last, in one PUT, by rank 0
    root/latest                        "step-00000042.ckpt-<nonce>" (one PUT; a hint, never trusted alone)

A prefix is a checkpoint only once its ``manifest.json`` exists, and a PUT makes an object appear
whole or not at all: a writer stopped anywhere before the marker leaves a prefix that no listing
reports as committed (the loader skips it, the next commit removes it). Deleting goes the other way:
the marker first (the checkpoint vanishes at once), then its files. The same step saved twice (after
a resume) gives two prefixes; the newer manifest wins and the commit deletes the older one.
"""

from __future__ import annotations

import json
import logging

from workers import object_store as obj
from workers.engine.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError
from workers.engine.checkpoint.records import (
    LATEST_NAME,
    OBJECT,
    CheckpointCorrupt,
    CheckpointRecord,
    Fault,
    PendingCheckpoint,
    hit,
)

log = logging.getLogger("orthoplex.checkpoint")


def read_manifest(prefix: str) -> Manifest:
    """The manifest under ``prefix``; :class:`ManifestError` when it is missing or damaged."""
    try:
        raw = obj.read_bytes(obj.join(prefix, MANIFEST_NAME))
    except FileNotFoundError as exc:
        raise ManifestError(f"no {MANIFEST_NAME}") from exc
    except OSError as exc:
        raise ManifestError(f"{MANIFEST_NAME} unreadable ({exc})") from exc
    try:
        return Manifest.from_dict(json.loads(raw))
    except ValueError as exc:
        raise ManifestError(f"{MANIFEST_NAME} unreadable ({exc})") from exc


def _prefixes(root: str) -> list[tuple[int, str, bool]]:
    """``(step, prefix URL, has a marker)`` for every checkpoint prefix under ``root``."""
    out = []
    for name, is_dir in obj.listdir(root):
        m = OBJECT.match(name)
        if m and is_dir:
            prefix = obj.join(root, name)
            out.append((int(m.group(1)), prefix, obj.exists(obj.join(prefix, MANIFEST_NAME))))
    return out


def list_checkpoints(root: str) -> list[CheckpointRecord]:
    """Committed checkpoints (a marker exists) by step, then by save time; manifests read, not verified."""
    out = []
    for step, prefix, marked in _prefixes(root):
        if not marked:
            continue
        try:
            out.append(CheckpointRecord(step, prefix, read_manifest(prefix)))
        except ManifestError as exc:
            out.append(CheckpointRecord(step, prefix, None, str(exc)))
    return sorted(out, key=lambda r: (r.step, r.manifest.created_at if r.manifest else 0.0))


def list_uncommitted(root: str) -> list[str]:
    """Checkpoint prefixes without a marker: a save stopped (or still running) before its commit."""
    return sorted(prefix for _, prefix, marked in _prefixes(root) if not marked)


def verify(prefix: str, manifest: Manifest, check_hashes: bool) -> None:
    """The objects under ``prefix`` are exactly the manifest's, of its sizes (and sha256)."""
    present = obj.find(prefix)
    present.pop(MANIFEST_NAME, None)
    missing = sorted(set(manifest.files) - set(present))
    if missing:
        raise CheckpointCorrupt(f"missing file {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1
                                                                  else ""))
    unexpected = sorted(set(present) - set(manifest.files))
    if unexpected:
        raise CheckpointCorrupt(f"unexpected file {unexpected[0]} not in the manifest")
    for name, entry in sorted(manifest.files.items()):
        if present[name] != entry.bytes:
            raise CheckpointCorrupt(f"size of {name} is {present[name]} bytes, manifest says {entry.bytes} "
                                    "(truncated?)")
    if check_hashes:
        for name, entry in sorted(manifest.files.items()):
            if obj.sha256(obj.join(prefix, name)) != entry.sha256:
                raise CheckpointCorrupt(f"sha256 of {name} does not match the manifest (corrupted)")


def list_files(prefix: str) -> list[str]:
    return sorted(obj.find(prefix))


def hash_files(prefix: str, names: list[str]) -> dict[str, FileEntry]:
    """Size and sha256 of ``names`` under ``prefix``, each read back from the store."""
    return {n: FileEntry(obj.size(obj.join(prefix, n)), obj.sha256(obj.join(prefix, n))) for n in names}


def read_latest_pointer(root: str) -> str | None:
    try:
        return obj.read_bytes(obj.join(root, LATEST_NAME)).decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def commit(pending: PendingCheckpoint, manifest: Manifest, fault: Fault) -> None:
    """Write the marker (the commit), then the ``latest`` hint; older saves of the same step go."""
    prefix = str(pending.final_path)
    hit(fault, "manifest:before")
    obj.write_bytes(obj.join(prefix, MANIFEST_NAME), manifest.to_json())
    hit(fault, "manifest:written")
    for rec in list_checkpoints(str(pending.root)):
        if rec.step == pending.step and rec.path != prefix:
            discard(str(rec.path))
            log.info("deleted checkpoint %s (superseded by %s of the same step)", rec.path, prefix)
    hit(fault, "rename:done")
    obj.write_bytes(obj.join(str(pending.root), LATEST_NAME), (obj.name(prefix) + "\n").encode())


def discard(prefix: str, fault: Fault = None) -> None:
    """Delete a checkpoint: its marker first (invisible from then on), then its files."""
    obj.remove(obj.join(prefix, MANIFEST_NAME))
    hit(fault, "retention:renamed")
    obj.remove_tree(prefix)


def gc(root: str, exclude: set[str] | frozenset[str]) -> list[str]:
    removed = [p for p in list_uncommitted(root) if p not in exclude]
    for p in removed:
        obj.remove_tree(p)
    return removed
