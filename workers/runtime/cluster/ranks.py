"""Topology-aware rank assignment *after* placement.

Ray does not keep the bundles of one node contiguous (a SPREAD group comes back ``w0 w1 w2 w0 ...``,
and even PACK interleaves once other jobs hold GPUs). So after the placement group is ready we read
which node every bundle landed on and decide which bundle each rank gets:

1. If the plan says where each rank should live (``plan_nodes[rank]``) and the reserved bundles
   have the same per-node counts, follow the plan exactly (identity on node ids, else a match of
   plan nodes to real nodes with equal counts).
2. Otherwise place whole blocks of consecutive ranks on one node: blocks of ``tp*cp`` ranks (a TP
   group and its CP peers), else blocks of ``tp`` ranks. Megatron order makes a TP group a run of
   consecutive ranks, so a block on one node keeps every TP group (then CP group) inside a node.

Groups that still cross nodes are reported (``spanning``) so the event log says so.
Pure Python: no ray, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.layout import Layout


@dataclass(frozen=True)
class RankMap:
    """``rank_to_bundle[r]`` is the bundle (and so the actor) that runs rank ``r``."""

    rank_to_bundle: list[int]
    rank_to_node: list[str]
    method: str
    spanning: dict[str, list[list[int]]] = field(default_factory=dict)

    def ranks_on(self, node: str) -> list[int]:
        return [r for r, n in enumerate(self.rank_to_node) if n == node]

    def nodes(self) -> list[str]:
        return list(OrderedDict.fromkeys(self.rank_to_node))

    def to_dict(self) -> dict[str, object]:
        return {
            "rank_to_bundle": list(self.rank_to_bundle),
            "rank_to_node": list(self.rank_to_node),
            "method": self.method,
            "spanning": {k: [list(g) for g in v] for k, v in self.spanning.items()},
        }


def spanning_groups(layout: Layout, rank_to_node: Sequence[str]) -> dict[str, list[list[int]]]:
    """TP and CP groups (and TP*CP blocks) whose ranks sit on more than one node."""
    out: dict[str, list[list[int]]] = {}
    for key, dims in (("tp", ("tp",)), ("cp", ("cp",)), ("tp_cp", ("tp", "cp"))):
        size = 1
        for d in dims:
            size *= layout.size(d)  # type: ignore[arg-type]
        if size == 1:
            continue
        bad = [g for g in layout.groups(*dims) if len({rank_to_node[r] for r in g}) > 1]  # type: ignore[arg-type]
        if bad:
            out[key] = bad
    return out


def _bundles_by_node(bundle_nodes: Sequence[str]) -> OrderedDict[str, list[int]]:
    by_node: OrderedDict[str, list[int]] = OrderedDict()
    for b, node in enumerate(bundle_nodes):
        by_node.setdefault(node, []).append(b)
    return by_node


def _follow_plan(
    layout: Layout, by_node: OrderedDict[str, list[int]], plan_nodes: Sequence[str]
) -> list[int] | None:
    """Map the plan's node of every rank onto real nodes; ``None`` when the counts do not match."""
    wanted: OrderedDict[str, list[int]] = OrderedDict()
    for r, pn in enumerate(plan_nodes):
        wanted.setdefault(str(pn), []).append(r)
    if set(wanted) <= set(by_node) and all(len(wanted[n]) == len(by_node[n]) for n in wanted):
        pairing = {n: n for n in wanted}
    else:
        plan_sizes = sorted(wanted, key=lambda n: -len(wanted[n]))
        real_sizes = sorted(by_node, key=lambda n: -len(by_node[n]))
        if [len(wanted[n]) for n in plan_sizes] != [len(by_node[n]) for n in real_sizes]:
            return None
        pairing = dict(zip(plan_sizes, real_sizes, strict=True))
    rank_to_bundle = [-1] * layout.world_size
    for pn, ranks in wanted.items():
        for r, b in zip(ranks, by_node[pairing[pn]], strict=True):
            rank_to_bundle[r] = b
    return rank_to_bundle


def _blocks(layout: Layout, by_node: OrderedDict[str, list[int]], block: int) -> list[int]:
    """Fill nodes (largest first) with whole blocks of consecutive ranks, then the leftovers."""
    world = layout.world_size
    order = sorted(by_node, key=lambda n: (-len(by_node[n]), by_node[n][0]))
    free = {n: list(by_node[n]) for n in order}
    rank_to_bundle = [-1] * world
    next_rank = 0
    for n in order:  # whole blocks first
        while len(free[n]) >= block and next_rank + block <= world:
            for r in range(next_rank, next_rank + block):
                rank_to_bundle[r] = free[n].pop(0)
            next_rank += block
    for n in order:  # whatever is left spans nodes
        while free[n] and next_rank < world:
            rank_to_bundle[next_rank] = free[n].pop(0)
            next_rank += 1
    return rank_to_bundle


def assign_ranks(
    layout: Layout, bundle_nodes: Sequence[str], plan_nodes: Sequence[str] | None = None
) -> RankMap:
    """Decide which bundle runs each rank; ``bundle_nodes[b]`` is the node bundle ``b`` landed on."""
    world = layout.world_size
    if len(bundle_nodes) != world:
        raise ValueError(f"{len(bundle_nodes)} bundles for a world of {world} ranks")
    if plan_nodes is not None and len(plan_nodes) != world:
        raise ValueError(f"plan places {len(plan_nodes)} ranks, layout has {world}")
    by_node = _bundles_by_node(bundle_nodes)
    candidates: list[tuple[str, list[int]]] = []
    if plan_nodes is not None:
        followed = _follow_plan(layout, by_node, plan_nodes)
        if followed is not None:
            candidates.append(("plan", followed))
    for name, block in (("blocks_tp_cp", layout.tp * layout.cp), ("blocks_tp", layout.tp)):
        candidates.append((name, _blocks(layout, by_node, block)))

    def cost(r2b: list[int]) -> tuple[int, int]:
        span = spanning_groups(layout, [bundle_nodes[b] for b in r2b])
        return (len(span.get("tp", [])), len(span.get("cp", [])))

    best_name, best = candidates[0]
    for name, r2b in candidates[1:]:
        if cost(r2b) < cost(best):
            best_name, best = name, r2b
    rank_to_node = [bundle_nodes[b] for b in best]
    return RankMap(best, rank_to_node, best_name, spanning_groups(layout, rank_to_node))
