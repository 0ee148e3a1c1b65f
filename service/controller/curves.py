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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.log import get_logger

log = get_logger("service.controller.curves")

MAX_POINTS = 12


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
    spec: Mapping[str, Any], min_gpus: int, max_gpus: int, *, gpu_type: str, gpus_per_node: int
) -> dict[int, float] | None:
    """Predicted tokens/s per GPU count for an elastic job, or ``None`` (no curve: linear)."""
    if max_gpus <= min_gpus:
        return None
    import planner
    from workers.planner_spec import PlanCluster, to_planner_spec

    try:
        curve: dict[int, float] = {}
        for n in curve_sizes(min_gpus, max_gpus, gpus_per_node):
            cluster = PlanCluster(gpu_type=gpu_type, num_gpus=n, min_gpus=n, gpus_per_node=gpus_per_node)
            result = planner.plan(to_planner_spec(spec, cluster), top_k=1)
            if result.plans:
                curve[n] = float(result.plans[0].estimate.tokens_per_s)
    except Exception as exc:  # a planner error must not stop scheduling: the job scales linearly
        log.warning("no goodput curve", extra={"error": repr(exc)})
        return None
    return curve or None
