"""Weighted fair share over GPUs (the only resource, so the dominant share is the GPU share).

A tenant's share is ``gpus / weight``; the tenant with the smallest share goes next. With one
resource, dominant-resource fairness reduces to weighted max-min fairness, which
:func:`entitlements` computes by water-filling.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping

from service.scheduler.types import Id, JobView


def entitlements(capacity: int, demand: Mapping[Id, int], weight: Mapping[Id, float]) -> dict[Id, float]:
    """Weighted max-min fair split of ``capacity`` GPUs among tenants demanding ``demand``.

    Each tenant gets ``min(demand, level * weight)``, with ``level`` as high as the capacity allows.
    """
    out: dict[Id, float] = {t: 0.0 for t in demand}
    active = sorted((t for t in demand if demand[t] > 0), key=lambda t: (demand[t] / weight[t], t))
    left = float(capacity)
    total_w = sum(weight[t] for t in active)
    for i, t in enumerate(active):
        level = left / total_w if total_w > 0 else 0.0
        if demand[t] <= level * weight[t]:
            out[t] = float(demand[t])
            left -= demand[t]
            total_w -= weight[t]
        else:
            for u in active[i:]:
                out[u] = level * weight[u]
            break
    return out


class FairQueue:
    """Pops pending jobs tenant by tenant: always the next job of the tenant with the lowest
    ``usage / weight`` (ties: tenant id). Usage is read live from ``usage``, so admitting a job
    (which raises its tenant's usage) reorders the tenants."""

    def __init__(
        self, queues: Mapping[Id, list[JobView]], usage: Mapping[Id, int], weight: Mapping[Id, float]
    ):
        self._queues = {t: deque(q) for t, q in queues.items() if q}
        self._usage = usage
        self._weight = weight
        self._heap = [(self._key(t), t) for t in sorted(self._queues)]
        heapq.heapify(self._heap)

    def _key(self, tenant: Id) -> float:
        return self._usage.get(tenant, 0) / self._weight[tenant]

    def remaining(self) -> list[JobView]:
        """The jobs not popped yet (tenant by tenant, each in queue order); empties the queue."""
        rest = [job for tenant in sorted(self._queues) for job in self._queues[tenant]]
        for queue in self._queues.values():
            queue.clear()
        self._heap.clear()
        return rest

    def __iter__(self) -> Iterator[JobView]:
        while self._heap:
            key, tenant = heapq.heappop(self._heap)
            current = self._key(tenant)
            if current != key:  # usage changed since it was pushed
                heapq.heappush(self._heap, (current, tenant))
                continue
            queue = self._queues[tenant]
            if not queue:
                continue
            job = queue.popleft()
            yield job
            if queue:
                heapq.heappush(self._heap, (self._key(tenant), tenant))
