"""Rendezvous for ``torch.distributed``: rank 0's address and a free port, gloo or NCCL, timeouts.

Rank 0's actor picks a free TCP port on its own node (``endpoint``); every rank then joins with
``init_process_group(backend, init_method="tcp://ip:port", rank, world_size, timeout)``. The timeout
bounds the join and every collective on the default group; the engine passes explicit timeouts to
its sub-groups (``collective_timeout_s``), because sub-groups do not inherit it.
NCCL on nodes with a CUDA device, gloo otherwise. A failed job never reuses a port: every attempt
picks a fresh one.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    backend: str
    timeout_s: float

    @property
    def init_method(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Rendezvous:
        return cls(str(d["host"]), int(d["port"]), str(d["backend"]), float(d["timeout_s"]))  # type: ignore[arg-type]


def free_port(host: str = "") -> int:
    """A TCP port free right now on this host (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def endpoint(timeout_s: float) -> Rendezvous:
    """Called on rank 0's actor: this node's address, a free port, the backend for this node."""
    import ray

    host = ray.util.get_node_ip_address()
    return Rendezvous(host, free_port(), choose_backend(), float(timeout_s))


def join(rdzv: Rendezvous, rank: int, world_size: int) -> None:
    """Called on every rank: init the default process group (blocks until all ranks joined)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if rdzv.backend == "nccl":
        torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
    # no ``device_id``: with it the default group is bound to the device and DeviceMesh builds its
    # groups with ``split_group``, which crashed the process (SIGSEGV) at the second rendezvous of
    # one process, as a warm-pool actor does (seen on an H200, torch 2.11); without it three
    # rendezvous in one process run (tests/gpu: test_one_process_survives_three_rendezvous)
    dist.init_process_group(
        rdzv.backend,
        init_method=rdzv.init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=rdzv.timeout_s),
    )


def leave(barrier_timeout_s: float = 10.0) -> None:
    """Barrier, then destroy the default group (without the barrier gloo sometimes aborts)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        work = dist.barrier(async_op=True)
        work.wait(timeout=timedelta(seconds=barrier_timeout_s))
    finally:
        dist.destroy_process_group()
