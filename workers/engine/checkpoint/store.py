"""The atomic, verified checkpoint store (no torch): layout on disk, commit, verify, retention.

::

    root/step-00000042.tmp-<nonce>/   written by every rank, fsynced
    root/step-00000042/               the same directory after rank 0's commit (rename)
        manifest.json                 written last; sizes + sha256 of every other file
    root/latest                       "step-00000042" (temp + rename; a hint, never trusted alone)

A directory named ``step-N`` (no suffix) exists only after its manifest was fsynced, so a writer
killed at any point leaves either the previous state or a ``.tmp-``/``.del-`` directory that the
loader skips and the next commit removes. ``fault`` hooks (``Callable[[str], None]``) let tests kill
the writer at named points; they are ``None`` in normal use.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.engine.checkpoint.fsutil import fsync_dir, fsync_file, list_files, sha256_file
from workers.engine.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError

log = logging.getLogger("orthoplex.checkpoint")

MIN_KEEP = 2
LATEST_NAME = "latest"
_COMMITTED = re.compile(r"^step-(\d{8,})$")
_TEMPORARY = re.compile(r"^step-(\d{8,})\.(tmp|del)-[0-9A-Za-z]+$")

Fault = Callable[[str], None] | None


class CheckpointCorrupt(Exception):
    """A checkpoint directory failed verification; ``str(exc)`` is the reason."""


def step_dirname(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:08d}"


def _hit(fault: Fault, point: str) -> None:
    if fault is not None:
        fault(point)


@dataclass(frozen=True)
class CheckpointRecord:
    """A committed checkpoint directory; ``manifest`` is None when it could not be read (``problem``)."""

    step: int
    path: Path
    manifest: Manifest | None = None
    problem: str | None = None


@dataclass(frozen=True)
class PendingCheckpoint:
    root: Path
    step: int
    nonce: str

    @property
    def tmp_path(self) -> Path:
        return self.root / f"{step_dirname(self.step)}.tmp-{self.nonce}"

    @property
    def final_path(self) -> Path:
        return self.root / step_dirname(self.step)


# ----------------------------------------------------------------------------- reading


def list_checkpoints(root: str | os.PathLike) -> list[CheckpointRecord]:
    """Committed checkpoints (``step-N`` directories) by ascending step, manifests read, not verified."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for entry in root.iterdir():
        m = _COMMITTED.match(entry.name)
        if not m or not entry.is_dir():
            continue
        try:
            out.append(CheckpointRecord(int(m.group(1)), entry, Manifest.read(entry)))
        except ManifestError as exc:
            out.append(CheckpointRecord(int(m.group(1)), entry, None, str(exc)))
    return sorted(out, key=lambda r: r.step)


def list_temporary(root: str | os.PathLike) -> list[Path]:
    """Uncommitted (``.tmp-``) and half-deleted (``.del-``) checkpoint directories."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _TEMPORARY.match(p.name) and p.is_dir())


def verify_checkpoint(path: str | os.PathLike, *, check_hashes: bool = True) -> Manifest:
    """The manifest of a committed checkpoint whose files all match it; raises ``CheckpointCorrupt``.

    Checks: manifest present, self-checksum, format version, step matches the directory name,
    the set of files equals the manifest's (nothing missing, nothing extra), every size, and (with
    ``check_hashes``) every sha256.
    """
    path = Path(path)
    m = _COMMITTED.match(path.name)
    if not m:
        raise CheckpointCorrupt(f"not a committed checkpoint directory name: {path.name}")
    try:
        manifest = Manifest.read(path)
    except ManifestError as exc:
        raise CheckpointCorrupt(str(exc)) from exc
    if manifest.step != int(m.group(1)):
        raise CheckpointCorrupt(f"manifest step {manifest.step} != directory step {int(m.group(1))}")
    on_disk = set(list_files(path)) - {MANIFEST_NAME}
    missing = sorted(set(manifest.files) - on_disk)
    if missing:
        raise CheckpointCorrupt(f"missing file {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1
                                                                  else ""))
    unexpected = sorted(on_disk - set(manifest.files))
    if unexpected:
        raise CheckpointCorrupt(f"unexpected file {unexpected[0]} not in the manifest")
    for name, entry in sorted(manifest.files.items()):
        size = (path / name).stat().st_size
        if size != entry.bytes:
            raise CheckpointCorrupt(f"size of {name} is {size} bytes, manifest says {entry.bytes} (truncated?)")
    if check_hashes:
        for name, entry in sorted(manifest.files.items()):
            if sha256_file(path / name) != entry.sha256:
                raise CheckpointCorrupt(f"sha256 of {name} does not match the manifest (corrupted)")
    return manifest


def read_latest_pointer(root: str | os.PathLike) -> str | None:
    try:
        return (Path(root) / LATEST_NAME).read_text().strip() or None
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
        kind = "uncommitted temporary directory (writer stopped before the commit rename)" \
            if ".tmp-" in tmp.name else "half-deleted directory (retention was interrupted)"
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
    if chosen is not None and pointer not in (None, chosen.path.name):
        log.warning("'latest' points at %s but the newest verified checkpoint is %s", pointer, chosen.path.name)
    return chosen, skipped


# ----------------------------------------------------------------------------- writing


def new_nonce() -> str:
    return secrets.token_hex(6)


def begin_checkpoint(root: str | os.PathLike, step: int, nonce: str | None = None) -> PendingCheckpoint:
    """Create ``root/step-N.tmp-<nonce>/`` (every rank may call it; the nonce must be the same)."""
    pending = PendingCheckpoint(Path(root), int(step), nonce or new_nonce())
    pending.tmp_path.mkdir(parents=True, exist_ok=True)
    return pending


def hash_files(base: Path, names: list[str]) -> dict[str, FileEntry]:
    """Size and sha256 of ``names`` (relative to ``base``), fsyncing each first."""
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
    """Rank 0, after every rank has written and fsynced its files: manifest, rename, ``latest``,
    retention, garbage collection. ``files`` are the entries the ranks hashed (all files are hashed
    here when None); they must cover exactly the files in the directory."""
    tmp = pending.tmp_path
    on_disk = [n for n in list_files(tmp) if n != MANIFEST_NAME]
    if files is None:
        files = hash_files(tmp, on_disk)
    elif set(files) != set(on_disk):
        raise RuntimeError(f"checkpoint {tmp}: files on disk {sorted(set(on_disk) ^ set(files))} differ from "
                           "what the ranks reported")
    _fsync_tree(tmp)
    manifest = Manifest(step=pending.step, world_size=world_size, files=files, layout=layout, plan=plan,
                        data=data, rng=rng, extra=dict(extra or {}), nonce=pending.nonce)
    _hit(fault, "manifest:before")
    with open(tmp / MANIFEST_NAME, "wb") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    _hit(fault, "manifest:written")
    final = pending.final_path
    if final.exists():  # the same step saved again (e.g. after a resume): the new one replaces it
        aside = final.with_name(f"{final.name}.del-{pending.nonce}")
        os.rename(final, aside)
        os.rename(tmp, final)
        fsync_dir(pending.root)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _hit(fault, "rename:done")
    fsync_dir(pending.root)
    write_latest(pending.root, final.name, fault)
    apply_retention(pending.root, keep, protect=final, fault=fault)
    gc_temporary(pending.root)
    return manifest


def apply_retention(root: str | os.PathLike, keep: int, *, protect: Path | None = None, fault: Fault = None,
                    check_hashes: bool = True) -> list[tuple[str, str]]:
    """Keep the newest ``max(keep, 2)`` verified checkpoints; delete older verified ones and damaged
    ones older than the newest verified. The newest verified checkpoint is never deleted; damaged
    ones newer than every verified one are left for inspection. With ``protect`` (the checkpoint just
    committed, already verified), checkpoints of a higher step belong to an abandoned run (the
    loader skipped them) and are deleted too. Returns ``(path, reason)`` deleted."""
    keep = max(int(keep), MIN_KEEP)
    kept = 0
    deleted: list[tuple[str, str]] = []
    protect_step = int(_COMMITTED.match(protect.name).group(1)) if protect is not None else None
    for rec in reversed(list_checkpoints(root)):
        if protect_step is not None and rec.step > protect_step:
            ok, why = False, "newer than the checkpoint just committed (a run that was abandoned)"
        elif protect is not None and rec.path == protect:
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
        aside = rec.path.with_name(f"{rec.path.name}.del-{uuid.uuid4().hex[:8]}")
        os.rename(rec.path, aside)
        _hit(fault, "retention:renamed")
        shutil.rmtree(aside, ignore_errors=True)
        log.info("deleted checkpoint %s (%s)", rec.path, reason)
        deleted.append((str(rec.path), reason))
    if deleted:
        fsync_dir(Path(root))
    return deleted


def gc_temporary(root: str | os.PathLike, *, exclude: set[Path] | frozenset[Path] = frozenset()) -> list[Path]:
    """Remove stale ``.tmp-``/``.del-`` checkpoint directories and ``latest.tmp-`` files.

    Call it only when no other save into ``root`` is in flight (the commit does, after its rename).
    """
    root = Path(root)
    removed = []
    for p in list_temporary(root):
        if p not in exclude:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if root.is_dir():
        for p in root.glob(f"{LATEST_NAME}.tmp-*"):
            p.unlink(missing_ok=True)
            removed.append(p)
    for p in removed:
        log.info("removed stale %s", p)
    return removed
