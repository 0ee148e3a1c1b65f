"""Placement on the session cluster: gang all-or-nothing with a timeout, interleaved bundles mapped
topology-aware, node-id label selectors keep bundles off excluded nodes. No torch: cheap."""

from __future__ import annotations

import pytest

from planner.layout import Layout
from workers.runtime.cluster import placement_groups as placement
from workers.runtime.cluster.ranks import assign_ranks, spanning_groups

pytestmark = pytest.mark.cluster


def test_spread_bundles_come_back_interleaved_and_ranks_keep_tp_cp_on_one_node(ray_cluster) -> None:
    res = placement.reserve(12, strategy="SPREAD", timeout_s=30, name="t-spread")
    assert res is not None
    try:
        nodes = res.bundle_nodes
        assert len(set(nodes)) == 3
        # SPREAD interleaves: consecutive bundles sit on different nodes
        assert any(nodes[i] != nodes[i + 1] for i in range(len(nodes) - 1))
        lay = Layout(tp=2, cp=2, dp=3)
        assert spanning_groups(lay, nodes), "the identity mapping would already keep groups together"
        rm = assign_ranks(lay, nodes)
        assert rm.spanning == {}
        for g in lay.groups("tp") + lay.groups("cp") + lay.groups("tp", "cp"):
            assert len({rm.rank_to_node[r] for r in g}) == 1
        assert sorted(rm.rank_to_bundle) == list(range(12))
        assert [nodes[b] for b in rm.rank_to_bundle] == rm.rank_to_node
    finally:
        placement.release(res)


def test_gang_is_all_or_nothing_and_times_out_without_leaving_anything(ray_cluster) -> None:
    assert placement.reserve(13, timeout_s=1.5, name="t-too-big") is None
    assert placement.live_placement_groups("t-too-big") == []


def test_label_selector_keeps_bundles_on_the_chosen_nodes(ray_cluster) -> None:
    views = placement.cluster_nodes()
    assert [v.gpus for v in views] == [4, 4, 4]
    allowed = [views[0].id, views[2].id]
    res = placement.reserve(8, nodes=allowed, timeout_s=30, name="t-select")
    assert res is not None
    try:
        assert set(res.bundle_nodes) == set(allowed)
        free = {v.id: v.free_gpus for v in placement.cluster_nodes()}
        assert free[views[1].id] == 4 and free[views[0].id] == 0
        held = {views[0].id: 4}
        assert {v.id: v.free_gpus for v in placement.cluster_nodes(held=held)}[views[0].id] == 4
    finally:
        placement.release(res)
