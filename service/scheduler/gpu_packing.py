"""Turning GPU counts into per-node placements.

Nodes are bucketed by their free GPU count (one min-heap of node ids per count, stale entries
dropped lazily), so taking ``n`` GPUs costs O(max GPUs per node + nodes used · log nodes) instead
of a scan over every node. Preferences, in order:

1. one node when the job fits on one: *best fit*, the node with the fewest free GPUs that still
   holds the whole job (a job the size of a node lands on a whole free node, and big free nodes
   stay whole for big jobs);
2. otherwise the fewest nodes: whole free nodes first (largest free count first), then the
   remainder best-fit on one node, so every node but one gets a whole node's worth of GPUs
   (tensor-parallel groups stay inside a node);
3. growing a running job: first the nodes it already uses, then as in 1-2.

Ties go to the smaller node id, so placement is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from service.scheduler.types import NodeId


class NodePool:
    """Free GPUs per node, with best-fit and fewest-nodes allocation."""

    def __init__(self, free: Mapping[NodeId, int]) -> None:
        self.free: dict[NodeId, int] = {n: f for n, f in free.items() if f > 0}
        self.max_free = max(self.free.values(), default=0)
        self.total = sum(self.free.values())
        self._buckets: list[list[NodeId]] = [[] for _ in range(self.max_free + 1)]
        for node in sorted(self.free):
            self._buckets[self.free[node]].append(node)  # sorted lists are valid heaps

    def _peek(self, count: int) -> NodeId | None:
        bucket = self._buckets[count]
        while bucket and self.free.get(bucket[0], 0) != count:
            heapq.heappop(bucket)
        return bucket[0] if bucket else None

    def _take_from(self, node: NodeId, n: int) -> None:
        left = self.free[node] - n
        if left < 0:
            raise ValueError(f"node {node!r} has {self.free[node]} free GPUs, asked for {n}")
        self.total -= n
        if left:
            self.free[node] = left
            heapq.heappush(self._buckets[left], node)
        else:
            del self.free[node]

    def _best_fit(self, n: int) -> NodeId | None:
        for count in range(n, self.max_free + 1):
            node = self._peek(count)
            if node is not None:
                return node
        return None

    def _largest(self) -> tuple[int, NodeId] | None:
        for count in range(self.max_free, 0, -1):
            node = self._peek(count)
            if node is not None:
                return count, node
        return None

    def take(self, n: int) -> dict[NodeId, int]:
        """Reserve ``n`` GPUs (best fit, else fewest nodes); raises ``ValueError`` if fewer are free."""
        if n > self.total:
            raise ValueError(f"asked for {n} GPUs, {self.total} free")
        placement: dict[NodeId, int] = {}
        while n > 0:
            node = self._best_fit(n) if n <= self.max_free else None
            if node is not None:
                self._take_from(node, n)
                placement[node] = placement.get(node, 0) + n
                break
            largest = self._largest()
            assert largest is not None  # total >= n > 0
            count, node = largest
            self._take_from(node, count)
            placement[node] = placement.get(node, 0) + count
            n -= count
        return placement

    def extend(self, current: Mapping[NodeId, int], n: int) -> dict[NodeId, int]:
        """Reserve ``n`` more GPUs for a job on ``current``: its own nodes first (fullest first)."""
        added: dict[NodeId, int] = {}
        for node in sorted(current, key=lambda x: (-current[x], x)):
            if n <= 0:
                break
            free = self.free.get(node, 0)
            if free:
                k = min(free, n)
                self._take_from(node, k)
                added[node] = k
                n -= k
        if n > 0:
            for node, k in self.take(n).items():
                added[node] = added.get(node, 0) + k
        return added


def release_plan(current: Mapping[NodeId, int], n: int) -> dict[NodeId, int]:
    """Which GPUs a job gives back when it shrinks by ``n``: its smallest pieces first, so what it
    keeps stays on as few nodes as possible. Ties: larger node id first."""
    released: dict[NodeId, int] = {}
    for node in sorted(sorted(current, reverse=True), key=lambda x: current[x]):
        if n <= 0:
            break
        k = min(current[node], n)
        released[node] = k
        n -= k
    if n > 0:
        raise ValueError(f"cannot release {n} more GPUs than held")
    return released


def subtract(current: Mapping[NodeId, int], minus: Mapping[NodeId, int]) -> dict[NodeId, int]:
    """``current - minus`` per node, dropping zeros."""
    out = {node: current[node] - minus.get(node, 0) for node in current}
    return {node: k for node, k in sorted(out.items()) if k > 0}


def add(current: Mapping[NodeId, int], plus: Mapping[NodeId, int]) -> dict[NodeId, int]:
    """``current + plus`` per node."""
    out = dict(current)
    for node, k in plus.items():
        out[node] = out.get(node, 0) + k
    return dict(sorted(out.items()))
