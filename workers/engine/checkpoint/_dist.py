"""Collective helpers that degrade to no-ops without a process group (single process)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_size(group: ProcessGroup | None) -> tuple[int, int]:
    if not active():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def broadcast(obj: Any, group: ProcessGroup | None) -> Any:
    """Group rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]


def gather(obj: Any, group: ProcessGroup | None) -> list[Any] | None:
    """Every rank's ``obj`` on group rank 0 (``None`` elsewhere)."""
    if not active():
        return [obj]
    rank, size = rank_and_size(group)
    out: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(obj, out, group_dst=0, group=group)
    return out


def barrier(group: ProcessGroup | None) -> None:
    if active():
        dist.barrier(group=group)
