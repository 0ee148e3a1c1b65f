"""Goodput curves of elastic jobs: the planner's predicted tokens/s at the GPU counts a job may take.

The scheduler (``service.scheduler.goodput``) gives spare GPUs to the job whose next step adds the
most predicted throughput and offers only the sizes a curve names. Without a curve a job scales
linearly, so two elastic jobs would be told apart by quota and priority only. Here each elastic job
(``min_gpus < max_gpus``) gets the best plan's tokens/s at a handful of sizes in its range: its
minimum and maximum, powers of two, and whole nodes (``gpus_per_node`` multiples), at most
``MAX_POINTS``. A size with no plan is left out (the job cannot run there). The cluster profile is
the service's (``ORTHOPLEX_GPU_TYPE``, ``ORTHOPLEX_GPUS_PER_NODE``), the one submissions were
checked against. Curves are computed once per job (specs never change) and cached by the caller; a
planner error gives no curve (linear scaling), never a failed round.

Curves are computed off the controller loop (:class:`CurveBook`, one background thread): a round
waits for newly requested curves at most ``wait_s`` and schedules the others linearly until their
curves are ready; one curve stops planning further sizes once its ``budget_s`` is spent.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from service.log import get_logger

log = get_logger("service.controller.curves")

MAX_POINTS = 12
CURVE_BUDGET_S = 5.0  # planning time one job's curve may take
ROUND_WAIT_S = 0.5  # how long a controller round waits for newly requested curves


def curve_sizes(min_gpus: int, max_gpus: int, gpus_per_node: int, max_points: int = MAX_POINTS) -> list[int]:
    """The GPU counts to predict: min, max and powers of two in between, then whole nodes (evenly
    spread) while there is room, at most ``max_points``."""
    sizes = {min_gpus, max_gpus}
    n = 1
    while n <= max_gpus and len(sizes) < max_points:
        if n > min_gpus:
            sizes.add(n)
        n *= 2
    nodes = [k for k in range(gpus_per_node, max_gpus, max(1, gpus_per_node)) if k > min_gpus and k not in sizes]
    room = max_points - len(sizes)
    if room > 0 and nodes:
        step = max(1.0, len(nodes) / room)
        sizes.update(nodes[int(i * step)] for i in range(min(room, len(nodes))))
    return sorted(sizes)


def goodput_curve(
    spec: Mapping[str, Any], min_gpus: int, max_gpus: int, *, gpu_type: str, gpus_per_node: int,
    budget_s: float = CURVE_BUDGET_S,
) -> dict[int, float] | None:
    """Predicted tokens/s per GPU count for an elastic job, or ``None`` (no curve: linear). Sizes
    are planned in order until ``budget_s`` is spent (the curve then has the sizes planned so far)."""
    if max_gpus <= min_gpus:
        return None
    import planner
    from workers.planner_spec import PlanCluster, to_planner_spec

    try:
        curve: dict[int, float] = {}
        started = time.monotonic()
        for n in curve_sizes(min_gpus, max_gpus, gpus_per_node):
            if curve and time.monotonic() - started >= budget_s:
                log.warning("goodput curve cut at its time budget", extra={"sizes": sorted(curve)})
                break
            cluster = PlanCluster(gpu_type=gpu_type, num_gpus=n, min_gpus=n, gpus_per_node=gpus_per_node)
            result = planner.plan(to_planner_spec(spec, cluster), top_k=1)
            if result.plans:
                curve[n] = float(result.plans[0].estimate.tokens_per_s)
    except Exception as exc:  # a planner error must not stop scheduling: the job scales linearly
        log.warning("no goodput curve", extra={"error": repr(exc)})
        return None
    return curve or None


class CurveBook:
    """Goodput curves computed on a background thread; ``update`` never blocks a round longer than
    ``wait_s``. ``compute(job)`` is called once per elastic job (``min_gpus < max_gpus``)."""

    def __init__(self, compute: Callable[[Any], dict[int, float] | None], wait_s: float = ROUND_WAIT_S) -> None:
        self.compute = compute
        self.wait_s = wait_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="goodput-curves")
        self._pending: dict[int, concurrent.futures.Future[dict[int, float] | None]] = {}

    def update(self, jobs: Iterable[Any], curves: dict[int, dict[int, float] | None]) -> None:
        """Bring ``curves`` (job id -> curve) up to date for the live ``jobs``: forget ended jobs,
        request missing curves, take those ready within ``wait_s``."""
        jobs = list(jobs)
        live = {j.id for j in jobs}
        for job_id in [k for k in curves if k not in live]:
            del curves[job_id]
        for job_id in [k for k in self._pending if k not in live]:
            self._pending.pop(job_id).cancel()
        for j in jobs:
            if j.max_gpus > j.min_gpus and j.id not in curves and j.id not in self._pending:
                self._pending[j.id] = self._pool.submit(self.compute, j)
        if self._pending:
            concurrent.futures.wait(list(self._pending.values()), timeout=self.wait_s,
                                    return_when=concurrent.futures.ALL_COMPLETED)
        for job_id, fut in list(self._pending.items()):
            if fut.done():
                del self._pending[job_id]
                try:
                    curves[job_id] = fut.result()
                except Exception as exc:  # a planner error: no curve (linear), never a failed round
                    log.warning("no goodput curve", extra={"job": job_id, "error": repr(exc)})
                    curves[job_id] = None

    def close(self) -> None:
        for fut in self._pending.values():
            fut.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
