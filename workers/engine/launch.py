"""Local launcher: one process per rank, free-port TCP rendezvous, one thread per rank.

:func:`run_ranks` runs ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes after
``init_process_group`` and returns every rank's return value (rank order). An exception on any
rank is re-raised in the caller with that rank's traceback; the other ranks are terminated.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RankError(RuntimeError):
    """A rank raised; the message carries its traceback."""


@contextlib.contextmanager
def single_rank_group(timeout_s: float = 600.0) -> Iterator[str]:
    """A default process group of one in this process (NCCL on CUDA, else gloo); yields the backend.

    The one-GPU path of the engine (``bench/gpu_mfu.py``, the ``gpu`` tests) and its CPU twin run
    ``RankTrainer`` inside it exactly as a rank of :func:`run_ranks` does."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process")
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(0)
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield backend
    finally:
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _entry(rank: int, world_size: int, port: int, timeout_s: float, fn: Callable[..., Any],
           args: tuple[Any, ...], results: Any, threads: int, events: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
        if use_cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
        try:
            out = fn(rank, world_size, *args) if events is None else fn(rank, world_size, *args, events=events)
            results.put((rank, True, out))
        finally:
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 600.0,
              collective_timeout_s: float = 60.0, threads: int = 1,
              on_event: Callable[[Any], None] | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes; return their results.

    With ``on_event``, ``fn`` also gets ``events=`` (a queue); whatever a rank puts there is handed
    to ``on_event`` in this process as it arrives (progress bars, metrics files).
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    events = ctx.Queue() if on_event is not None else None
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, collective_timeout_s, fn, args, results, threads,
                                              events), daemon=False) for r in range(world_size)]

    def drain() -> None:
        while events is not None and on_event is not None:
            try:
                on_event(events.get_nowait())
            except queue.Empty:
                return

    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    error: str | None = None
    try:
        while len(out) < world_size and error is None:
            drain()
            try:
                rank, ok, value = results.get(timeout=0.2 if events is not None else 1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    error = f"timed out after {timeout_s}s waiting for ranks {sorted(set(range(world_size)) - set(out))}"
                elif any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    time.sleep(0.5)
                    if results.empty():
                        dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                        error = f"rank(s) {dead} died (exit codes {[procs[r].exitcode for r in dead]})"
                continue
            if ok:
                out[rank] = value
            else:
                error = f"rank {rank} failed:\n{value}"
    finally:
        for p in procs:
            p.join(timeout=30 if error is None else 2)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    time.sleep(0.1 if events is not None else 0)
    drain()
    if error is not None:
        raise RankError(error)
    return [out[r] for r in range(world_size)]


def train_rank(rank: int, world_size: int, cfg_dict: dict[str, Any], layout_dict: dict[str, Any],
               resume: bool, stop_at_step: int | None, events: Any = None,
               async_checkpoints: bool | None = None) -> dict[str, Any]:
    """One rank of ``orthoplex train``: restore (optional), step, save every ``save_every`` and at
    the stop step; rank 0 reports each step and each committed checkpoint to ``events``.
    ``async_checkpoints``: see :class:`~workers.engine.trainer.RankTrainer` (default: on CUDA)."""
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = RankTrainer(cfg, Layout.from_dict(layout_dict), rank, world_size, async_checkpoints=async_checkpoints)
    saved: list[int] = []

    def report(infos: list[Any]) -> None:
        for info in infos:
            saved.append(info.step)
            if events is not None and rank == 0:
                events.put({"event": "checkpoint", "step": info.step, "path": info.path,
                            "seconds": info.seconds, "bytes": info.bytes})
    try:
        start = trainer.restore() if resume else 0
        if events is not None and rank == 0:
            events.put({"event": "start", "step": start, "steps": cfg.steps})
        end = min(cfg.steps, stop_at_step) if stop_at_step is not None else cfg.steps
        while trainer.next_step < end:
            res = trainer.step()
            if events is not None and rank == 0:
                events.put({"event": "step", "step": res.step, "loss": res.loss, "grad_norm": res.grad_norm,
                            "lr": res.lr, "tokens_per_s": res.tokens / max(res.seconds, 1e-9)})
            last = res.step == end
            if cfg.eval_every and (res.step % cfg.eval_every == 0 or res.step == cfg.steps):
                val = trainer.val_loss()
                if events is not None and rank == 0:
                    events.put({"event": "eval", "step": res.step, "val_loss": val})
            periodic = cfg.save_every and res.step % cfg.save_every == 0
            if cfg.checkpoint_dir and (periodic or (last and stop_at_step is not None)):
                # background write and commit where the trainer saves asynchronously (CUDA); the
                # checkpoint is reported once committed
                report(trainer.start_save())
        report(trainer.finish_saves())
        exported = None
        if cfg.export is not None and trainer.next_step == cfg.steps:
            exported = trainer.export_hf(cfg.export.dir)
            if events is not None and rank == 0:
                events.put({"event": "export", "path": exported})
        return {"start": start, "end": trainer.next_step, "saved": saved, "exported": exported}
    finally:
        trainer.close()
