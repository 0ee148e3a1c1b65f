"""Replica groups (HSDP, ``dp = dp_replicate x dp_shard``): the layout's rank order and groups, the
validation, how the planner prices them and that its search picks them when they are faster."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from planner import Layout, Plan, evaluate, parse_spec, plan, replan
from planner.layout import LayoutError
from planner.memory import estimate_memory
from planner.search import links_for
from planner.spec import SpecError
from planner.timing import estimate_time, hardware_for, replica_allreduce_s

pytestmark = pytest.mark.unit

# 2 nodes x 8 GPUs with a slow inter-node link: FSDP over all 16 ranks gathers across nodes on
# every micro-batch; HSDP with 8-rank shard groups gathers over NVLink and only all-reduces an
# eighth of the gradient across nodes
SLOW_IB: dict[str, Any] = {
    "model": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 1024},
    "cluster": {"gpu_type": "H100", "num_gpus": 16, "gpus_per_node": 8, "inter_node_bw_Gbps_per_gpu": 25},
    "parallel": {"tp": 1, "pp": 1, "cp": 1, "zero": 3},
    "training": {"global_batch": 16},
}


def test_rank_order_puts_the_replica_index_slowest_inside_dp() -> None:
    lay = Layout.parse("tp=2,dp=4,dp_replicate=2,zero=3,pp=2")
    assert lay.dp_shard == 2 and lay.world_size == 16  # world = DP x PP x TP x CP, dp counts both
    for rank in range(lay.world_size):
        c = lay.coords(rank)
        assert lay.replica_of(rank) == c.dp // lay.dp_shard
    # one replica group's ranks of a pipeline stage are contiguous: blocks of tp*cp*dp_shard = 4
    assert lay.replica_groups() == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    # shard groups stay inside a replica group; replicate groups take one rank from each
    for g in lay.shard_groups():
        assert len({lay.replica_of(r) for r in g}) == 1 and len(g) == lay.dp_shard * lay.cp
    for g in lay.replicate_groups():
        assert sorted(lay.replica_of(r) for r in g) == list(range(lay.dp_replicate))
    for groups in (lay.shard_groups(), lay.replicate_groups(), lay.replica_groups()):
        assert sorted(r for g in groups for r in g) == list(range(lay.world_size))
    # without replica groups the shard group is the whole DP x CP group
    plain = Layout.parse("cp=2,dp=2,zero=1")
    assert plain.shard_groups() == plain.groups("dp", "cp") and plain.replica_groups() == [list(range(4))]


def test_layout_string_round_trips_and_bad_values_name_the_field() -> None:
    for text in ("tp=2,dp=4,dp_replicate=2,zero=3", "cp=2,dp=6,dp_replicate=3,zero=1,micro_batch=2", "pp=2,vpp=2"):
        lay = Layout.parse(text)
        assert Layout.parse(lay.spec()) == lay
    assert "dp_replicate=2" in Layout.parse("dp=4,dp_replicate=2,zero=1").spec()
    assert Layout.parse("dp=4,dp_replicate=2,zero=1").short() == "tp1·pp1·cp1·dp4·rep2"
    with pytest.raises(LayoutError, match="'dp_replicate' \\(3\\) must divide dp \\(4\\)"):
        Layout.parse("dp=4,dp_replicate=3,zero=1")
    with pytest.raises(LayoutError, match="'dp_replicate' > 1 needs zero=1 or zero=3"):
        Layout.parse("dp=4,dp_replicate=2")
    with pytest.raises(LayoutError, match="'dp_replicate' must be an integer >= 1"):
        Layout.parse("dp=4,dp_replicate=0,zero=3")
    with pytest.raises(SpecError) as err:
        parse_spec({**SLOW_IB, "parallel": {"dp_replicate": 2, "zero": 0}})
    assert err.value.field == "parallel.dp_replicate"
    with pytest.raises(SpecError) as err:
        parse_spec({**SLOW_IB, "parallel": {"dp": 4, "dp_replicate": 3}})
    assert err.value.field == "parallel.dp_replicate"


def test_zero_state_is_divided_by_dp_shard_not_dp() -> None:
    roomy = {**SLOW_IB, "cluster": {**SLOW_IB["cluster"], "gpu_mem_gb": 10_000}}
    spec = parse_spec(roomy)
    for zero in (1, 3):
        hsdp = estimate_memory(spec, Layout.parse(f"dp=16,dp_replicate=4,zero={zero}").with_global_batch(16))
        four = estimate_memory(spec, Layout.parse(f"dp=4,zero={zero}").with_global_batch(16))
        sixteen = estimate_memory(spec, Layout.parse(f"dp=16,zero={zero}").with_global_batch(16))
        for part in ("weights", "grads", "optimizer"):
            assert hsdp.components[part] == pytest.approx(four.components[part])
        assert hsdp.components["optimizer"] == pytest.approx(4 * sixteen.components["optimizer"])


def _cost(raw: dict[str, Any], text: str) -> Plan:
    result = evaluate(raw, Layout.parse(text))
    assert isinstance(result, Plan), result
    return result


def test_hsdp_is_priced_by_shard_collectives_plus_the_cross_replica_all_reduce() -> None:
    # the cross-replica all-reduce is priced on its own link: make that link 1000x slower and the
    # exposed ZeRO-3 communication grows, the shard collectives' link unchanged
    spec = parse_spec(SLOW_IB)
    hw = hardware_for(spec, 1.0)
    lay = Layout.parse("dp=16,dp_replicate=2,zero=3").with_global_batch(16)
    links = links_for(hw, 1, 1, 16, 1, ((8, 2),), 2)
    assert links.dp_shard[0] > links.dp_replicate[0]  # shard group on NVLink, replicas across nodes
    slow = dataclasses.replace(links, dp_replicate=(links.dp_replicate[0] / 1000, links.dp_replicate[1]))
    base = estimate_time(spec, hw, lay, links).components["zero3_comm"]
    assert estimate_time(spec, hw, lay, slow).components["zero3_comm"] > 10 * base
    assert replica_allreduce_s("bf16", 1e9, 8, 1, links.dp_replicate) == 0.0
    # two nodes, slow link: the 8-rank shard groups gather inside a node, much cheaper than across
    plain = _cost(SLOW_IB, "dp=16,zero=3")
    hsdp = _cost(SLOW_IB, "dp=16,dp_replicate=2,zero=3")
    assert hsdp.estimate.step_time_s < plain.estimate.step_time_s
    assert hsdp.estimate.memory_gb_per_gpu > plain.estimate.memory_gb_per_gpu
    # zero=1: the optimizer step runs on a shard of dp_shard, not dp
    z1 = _cost(SLOW_IB, "dp=16,dp_replicate=2,zero=1")
    z1_plain = _cost(SLOW_IB, "dp=16,zero=1")
    assert z1.estimate.time_breakdown_s["optimizer"] == pytest.approx(2 * z1_plain.estimate.time_breakdown_s["optimizer"])


def test_search_picks_replica_groups_when_they_are_faster_and_honours_a_fixed_count() -> None:
    free = plan(SLOW_IB, top_k=3).plans[0]
    assert free.layout.dp_replicate == 2, free.layout.spec()  # shard group = one node
    for r in (1, 4):
        fixed = plan({**SLOW_IB, "parallel": {**SLOW_IB["parallel"], "dp_replicate": r}}, top_k=1).plans[0]
        assert fixed.layout.dp_replicate == r
        assert fixed.estimate.step_time_s > free.estimate.step_time_s
    # a fixed count that divides no dp is rejected with the field named
    result = plan({**SLOW_IB, "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp_replicate": 3}}, top_k=1)
    assert not result.plans and result.rejected_counts.get("dp_replicate")
    # rank placement keeps a replica group's shard block on one node
    slots = {s.rank: s.node for s in free.rank_grid}
    for g in free.layout.shard_groups():
        assert len({slots[r] for r in g}) == 1


def test_losing_a_node_of_a_replicated_plan_drops_whole_replica_groups() -> None:
    spec = {**SLOW_IB, "cluster": {"gpu_type": "H100", "inter_node_bw_Gbps_per_gpu": 25,
                                   "nodes": [{"id": f"n{i}", "gpus": 8} for i in range(4)]},
            "training": {"global_batch": 32}}
    before = plan(spec, top_k=1).plans[0]
    assert before.layout.dp_replicate == 4 and before.layout.dp_shard == 8, before.layout.spec()
    out = replan(before, before.layout, {"lost_nodes": ["n1"]}, spec)
    # shrinking DP walks every DP count the batch allows (32 .. 1): counts that 4 replica groups of 8
    # do not fit give up the replica groups instead of an invalid layout (this raised LayoutError)
    assert out.options["shrink_dp"]["num_gpus"] <= 24
    assert "n1" not in out.plan.nodes_used
