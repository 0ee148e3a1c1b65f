"""In-memory snapshots: the same DCP state a storage checkpoint holds, as bytes in CPU memory.

After every step :class:`Snapshotter` takes a DCP save of the trainer's :class:`ModelOptimizerState`
(model, optimizer, the step and data position, and the RNG states) with ``dcp.async_save`` on a
process group used only for snapshots: the call returns once the state is staged (copied) in host
memory, and the write runs on a background thread, overlapped with the next step. The write goes to
a tmpfs directory (``/dev/shm``: memory, never a disk); when it is done each rank reads back the
files *it* wrote (``__<rank>_*.distcp``, plus DCP's ``.metadata`` on rank 0) as bytes, hands them to
``push`` (the runtime sends them to snapshot holders in memory on this node and on another one) and
deletes the directory.

:func:`load_snapshot` restores a trainer from those bytes: they are written to a tmpfs directory
and loaded with ``dcp.load`` into this rank's sharding (the same resharding path as a storage
checkpoint's ``load_latest``: any layout and world size can load any snapshot), then the step, the
data position and the RNG states are set as :meth:`RankTrainer.restore` sets them.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from workers.engine.checkpoint import _dist
from workers.engine.checkpoint.dcp_io import APP_KEY
from workers.engine.checkpoint.rng import capture_rng_state, restore_rng_state
from workers.engine.checkpoint.state import ModelOptimizerState

METADATA = ".metadata"
Push = Callable[[int, dict[str, bytes]], None]  # (steps completed, {file name: bytes}) -> None


def tmpfs_root() -> Path:
    """Where snapshots are staged: ``/dev/shm`` when there is one (memory), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def _state(trainer: Any) -> ModelOptimizerState:
    extra = {**trainer._trainer_state(), "rng": capture_rng_state()}
    return ModelOptimizerState(trainer.parts.modules, trainer.optimizer, extra=extra)


def own_files(directory: Path, rank: int) -> dict[str, bytes]:
    """The files rank ``rank`` wrote into a DCP directory (``single_file_per_rank``): its shard file(s)
    and, on rank 0, DCP's ``.metadata``."""
    out = {p.name: p.read_bytes() for p in directory.glob(f"__{rank}_*.distcp")}
    if rank == 0:
        out[METADATA] = (directory / METADATA).read_bytes()
    if not any(n.endswith(".distcp") for n in out):
        raise FileNotFoundError(f"rank {rank} wrote no shard file into {directory}")
    return out


class Snapshotter:
    """Takes this rank's snapshot after each step; at most one in flight (the next waits for it).

    Construct it on every rank at the same point (it creates a gloo group: collective)."""

    def __init__(self, trainer: Any, push: Push, *, tag: str, timeout_s: float = 120.0) -> None:
        self.trainer = trainer
        self.push = push
        self.rank, self.world_size = _dist.rank_and_size(None)
        self.group = None
        if _dist.active() and self.world_size > 1:
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        base = _dist.broadcast(tempfile.mkdtemp(prefix=f"orthoplex-snap-{tag}-", dir=tmpfs_root())
                               if self.rank == 0 else None, self.group)
        self.root = Path(base) / f"rank{self.rank}"  # every rank its own directory, one per node in real life
        self.root.mkdir(parents=True, exist_ok=True)
        self._shared = Path(base)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orthoplex-snap")
        self._pending: Future | None = None
        self.stats: dict[str, float] = {"blocked_s": 0.0, "background_s": 0.0, "snapshots": 0, "bytes": 0}

    def start(self) -> None:
        """Snapshot the state after the last step (collective); returns once it is staged in memory."""
        self.wait()
        t0 = time.perf_counter()
        step = int(self.trainer.next_step)
        directory = self._shared / f"step-{step}"
        writer = dcp.FileSystemWriter(directory, single_file_per_rank=True, sync_files=False, thread_count=1)
        upload = dcp.async_save({APP_KEY: _state(self.trainer)}, storage_writer=writer, process_group=self.group,
                                no_dist=not _dist.active())
        self.stats["blocked_s"] += time.perf_counter() - t0

        def finish() -> int:
            t1 = time.perf_counter()
            upload.result()
            files = own_files(directory, self.rank)
            for name in files:  # each rank removes what it wrote (tmpfs is per node on a real cluster)
                (directory / name).unlink(missing_ok=True)
            self.push(step, files)
            self.stats["background_s"] += time.perf_counter() - t1
            self.stats["snapshots"] += 1
            self.stats["bytes"] += sum(len(b) for b in files.values())
            return step

        self._pending = self._executor.submit(finish)

    def wait(self) -> int | None:
        """Block until the snapshot in flight (if any) is pushed; its step, re-raising its error."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            if self.group is not None and _dist.active():
                dist.barrier(group=self.group)
                dist.destroy_process_group(self.group)
                self.group = None
            shutil.rmtree(self._shared, ignore_errors=True)


def load_snapshot(trainer: Any, files: Mapping[str, bytes]) -> int:
    """Load a snapshot (every rank's files of one step, and ``.metadata``) into ``trainer``, resharded
    into its layout (collective over the default group); returns the next step to run."""
    if METADATA not in files:
        raise ValueError("snapshot has no DCP .metadata")
    directory = Path(tempfile.mkdtemp(prefix="orthoplex-snapload-", dir=tmpfs_root()))
    try:
        for name, data in files.items():
            (directory / name).write_bytes(data)
        state = _state(trainer)
        dcp.load({APP_KEY: state}, checkpoint_id=str(directory), no_dist=not _dist.active())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    saved_batch = state.extra.get("global_batch", trainer.cfg.global_batch)
    if saved_batch != trainer.cfg.global_batch:
        raise ValueError(f"snapshot was written with global_batch {saved_batch}, this run has "
                         f"{trainer.cfg.global_batch}; the sample order would differ")
    trainer.next_step = int(state.extra["next_step"])
    if state.extra.get("rng"):
        restore_rng_state(state.extra["rng"])
    return trainer.next_step
