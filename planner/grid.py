"""Rank grid: Megatron rank order mapped onto (node, local GPU).

Ranks are numbered tp fastest, then cp, dp, pp (see :mod:`planner.layout`). We fill nodes in
order with *blocks* of consecutive ranks and never split a block across nodes: the block is the
largest of ``world``, ``tp·cp·dp``, ``tp·cp·dp_shard`` (one replica group's share of a pipeline
stage, with replica groups), ``tp·cp``, ``tp`` whose copies fit into the nodes' GPU counts.
So a TP group (a block of ``tp`` consecutive ranks) stays inside one node whenever any placement
can do that; when none can (``tp`` larger than a node), ranks fill the GPUs in order and the plan
lists the groups that span nodes. The node of a rank never decreases with the rank, so a group
spans nodes iff its first and last rank sit on different nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.layout import Layout
from planner.result import RankSlot, SpanningGroup
from planner.spec import NodeSpec

MAX_LISTED_GROUPS = 256


def gpu_histogram(gpus: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(GPUs per node, number of such nodes): the compact form :func:`block_fits` works on."""
    hist: dict[int, int] = {}
    for g in gpus:
        hist[g] = hist.get(g, 0) + 1
    return tuple(sorted(hist.items()))


def block_fits(block: int, world: int, gpus: Sequence[int] | tuple[tuple[int, int], ...]) -> bool:
    """Can ``world`` ranks be placed as blocks of ``block`` consecutive ranks, none split?

    ``gpus`` is the GPU count of every node, or its :func:`gpu_histogram`.
    """
    hist = gpus if gpus and isinstance(gpus[0], tuple) else gpu_histogram(gpus)  # type: ignore[arg-type]
    if block <= 1:
        return sum(g * n for g, n in hist) >= world
    return sum((g // block) * n for g, n in hist) * block >= world


def placement_block(lay: Layout, gpus: Sequence[int]) -> int:
    world = lay.world_size
    for block in (world, lay.tp * lay.cp * lay.dp, lay.tp * lay.cp * lay.dp_shard, lay.tp * lay.cp, lay.tp):
        if block_fits(block, world, gpus):
            return block
    return 1


def node_of_ranks(lay: Layout, nodes: Sequence[NodeSpec]) -> list[tuple[int, int]]:
    """(node index, local GPU) for every rank."""
    gpus = [n.gpus for n in nodes]
    world = lay.world_size
    if sum(gpus) < world:
        raise ValueError(f"{world} ranks do not fit on {sum(gpus)} GPUs")
    block = placement_block(lay, gpus)
    out: list[tuple[int, int]] = []
    for node, g in enumerate(gpus):
        take = min(g // block * block, world - len(out))  # whole blocks only
        out.extend([(node, i) for i in range(take)])
        if len(out) >= world:
            break
    return out


def _groups_spanning(lay: Layout, dim: str, node_idx: list[int]) -> tuple[int, list[list[int]]]:
    stride = {"tp": 1, "cp": lay.tp, "dp": lay.tp * lay.cp, "pp": lay.tp * lay.cp * lay.dp}[dim]
    size = lay.size(dim)  # type: ignore[arg-type]
    if size == 1:
        return 0, []
    span = stride * (size - 1)
    count = 0
    listed: list[list[int]] = []
    for outer in range(0, lay.world_size, stride * size):
        for base in range(outer, outer + stride):
            if node_idx[base] != node_idx[base + span]:
                count += 1
                if len(listed) < MAX_LISTED_GROUPS:
                    listed.append([base + i * stride for i in range(size)])
    return count, listed


def rank_grid(lay: Layout, nodes: Sequence[NodeSpec]) -> tuple[
        tuple[RankSlot, ...], tuple[SpanningGroup, ...], dict[str, int]]:
    """Slots for every rank, the TP/CP groups that span nodes, and per-dimension spanning counts."""
    placed = node_of_ranks(lay, nodes)
    node_idx = [n for n, _ in placed]
    ids = [n.id for n in nodes]
    slots = tuple(map(RankSlot._make, zip(range(len(placed)), [ids[n] for n in node_idx],
                                          [g for _, g in placed], strict=True)))
    groups: list[SpanningGroup] = []
    counts: dict[str, int] = {}
    for dim in ("tp", "cp", "dp", "pp"):
        count, listed = _groups_spanning(lay, dim, node_idx)
        counts[dim] = count
        if dim in ("tp", "cp"):
            for ranks in listed:
                nodes_of = tuple(dict.fromkeys(nodes[node_idx[r]].id for r in ranks))
                groups.append(SpanningGroup(dim=dim, ranks=tuple(ranks), nodes=nodes_of))
    return slots, tuple(groups), counts
