"""A small pool of pre-started rank actors per node, so a new gang's ranks cost no interpreter start.

Starting a ``RankWorker`` actor means a new Python process importing torch: seconds per rank, and on a
small host many ranks starting together take tens of seconds. :class:`WarmPool` keeps ``per_node``
idle ``RankWorker`` actors on every node (torch imported in ``__init__``, the trainer, DCP and the
snapshot loader by :func:`preload` right after; no GPU, no CPU reserved:
the gang's placement group holds the GPUs). ``start_gang`` takes a ready one for a rank on that node
instead of creating one in the rank's bundle; a warm rank is told its bundle's GPU ids (a
zero-cost probe task in the bundle asks Ray) and sets ``CUDA_VISIBLE_DEVICES`` before CUDA starts.
The pool refills in the background after a gang took from it, and is killed with the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def preload(worker: Any) -> float:
    """Run inside a warm rank (``actor.__ray_call__``): import what a gang start and a restore import
    (the trainer, the process-group code, DCP and the snapshot loader), so a re-planned gang does
    not pay for it; the seconds it took."""
    import importlib
    import time

    t0 = time.perf_counter()
    for name in ("torch.distributed.checkpoint", "workers.engine.trainer", "workers.engine.checkpoint.snapshot",
                 "workers.runtime.cluster.rendezvous", "planner.layout"):
        with contextlib.suppress(Exception):  # best effort: setup imports it anyway
            importlib.import_module(name)
    return time.perf_counter() - t0


def bundle_gpu_ids() -> list[str]:
    """Run as a task inside a bundle: the GPU ids Ray gives that bundle."""
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


@dataclass
class WarmPool:
    per_node: int
    idle: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)  # node -> [(actor, info ref)]
    taken: int = 0

    def fill(self, nodes: Iterable[str]) -> int:
        """Start actors until every node of ``nodes`` has ``per_node`` (returns immediately); how many started."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from workers.runtime.cluster.rank_worker import ACTOR_CONCURRENCY, RankWorker

        if self.per_node <= 0:
            return 0
        cls = ray.remote(num_cpus=0, num_gpus=0, **ACTOR_CONCURRENCY, max_restarts=0)(RankWorker)
        started = 0
        for node in nodes:
            have = self.idle.setdefault(node, [])
            while len(have) < self.per_node:
                a = cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
                have.append((a, a.info.remote()))
                a.__ray_call__.remote(preload)  # imports in the background while the actor waits
                started += 1
        return started

    def take(self, node: str) -> Any | None:
        """An idle actor on ``node`` (``None`` when the pool there is empty); it leaves the pool. One
        still starting is taken too: it is further along than a fresh one (the gang checks them all)."""
        have = self.idle.get(node, [])
        if not have:
            return None
        self.taken += 1
        return have.pop(0)[0]

    def drop(self, nodes: Iterable[str]) -> None:
        """Forget (and kill) the idle actors of ``nodes`` (lost or excluded)."""
        import ray

        for node in nodes:
            for actor, _ in self.idle.pop(node, []):
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)

    def kill(self) -> None:
        self.drop(list(self.idle))
