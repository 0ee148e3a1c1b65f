"""What the Ray cluster looks like right now: nodes, GPUs, health, and which job attempt holds which GPU.

Used by the controller (as the capacity side of the scheduler's snapshot) and by ``GET /v1/cluster``.
It never starts or connects to Ray: when this process is not connected (or the GCS does not answer)
it returns an *unavailable* view with the reason, so the API can still answer and the controller
simply admits nothing that round.

Ray 2.60 here runs without a dashboard, so ``ray.util.state`` is not available; everything comes from
``ray.nodes()`` (static resources and liveness) and ``ray.util.placement_group_table()`` (which
bundle of which placement group sits on which node). A GPU is *used* when a bundle of a placement
group that is not removed reserves it. Which job holds which GPUs is not read from here: the
database records it on each attempt row (``attempts.placement``, from the runtime's ``placed``
event), see ``snapshot``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

_HOLDING_STATES = {"CREATED", "RESCHEDULING"}


@dataclass(frozen=True)
class Allocation:
    """GPUs of one node reserved by one placement group."""

    placement_group_id: str
    name: str
    gpus: int


@dataclass(frozen=True)
class RayNode:
    """One Ray node as the control plane sees it (health, GPUs used, placement groups); the scheduler
    gets it as a ``service.scheduler.types.NodeView``, a job's supervisor plans on a
    ``workers.runtime.cluster.placement_groups.NodeCapacity``."""

    node_id: str
    alive: bool
    address: str
    is_head: bool
    gpus_total: int
    gpus_used: int
    cpus_total: float
    allocations: tuple[Allocation, ...] = ()

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_used) if self.alive else 0


@dataclass(frozen=True)
class ClusterView:
    """The cluster at ``observed_at``; ``available`` is False when Ray could not be asked."""

    available: bool
    nodes: tuple[RayNode, ...] = ()
    reason: str | None = None
    observed_at: float = field(default_factory=time.time)

    @property
    def alive_nodes(self) -> tuple[RayNode, ...]:
        return tuple(n for n in self.nodes if n.alive)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus_total for n in self.alive_nodes)

    @property
    def used_gpus(self) -> int:
        return sum(min(n.gpus_used, n.gpus_total) for n in self.alive_nodes)

    @property
    def free_gpus(self) -> int:
        return sum(n.gpus_free for n in self.alive_nodes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (nodes with their free GPUs and allocations, plus totals)."""
        nodes = []
        for n in self.nodes:
            d = asdict(n)
            d["gpus_free"] = n.gpus_free
            nodes.append(d)
        return {
            "available": self.available,
            "reason": self.reason,
            "observed_at": self.observed_at,
            "total_gpus": self.total_gpus,
            "used_gpus": self.used_gpus,
            "free_gpus": self.free_gpus,
            "alive_nodes": len(self.alive_nodes),
            "nodes": nodes,
        }


def gpus_held(node: dict[str, Any] | None) -> int:
    """GPUs placement groups hold on a node of the cluster view's ``to_dict()`` (``None``: not in it)."""
    return sum(int(a.get("gpus", 0)) for a in (node or {}).get("allocations") or [])


def drain_state(drained: bool, held: int) -> str:
    """A node's drain state: ``draining`` while jobs hold GPUs on it, ``drained`` once none do,
    ``active`` when it is not drained."""
    if not drained:
        return "active"
    return "draining" if held > 0 else "drained"


def unavailable(reason: str) -> ClusterView:
    """A view that says Ray could not be asked, and why."""
    return ClusterView(available=False, reason=reason)


def _allocations(pg_table: dict[str, Any]) -> dict[str, list[Allocation]]:
    """Per node id, the GPUs each live placement group reserves there."""
    per_node: dict[str, dict[str, int]] = {}
    names: dict[str, str] = {}
    for pg_id, pg in pg_table.items():
        if pg.get("state") not in _HOLDING_STATES:
            continue
        names[pg_id] = pg.get("name") or ""
        bundles = pg.get("bundles") or {}
        where = pg.get("bundles_to_node_id") or {}
        for idx, bundle in bundles.items():
            node = where.get(idx)
            gpus = round(float((bundle or {}).get("GPU", 0)))
            if node and gpus:
                per_node.setdefault(node, {}).setdefault(pg_id, 0)
                per_node[node][pg_id] += gpus
    out: dict[str, list[Allocation]] = {}
    for node, by_pg in per_node.items():
        for pg_id, gpus in sorted(by_pg.items()):
            out.setdefault(node, []).append(Allocation(pg_id, names[pg_id], gpus))
    return out


def build_view(
    nodes: list[dict[str, Any]],
    pg_table: dict[str, Any],
    available: dict[str, dict[str, float]] | None = None,
) -> ClusterView:
    """The view from raw ``ray.nodes()``, ``placement_group_table()`` and (optionally) the
    per-node available resources (pure). A GPU is used when a live placement group reserves it or,
    where Ray reports availability, when it is not available (e.g. an actor outside any group)."""
    allocs = _allocations(pg_table)
    views = []
    for raw in nodes:
        node_id = raw.get("NodeID", "")
        res = raw.get("Resources") or {}
        node_allocs = tuple(allocs.get(node_id, ()))
        total = round(float(res.get("GPU", 0)))
        used = sum(a.gpus for a in node_allocs)
        if available is not None and node_id in available:
            used = max(used, total - int(float(available[node_id].get("GPU", 0))))
        views.append(
            RayNode(
                node_id=node_id,
                alive=bool(raw.get("Alive")),
                address=str(raw.get("NodeManagerAddress", "")),
                is_head="node:__internal_head__" in res,
                gpus_total=total,
                gpus_used=used,
                cpus_total=float(res.get("CPU", 0)),
                allocations=node_allocs,
            )
        )
    views.sort(key=lambda n: (not n.alive, not n.is_head, n.node_id))
    return ClusterView(available=True, nodes=tuple(views))


def cluster_view() -> ClusterView:
    """Ask the connected Ray cluster; an unavailable view when not connected or the GCS fails."""
    try:
        import ray
        from ray.util import placement_group_table
    except ImportError as exc:  # pragma: no cover - ray is a dependency
        return unavailable(f"ray not importable: {exc}")
    if not ray.is_initialized():
        return unavailable("not connected to Ray")
    try:
        nodes, pgs = ray.nodes(), placement_group_table()
    except Exception as exc:  # the GCS may be restarting; callers treat this as "no capacity now"
        return unavailable(f"ray query failed: {type(exc).__name__}: {exc}")
    try:  # not a public API in 2.60; the placement groups alone still give a usable view
        from ray._private import state

        available = state.available_resources_per_node()
    except Exception:
        available = None
    return build_view(nodes, pgs, available)
