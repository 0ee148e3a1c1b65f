"""Save/load through ``torch.distributed.checkpoint`` (DCP) on top of the atomic store.

Save (collective over ``group``; every rank):
  1. rank 0 picks a nonce, broadcast; every rank writes its DCP shard into
     ``step-N.tmp-<nonce>/`` (``FileSystemWriter(sync_files=True)``: each file fsynced; DCP's final
     gather makes it a barrier, rank 0 writes DCP's ``.metadata``);
  2. the files are hashed in parallel (file ``k`` by rank ``k % world``), gathered on rank 0;
  3. rank 0 commits (manifest, fsync, rename, ``latest``, retention, GC) and broadcasts the result,
     so every rank returns the same ``CheckpointInfo`` or raises the same error.
On an object store (``root`` an ``s3://`` URL) step 1 writes through DCP's ``FsspecWriter`` into
``step-N.ckpt-<nonce>/`` and the commit writes the manifest there last (the commit marker, see
``object_commit``); the load reads through ``FsspecReader``, resharding the same way.
With ``async_save`` step 1 stages a CPU copy (``dcp.async_save``) and returns; the write, the hashing
and the commit run on a background thread over a process group used only for checkpoints.

Load: rank 0 finds the newest verified checkpoint (sha256 of every file), broadcasts the choice,
every rank ``dcp.load``s it into its own sharding (DCP reshards), so all ranks agree.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed import ProcessGroup
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.stateful import Stateful

from workers import object_store
from workers.engine.checkpoint import _dist
from workers.engine.checkpoint.manifest import MANIFEST_NAME, Manifest, to_jsonable
from workers.engine.checkpoint.records import Location, as_location
from workers.engine.checkpoint.rng import capture_rng_state
from workers.engine.checkpoint.store import (
    MIN_KEEP,
    Fault,
    PendingCheckpoint,
    begin_checkpoint,
    commit_checkpoint,
    find_latest_verified,
    hash_files,
    list_files_at,
    new_nonce,
)

log = logging.getLogger("orthoplex.checkpoint")
APP_KEY = "app"
_LIFTED = ("layout", "plan", "data", "rng")


class CheckpointError(RuntimeError):
    """A save failed on some rank (raised on every rank)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A save. For an async save as returned by ``save``: ``committed=False``, ``seconds`` is the time
    the caller was blocked (staging), ``bytes`` 0; ``wait()`` gives the committed info (``seconds``
    from the call to the commit, ``bytes`` the checkpoint's total size)."""

    step: int
    path: str
    seconds: float
    bytes: int
    committed: bool = True
    pending: Future | None = field(default=None, compare=False, repr=False)

    def wait(self) -> CheckpointInfo:
        return self.pending.result() if self.pending is not None else self


@dataclass(frozen=True)
class LoadResult:
    step: int
    path: str
    manifest: Manifest
    skipped: list[tuple[str, str]]
    seconds: float = 0.0


def writer_for(path: Location) -> dcp.FileSystemWriter:
    """DCP's writer of a checkpoint directory: files fsynced on a filesystem; through fsspec on an
    object store (``FsspecWriter``: each file one object, complete when its upload ends; no fsync)."""
    if isinstance(path, str):
        return FsspecWriter(path, single_file_per_rank=True, sync_files=False, thread_count=1,
                            **object_store.storage_options())
    return dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1)


def reader_for(path: Location) -> dcp.FileSystemReader:
    """DCP's reader of a checkpoint directory (``FsspecReader`` on an object store)."""
    if isinstance(path, str):
        return FsspecReader(path, **object_store.storage_options())
    return dcp.FileSystemReader(path)


def _manifest_fields(manifest_extra: dict[str, Any] | None) -> dict[str, Any]:
    extra = dict(manifest_extra or {})
    fields = {k: extra.pop(k, None) for k in _LIFTED}
    if fields["rng"] is None:
        fields["rng"] = capture_rng_state()
    fields["extra"] = extra
    return to_jsonable(fields)  # fail now, on the caller's thread, if something is not JSON


class Checkpointer:
    """Saves and loads checkpoints of one run under ``root``; holds at most one async save in flight.

    Construct it on every rank of ``group`` at the same point (with ``async_save=True`` and a process
    group it creates a gloo group for the background work, which is collective over the default group).
    ``rank``/``world_size`` are this process's rank and size in ``group`` (checked against it).
    """

    def __init__(self, root: str | os.PathLike, *, rank: int | None = None, world_size: int | None = None,
                 keep: int = MIN_KEEP, group: ProcessGroup | None = None, async_save: bool = False,
                 async_group: ProcessGroup | None = None, timeout_s: float = 600.0) -> None:
        self.root = as_location(root)
        self.group = group
        self.rank, self.world_size = _dist.rank_and_size(group)
        if (rank is not None and rank != self.rank) or (world_size is not None and world_size != self.world_size):
            raise ValueError(f"Checkpointer given rank={rank} world_size={world_size}, but the process group says "
                             f"rank={self.rank} world_size={self.world_size}")
        if keep < MIN_KEEP:
            log.warning("keep=%d raised to %d: the newest checkpoint may be torn, so two are always kept", keep,
                        MIN_KEEP)
        self.keep = max(int(keep), MIN_KEEP)
        self._own_async_group = False
        self.async_group = async_group
        # also with one rank: DCP's async_save needs a process group with a CPU backend, and a job's
        # default group on GPUs is NCCL only (found by the gpu tier: "A CPU backend must be enabled")
        if async_save and async_group is None and _dist.active():
            ranks = dist.get_process_group_ranks(group) if group is not None else None
            self.async_group = dist.new_group(ranks=ranks, backend="gloo", timeout=timedelta(seconds=timeout_s))
            self._own_async_group = True
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    # ------------------------------------------------------------------ save

    def save(self, step: int, app_state: Stateful, *, manifest_extra: dict[str, Any] | None = None,
             async_save: bool = False, _fault: Fault = None) -> CheckpointInfo:
        """Checkpoint ``app_state`` as step ``step`` (collective). ``manifest_extra`` keys ``layout``,
        ``plan``, ``data`` (data position) and ``rng`` become manifest fields (``rng`` defaults to this
        process's RNG states); the rest goes to the manifest's ``extra``."""
        self.wait()
        t0 = time.perf_counter()
        fields = _manifest_fields(manifest_extra) if self.rank == 0 else {}
        if async_save:
            return self._save_async(step, app_state, fields, t0, _fault)
        pending = self._begin(step, self.group)
        dcp.save({APP_KEY: app_state}, storage_writer=self._writer(pending), process_group=self.group,
                 no_dist=not _dist.active())
        if _fault is not None:
            _fault("dcp:written")
        total = self._commit(pending, fields, self.group, _fault)
        return CheckpointInfo(step, str(pending.final_path), time.perf_counter() - t0, total)

    def _save_async(self, step: int, app_state: Stateful, fields: dict[str, Any], t0: float,
                    fault: Fault) -> CheckpointInfo:
        group = self.async_group
        if _dist.active() and self.world_size > 1 and group is None:
            raise ValueError("async_save with several ranks needs a process group used only for checkpoints "
                             "(Checkpointer(..., async_save=True) creates one)")
        pending = self._begin(step, group)
        upload = dcp.async_save({APP_KEY: app_state}, storage_writer=self._writer(pending), process_group=group,
                                no_dist=not _dist.active())
        blocked = time.perf_counter() - t0

        def finish() -> CheckpointInfo:
            upload.result()
            if fault is not None:
                fault("dcp:written")
            total = self._commit(pending, fields, group, fault)
            return CheckpointInfo(step, str(pending.final_path), time.perf_counter() - t0, total)

        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orthoplex-ckpt")
        self._pending = self._executor.submit(finish)
        return CheckpointInfo(step, str(pending.final_path), blocked, 0, committed=False, pending=self._pending)

    def wait(self) -> CheckpointInfo | None:
        """Block until the async save in flight (if any) is committed; re-raises its error."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def _begin(self, step: int, group: ProcessGroup | None) -> PendingCheckpoint:
        nonce = _dist.broadcast(new_nonce() if self.rank == 0 else None, group)
        return begin_checkpoint(self.root, step, nonce)

    @staticmethod
    def _writer(pending: PendingCheckpoint) -> dcp.FileSystemWriter:
        return writer_for(pending.tmp_path)

    def _commit(self, pending: PendingCheckpoint, fields: dict[str, Any], group: ProcessGroup | None,
                fault: Fault) -> int:
        listing: Any = None
        if self.rank == 0:
            try:
                listing = [n for n in list_files_at(pending.tmp_path) if n != MANIFEST_NAME]
            except OSError as exc:
                listing = f"cannot list {pending.tmp_path}: {exc}"
        names = _dist.broadcast(listing, group)
        if isinstance(names, str):
            raise CheckpointError(f"checkpoint of step {pending.step} not committed: {names}")
        try:
            mine: Any = hash_files(pending.tmp_path, names[self.rank::self.world_size])
        except OSError as exc:
            mine = f"rank {self.rank} could not hash its files: {exc}"
        parts = _dist.gather(mine, group)
        outcome: tuple[str, Any] = ("ok", 0)
        if self.rank == 0:
            assert parts is not None
            try:
                bad = [p for p in parts if isinstance(p, str)]
                if bad:
                    raise CheckpointError(bad[0])
                files = {k: v for p in parts for k, v in p.items()}
                manifest = commit_checkpoint(pending, world_size=self.world_size, files=files, keep=self.keep,
                                             fault=fault, **fields)
                outcome = ("ok", manifest.total_bytes)
            except Exception as exc:  # every rank must learn about it, not only rank 0
                log.exception("checkpoint commit of step %d failed", pending.step)
                outcome = ("error", f"{type(exc).__name__}: {exc}")
        outcome = _dist.broadcast(outcome, group)
        if outcome[0] != "ok":
            raise CheckpointError(f"checkpoint of step {pending.step} not committed: {outcome[1]}")
        return int(outcome[1])

    # ------------------------------------------------------------------ load

    def load_latest(self, app_state: Stateful) -> LoadResult | None:
        """Load the newest verified checkpoint into ``app_state`` (collective); ``None`` if there is none."""
        self.wait()
        t0 = time.perf_counter()
        choice: Any = None
        if self.rank == 0:
            try:
                rec, skipped = find_latest_verified(self.root)
                choice = (None if rec is None else (rec.step, str(rec.path), rec.manifest.to_dict()), skipped)
            except OSError as exc:  # every rank must learn about it, not only rank 0
                choice = f"cannot read checkpoints under {self.root}: {exc}"
        choice = _dist.broadcast(choice, self.group)
        if isinstance(choice, str):
            raise CheckpointError(choice)
        found, skipped = choice
        if found is None:
            return None
        step, path, manifest = found
        dcp.load({APP_KEY: app_state}, storage_reader=reader_for(as_location(path)), process_group=self.group,
                 no_dist=not _dist.active())
        log.info("loaded checkpoint %s (step %d) in %.2fs", path, step, time.perf_counter() - t0)
        return LoadResult(step, path, Manifest.from_dict(manifest), [tuple(s) for s in skipped],
                          time.perf_counter() - t0)

    def close(self) -> None:
        """Finish the save in flight, stop the background thread, destroy the group created here."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._own_async_group and self.async_group is not None and _dist.active():
                dist.barrier(group=self.async_group)
                dist.destroy_process_group(self.async_group)
                self.async_group = None


def save_checkpoint(root: str | os.PathLike, step: int, app_state: Stateful,
                    manifest_extra: dict[str, Any] | None = None, rank: int = 0, world_size: int = 1,
                    keep: int = MIN_KEEP, group: ProcessGroup | None = None, *, async_save: bool = False,
                    _fault: Fault = None) -> CheckpointInfo:
    """One save without keeping a ``Checkpointer`` (collective over ``group``, default: the world).

    ``rank``/``world_size`` are this process's rank and size in ``group`` (checked). With ``async_save``
    the background work communicates over ``group``, which must then be used for nothing else while
    it runs (when several ranks); call ``info.wait()`` before the next save. A trainer that saves
    asynchronously should hold a ``Checkpointer``, which makes that group itself."""
    ckpt = Checkpointer(root, rank=rank, world_size=world_size, keep=keep, group=group, async_group=group)
    return ckpt.save(step, app_state, manifest_extra=manifest_extra, async_save=async_save, _fault=_fault)


def load_latest(root: str | os.PathLike, app_state: Stateful, *, group: ProcessGroup | None = None
                ) -> LoadResult | None:
    """Load the newest verified checkpoint under ``root`` into ``app_state`` (any saved layout)."""
    return Checkpointer(root, group=group).load_latest(app_state)
