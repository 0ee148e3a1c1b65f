"""The atomic, verified checkpoint store (no torch): layout, commit, verify, retention.

On a filesystem::

    root/step-00000042.tmp-<nonce>/   written by every rank, fsynced
    root/step-00000042/               the same directory after rank 0's commit (rename)
        manifest.json                 written last; sizes + sha256 of every other file
    root/latest                       "step-00000042" (temp + rename; a hint, never trusted alone)

A directory named ``step-N`` (no suffix) exists only after its manifest was fsynced, so a writer
killed at any point leaves either the previous state or a ``.tmp-``/``.del-`` directory that the
loader skips and the next commit removes. On an object store (``root`` an ``s3://``/``gs://`` URL)
there is no rename: the manifest written last is the commit marker (``object_commit``). ``fault``
hooks (``Callable[[str], None]``) let tests kill the writer at named points; they are ``None`` in
normal use.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import uuid
from pathlib import Path
from typing import Any

from workers.engine.checkpoint import object_commit as remote
from workers.engine.checkpoint.fsutil import fsync_dir, fsync_file, list_files, sha256_file
from workers.engine.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError
from workers.engine.checkpoint.records import (
    COMMITTED as _COMMITTED,
)
from workers.engine.checkpoint.records import (
    LATEST_NAME,
    MIN_KEEP,
    OBJECT,
    CheckpointCorrupt,
    CheckpointRecord,
    Fault,
    Location,
    PendingCheckpoint,
    as_location,
    hit,
    is_remote,
    loc_name,
    step_dirname,
    step_of,
)
from workers.engine.checkpoint.records import (
    TEMPORARY as _TEMPORARY,
)

log = logging.getLogger("orthoplex.checkpoint")

__all__ = ["LATEST_NAME", "MIN_KEEP", "CheckpointCorrupt", "CheckpointRecord", "Fault", "PendingCheckpoint",
           "apply_retention", "begin_checkpoint", "commit_checkpoint", "find_latest_verified", "gc_temporary",
           "hash_files", "list_checkpoints", "list_files_at", "list_temporary", "new_nonce", "read_latest_pointer",
           "step_dirname", "verify_checkpoint", "write_latest"]

_hit = hit


# ----------------------------------------------------------------------------- reading


def list_checkpoints(root: str | os.PathLike) -> list[CheckpointRecord]:
    """Committed checkpoints by ascending step (then save time), manifests read, not verified: ``step-N``
    directories on a filesystem, prefixes with a commit marker on an object store."""
    loc = as_location(root)
    if isinstance(loc, str):
        return remote.list_checkpoints(loc)
    if not loc.is_dir():
        return []
    out = []
    for entry in loc.iterdir():
        m = _COMMITTED.match(entry.name)
        if not m or not entry.is_dir():
            continue
        try:
            out.append(CheckpointRecord(int(m.group(1)), entry, Manifest.read(entry)))
        except ManifestError as exc:
            out.append(CheckpointRecord(int(m.group(1)), entry, None, str(exc)))
    return sorted(out, key=lambda r: r.step)


def list_temporary(root: str | os.PathLike) -> list[Location]:
    """Uncommitted (``.tmp-``; on an object store: no marker) and half-deleted (``.del-``) directories."""
    loc = as_location(root)
    if isinstance(loc, str):
        return list(remote.list_uncommitted(loc))
    if not loc.is_dir():
        return []
    return sorted(p for p in loc.iterdir() if _TEMPORARY.match(p.name) and p.is_dir())


def list_files_at(path: Location) -> list[str]:
    """Every file under a checkpoint directory, as a sorted relative POSIX path."""
    return remote.list_files(path) if isinstance(path, str) else list_files(path)


def verify_checkpoint(path: str | os.PathLike, *, check_hashes: bool = True) -> Manifest:
    """The manifest of a committed checkpoint whose files all match it; raises ``CheckpointCorrupt``.

    Checks: manifest present, self-checksum, format version, step matches the directory name,
    the set of files equals the manifest's (nothing missing, nothing extra), every size, and (with
    ``check_hashes``) every sha256.
    """
    loc = as_location(path)
    m = (OBJECT if isinstance(loc, str) else _COMMITTED).match(loc_name(loc))
    if not m:
        raise CheckpointCorrupt(f"not a committed checkpoint directory name: {loc_name(loc)}")
    try:
        manifest = remote.read_manifest(loc) if isinstance(loc, str) else Manifest.read(loc)
    except ManifestError as exc:
        raise CheckpointCorrupt(str(exc)) from exc
    if manifest.step != int(m.group(1)):
        raise CheckpointCorrupt(f"manifest step {manifest.step} != directory step {int(m.group(1))}")
    if isinstance(loc, str):
        remote.verify(loc, manifest, check_hashes)
        return manifest
    on_disk = set(list_files(loc)) - {MANIFEST_NAME}
    missing = sorted(set(manifest.files) - on_disk)
    if missing:
        raise CheckpointCorrupt(f"missing file {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1
                                                                  else ""))
    unexpected = sorted(on_disk - set(manifest.files))
    if unexpected:
        raise CheckpointCorrupt(f"unexpected file {unexpected[0]} not in the manifest")
    for name, entry in sorted(manifest.files.items()):
        size = (loc / name).stat().st_size
        if size != entry.bytes:
            raise CheckpointCorrupt(f"size of {name} is {size} bytes, manifest says {entry.bytes} (truncated?)")
    if check_hashes:
        for name, entry in sorted(manifest.files.items()):
            if sha256_file(loc / name) != entry.sha256:
                raise CheckpointCorrupt(f"sha256 of {name} does not match the manifest (corrupted)")
    return manifest


def read_latest_pointer(root: str | os.PathLike) -> str | None:
    loc = as_location(root)
    if isinstance(loc, str):
        return remote.read_latest_pointer(loc)
    try:
        return (loc / LATEST_NAME).read_text().strip() or None
    except OSError:
        return None


def find_latest_verified(root: str | os.PathLike, *, check_hashes: bool = True
                         ) -> tuple[CheckpointRecord | None, list[tuple[str, str]]]:
    """The newest checkpoint that verifies, and every ``(path, reason)`` skipped on the way.

    Temporary/half-deleted directories are always reported as skipped (torn writes). The ``latest``
    pointer is only compared, never trusted: the directories are the truth.
    """
    skipped: list[tuple[str, str]] = []
    for tmp in list_temporary(root):
        if is_remote(tmp):
            kind = "uncommitted: no commit marker (writer stopped before its manifest was written)"
        elif ".tmp-" in loc_name(tmp):
            kind = "uncommitted temporary directory (writer stopped before the commit rename)"
        else:
            kind = "half-deleted directory (retention was interrupted)"
        skipped.append((str(tmp), kind))
    chosen: CheckpointRecord | None = None
    for rec in reversed(list_checkpoints(root)):
        try:
            manifest = verify_checkpoint(rec.path, check_hashes=check_hashes)
        except (CheckpointCorrupt, OSError) as exc:
            skipped.append((str(rec.path), str(exc)))
            continue
        chosen = CheckpointRecord(rec.step, rec.path, manifest)
        break
    for path, reason in skipped:
        log.warning("skipping checkpoint %s: %s", path, reason)
    pointer = read_latest_pointer(root)
    if chosen is not None and pointer not in (None, loc_name(chosen.path)):
        log.warning("'latest' points at %s but the newest verified checkpoint is %s", pointer, loc_name(chosen.path))
    return chosen, skipped


# ----------------------------------------------------------------------------- writing


def new_nonce() -> str:
    return secrets.token_hex(6)


def begin_checkpoint(root: str | os.PathLike, step: int, nonce: str | None = None) -> PendingCheckpoint:
    """Start a save of ``step`` under ``root`` (every rank may call it; the nonce must be the same):
    ``root/step-N.tmp-<nonce>/`` created on a filesystem; nothing to create on an object store."""
    pending = PendingCheckpoint(as_location(root), int(step), nonce or new_nonce())
    if not is_remote(pending.root):
        Path(pending.tmp_path).mkdir(parents=True, exist_ok=True)
    return pending


def hash_files(base: Location, names: list[str]) -> dict[str, FileEntry]:
    """Size and sha256 of ``names`` (relative to ``base``), fsyncing each first on a filesystem."""
    if isinstance(base, str):
        return remote.hash_files(base, names)
    out = {}
    for name in names:
        fsync_file(base / name)
        out[name] = FileEntry((base / name).stat().st_size, sha256_file(base / name))
    return out


def _fsync_tree(base: Path) -> None:
    for dirpath, _, _ in os.walk(base):
        fsync_dir(dirpath)


def write_latest(root: Path, name: str, fault: Fault = None) -> None:
    tmp = root / f"{LATEST_NAME}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    _hit(fault, "latest:tmp-written")
    os.replace(tmp, root / LATEST_NAME)
    fsync_dir(root)


def commit_checkpoint(pending: PendingCheckpoint, *, world_size: int, files: dict[str, FileEntry] | None = None,
                      layout: Any = None, plan: Any = None, data: Any = None, rng: Any = None,
                      extra: dict[str, Any] | None = None, keep: int = MIN_KEEP, fault: Fault = None) -> Manifest:
    """Rank 0, after every rank has written (and fsynced) its files: manifest, rename (a filesystem)
    or marker (an object store), ``latest``, retention, garbage collection. ``files`` are the entries
    the ranks hashed (all files are hashed here when None); they must cover exactly the files there."""
    tmp = pending.tmp_path
    on_disk = [n for n in list_files_at(tmp) if n != MANIFEST_NAME]
    if files is None:
        files = hash_files(tmp, on_disk)
    elif set(files) != set(on_disk):
        raise RuntimeError(f"checkpoint {tmp}: files on disk {sorted(set(on_disk) ^ set(files))} differ from "
                           "what the ranks reported")
    manifest = Manifest(step=pending.step, world_size=world_size, files=files, layout=layout, plan=plan,
                        data=data, rng=rng, extra=dict(extra or {}), nonce=pending.nonce)
    if isinstance(tmp, str):
        remote.commit(pending, manifest, fault)
    else:
        _commit_rename(pending, tmp, manifest, fault)
    apply_retention(pending.root, keep, protect=pending.final_path, fault=fault)
    gc_temporary(pending.root)
    return manifest


def _commit_rename(pending: PendingCheckpoint, tmp: Path, manifest: Manifest, fault: Fault) -> None:
    root, final = Path(pending.root), Path(pending.final_path)
    _fsync_tree(tmp)
    _hit(fault, "manifest:before")
    with open(tmp / MANIFEST_NAME, "wb") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    _hit(fault, "manifest:written")
    if final.exists():  # the same step saved again (e.g. after a resume): the new one replaces it
        aside = final.with_name(f"{final.name}.del-{pending.nonce}")
        os.rename(final, aside)
        os.rename(tmp, final)
        fsync_dir(root)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _hit(fault, "rename:done")
    fsync_dir(root)
    write_latest(root, final.name, fault)


def apply_retention(root: str | os.PathLike, keep: int, *, protect: Location | None = None, fault: Fault = None,
                    check_hashes: bool = True) -> list[tuple[str, str]]:
    """Keep the newest ``max(keep, 2)`` verified checkpoints; delete older verified ones and damaged
    ones older than the newest verified. The newest verified checkpoint is never deleted; damaged
    ones newer than every verified one are left for inspection. With ``protect`` (the checkpoint just
    committed, already verified), checkpoints of a higher step belong to an abandoned run (the
    loader skipped them) and are deleted too. Returns ``(path, reason)`` deleted."""
    keep = max(int(keep), MIN_KEEP)
    kept = 0
    deleted: list[tuple[str, str]] = []
    protect_step = step_of(protect) if protect is not None else None
    for rec in reversed(list_checkpoints(root)):
        if protect_step is not None and rec.step > protect_step:
            ok, why = False, "newer than the checkpoint just committed (a run that was abandoned)"
        elif protect is not None and str(rec.path) == str(protect):
            ok, why = True, ""
        else:
            try:
                verify_checkpoint(rec.path, check_hashes=check_hashes)
                ok, why = True, ""
            except (CheckpointCorrupt, OSError) as exc:
                ok, why = False, str(exc)
        if ok and kept < keep:
            kept += 1
            continue
        if not ok and kept == 0 and protect_step is None:
            continue
        reason = f"retention: older than the newest {keep} verified" if ok else f"failed verification: {why}"
        if isinstance(rec.path, str):
            remote.discard(rec.path, fault)
        else:
            aside = rec.path.with_name(f"{rec.path.name}.del-{uuid.uuid4().hex[:8]}")
            os.rename(rec.path, aside)
            _hit(fault, "retention:renamed")
            shutil.rmtree(aside, ignore_errors=True)
        log.info("deleted checkpoint %s (%s)", rec.path, reason)
        deleted.append((str(rec.path), reason))
    loc = as_location(root)
    if deleted and not isinstance(loc, str):
        fsync_dir(loc)
    return deleted


def gc_temporary(root: str | os.PathLike, *, exclude: set[Any] | frozenset[Any] = frozenset()) -> list[Location]:
    """Remove stale ``.tmp-``/``.del-`` checkpoint directories and ``latest.tmp-`` files (on an object
    store: prefixes without a marker).

    Call it only when no other save into ``root`` is in flight (the commit does, after its rename).
    """
    loc = as_location(root)
    if isinstance(loc, str):
        removed_remote: list[Location] = list(remote.gc(loc, frozenset(str(p) for p in exclude)))
        for p in removed_remote:
            log.info("removed stale %s", p)
        return removed_remote
    removed: list[Location] = []
    for p in list_temporary(loc):
        if p not in exclude:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if loc.is_dir():
        for p in loc.glob(f"{LATEST_NAME}.tmp-*"):
            p.unlink(missing_ok=True)
            removed.append(p)
    for p in removed:
        log.info("removed stale %s", p)
    return removed
