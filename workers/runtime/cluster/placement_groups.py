"""Gang placement: one bundle ``{"GPU": 1, "CPU": small}`` per GPU, all-or-nothing, with a timeout.

Nodes are identified by their Ray node id, never by address: in local clusters every node shares
one IP. Bundles are restricted to the nodes the plan chose with a label selector on
``ray.io/node-id`` (so a straggler or a half-dead node is kept out); Ray decides the rest, and
``placement_group_table`` tells us where each bundle actually landed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.runtime.cluster.watchdog import tcp_refused

NODE_ID_LABEL = "ray.io/node-id"
HEAD_RESOURCE = "node:__internal_head__"


@dataclass(frozen=True)
class NodeCapacity:
    """A node's GPUs as one job plans on them: ``free_gpus`` free for it (``service.controller.cluster.
    RayNode`` is a node as the control plane shows it; ``service.scheduler.types.NodeView`` one as the
    scheduler allocates it)."""

    id: str
    gpus: int
    free_gpus: int
    cpus: float
    is_head: bool


def cluster_nodes(*, exclude: Iterable[str] = (), held: Mapping[str, int] | None = None) -> list[NodeCapacity]:
    """Alive nodes that declare GPUs, minus ``exclude``; in a stable order (by node id).

    ``free_gpus`` counts the GPUs free now plus ``held[node]`` (GPUs this job holds there and would
    give back when it switches plans)."""
    import ray
    from ray._private import state

    skip = set(exclude)
    try:
        free = state.available_resources_per_node()
    except Exception:  # older GCS without the call: assume everything is free
        free = {}
    out = []
    for n in ray.nodes():
        res = n.get("Resources", {})
        if not n.get("Alive") or n["NodeID"] in skip or res.get("GPU", 0) < 1:
            continue
        gpus = int(res.get("GPU", 0))
        avail = int(free.get(n["NodeID"], {}).get("GPU", 0)) if free else gpus
        avail = min(gpus, avail + int((held or {}).get(n["NodeID"], 0)))
        out.append(NodeCapacity(n["NodeID"], gpus, avail, float(res.get("CPU", 0)), HEAD_RESOURCE in res))
    return sorted(out, key=lambda v: v.id)


def alive_node_ids() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def raylet_unreachable(node_id: str, timeout_s: float = 1.0) -> bool:
    """Whether the node's raylet refuses (or does not answer) a TCP connection to its node-manager
    port: its process or host is gone. This knows seconds before the GCS's health checks mark the
    node dead, which is what tells "a node died" from "a rank process died on a live node"."""
    import ray

    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
    if node is None or not node.get("Alive"):
        return True
    addr, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not addr or not port:
        return False  # nothing to probe: trust the GCS
    return tcp_refused((str(addr), int(port)), timeout_s) is not False  # refused or silent


def raylet_addresses(node_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
    """The node-manager (raylet) address of each alive node of ``node_ids`` (one GCS call)."""
    import ray

    ids = set(node_ids)
    return {n["NodeID"]: (str(n["NodeManagerAddress"]), int(n["NodeManagerPort"])) for n in ray.nodes()
            if n.get("NodeID") in ids and n.get("Alive") and n.get("NodeManagerAddress") and n.get("NodeManagerPort")}


def wait_nodes_dead(node_ids: Iterable[str], timeout_s: float, poll_s: float = 0.1) -> bool:
    """Wait until the GCS marks ``node_ids`` dead (so no new bundle lands there)."""
    ids = set(node_ids)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not ids & alive_node_ids():
            return True
        time.sleep(poll_s)
    return not ids & alive_node_ids()


@dataclass
class Reservation:
    pg: Any
    bundle_nodes: list[str]
    seconds: float
    strategy: str
    name: str = ""  # the placement group's name

    @property
    def size(self) -> int:
        return len(self.bundle_nodes)

    @property
    def gpus_per_node(self) -> dict[str, int]:
        """GPUs (bundles) this reservation holds on each node."""
        out: dict[str, int] = {}
        for n in self.bundle_nodes:
            out[n] = out.get(n, 0) + 1
        return out


def bundle_nodes_of(pg: Any) -> list[str]:
    """Node id of every bundle of a ready placement group, from ``placement_group_table``."""
    from ray.util import placement_group_table

    table = placement_group_table(pg)
    mapping = table.get("bundles_to_node_id") or {}
    return [str(mapping[i]) for i in sorted(mapping)]


def reserve(
    num_gpus: int,
    *,
    nodes: Sequence[str] | None = None,
    cpu_per_bundle: float = 0.05,
    timeout_s: float = 30.0,
    strategy: str = "PACK",
    name: str = "",
    per_node: Mapping[str, int] | None = None,
) -> Reservation | None:
    """Reserve ``num_gpus`` bundles (gang); ``None`` (and nothing left behind) when not ready in time.

    ``nodes``: the bundles may land on any of these; ``per_node`` (node id -> bundles, summing to
    ``num_gpus``): exactly that many bundles on each node (a scheduler's placement)."""
    import ray
    from ray.util import placement_group, remove_placement_group

    bundles = [{"GPU": 1.0, "CPU": float(cpu_per_bundle)} for _ in range(num_gpus)]
    kwargs: dict[str, Any] = {}
    if per_node:
        pinned = [n for n, k in sorted(per_node.items()) for _ in range(int(k))]
        if len(pinned) != num_gpus:
            raise ValueError(f"per_node places {len(pinned)} bundles, the gang has {num_gpus}")
        kwargs["bundle_label_selector"] = [{NODE_ID_LABEL: f"in({n})"} for n in pinned]
    elif nodes:
        selector = {NODE_ID_LABEL: f"in({','.join(sorted(nodes))})"}
        kwargs["bundle_label_selector"] = [dict(selector) for _ in bundles]
    t0 = time.monotonic()
    pg = placement_group(bundles, strategy=strategy, name=name, **kwargs)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        return None
    return Reservation(pg, bundle_nodes_of(pg), time.monotonic() - t0, strategy, name)


def release(reservation: Reservation | None) -> None:
    """Remove the placement group (this kills every actor still in it)."""
    if reservation is None:
        return
    from ray.util import remove_placement_group

    with contextlib.suppress(Exception):  # already removed, or the GCS forgot it
        remove_placement_group(reservation.pg)


def live_placement_groups(name_prefix: str = "") -> list[dict[str, Any]]:
    """Placement groups not yet REMOVED (optionally only those whose name starts with a prefix)."""
    from ray.util import placement_group_table

    return [
        t
        for t in placement_group_table().values()
        if t.get("state") != "REMOVED" and str(t.get("name", "")).startswith(name_prefix)
    ]
