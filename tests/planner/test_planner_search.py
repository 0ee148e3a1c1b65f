"""The search: every returned plan is valid; rank grids are permutations; TP stays in a node."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import Layout, Plan, PlanResult, Rejection, evaluate, parse_spec, plan
from planner.constraints import check_all
from planner.grid import block_fits, rank_grid
from planner.memory import memory_limit_gb
from planner.spec import NodeSpec
from tests.planner.conftest import a100_spec, tiny_spec

pytestmark = pytest.mark.unit

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_plan_valid(raw: dict[str, Any], p: Plan, engine_only: bool = False) -> None:
    spec = parse_spec(raw, engine_only=engine_only)
    lay = p.layout
    assert check_all(spec, lay) is None
    assert lay.world_size == p.num_gpus <= spec.cluster.num_gpus
    assert p.num_gpus >= (spec.cluster.min_gpus or spec.cluster.num_gpus)
    assert spec.global_batch == lay.dp * lay.micro_batch * lay.num_micro_batches
    assert p.estimate.memory_gb_per_gpu <= memory_limit_gb(spec)
    for name, value in spec.fixed.items():
        assert getattr(lay, name) == value, name
    ranks = [s.rank for s in p.rank_grid]
    assert ranks == list(range(lay.world_size))
    slots = {(str(s.node), s.local_gpu) for s in p.rank_grid}
    assert len(slots) == lay.world_size  # no GPU used twice
    capacity = {str(n.id): n.gpus for n in spec.cluster.nodes}
    assert all(0 <= s.local_gpu < capacity[str(s.node)] for s in p.rank_grid)
    used = [n.gpus for n in spec.cluster.nodes if n.id in p.nodes_used]
    if block_fits(lay.tp, lay.world_size, used):  # TP can stay inside nodes, so it must
        assert p.spanning_counts["tp"] == 0
        for group in lay.groups("tp"):
            assert len({p.rank_grid[r].node for r in group}) == 1
    if engine_only:
        assert lay.recompute in ("none", "full")
        assert spec.model.layers % (lay.pp * lay.vpp) == 0
    est = p.estimate
    assert est.step_time_s > 0 and 0 < est.mfu < 1 and est.tokens_per_s > 0


def test_runtime_tiny_job_is_fast_and_valid() -> None:
    raw = tiny_spec(parallel={"tp": 2}, engine_only=True)
    t0 = time.perf_counter()
    result = plan(raw)
    assert time.perf_counter() - t0 < 2.0
    assert result.plans
    for p in result.plans:
        assert_plan_valid(raw, p, engine_only=True)
        assert p.layout.tp == 2
        assert p.spanning_counts["tp"] == 0
        assert {s.node for s in p.rank_grid} <= {"node-0", "node-1", "node-2"}


@FAST
@given(
    layers=st.sampled_from([2, 4, 6, 8]),
    heads=st.sampled_from([4, 8, 12]),
    kv_div=st.sampled_from([1, 2, 4]),
    seq=st.sampled_from([32, 64, 96]),
    nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    gb=st.sampled_from([4, 6, 8, 12, 16]),
    engine_only=st.booleans(),
    fixed=st.sampled_from([{}, {"tp": 2}, {"pp": 2}, {"zero": 1}, {"recompute": "full"}, {"micro_batch": 2}]),
    fewer=st.booleans(),
)
def test_every_returned_plan_satisfies_every_constraint(layers: int, heads: int, kv_div: int, seq: int,
                                                        nodes: list[int], gb: int, engine_only: bool,
                                                        fixed: dict[str, Any], fewer: bool) -> None:
    kv = max(1, heads // kv_div) if heads % max(1, heads // kv_div) == 0 else heads
    raw = {
        "model": {"layers": layers, "hidden": heads * 8, "heads": heads, "kv_heads": kv, "ffn": heads * 20,
                  "vocab": 128, "seq_len": seq},
        "cluster": {"gpu_type": "cpu", "nodes": [{"id": f"n{i}", "gpus": g} for i, g in enumerate(nodes)],
                    "allow_fewer": fewer},
        "parallel": dict(fixed),
        "training": {"global_batch": gb},
        "engine_only": engine_only,
    }
    if "micro_batch" in fixed and gb % fixed["micro_batch"]:
        return
    result = plan(raw, top_k=3)
    for p in result.plans:
        assert_plan_valid(raw, p, engine_only=engine_only)
    for rej in result.rejected:
        assert rej.reason
    times = [p.estimate.step_time_s for p in result.plans]
    assert times == sorted(times)
    if not result.plans:
        assert result.rejected_counts


@FAST
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 3]),
       pp=st.sampled_from([1, 2, 3]), gpn=st.sampled_from([2, 4, 8]), spare=st.integers(0, 1))
def test_rank_grid_is_a_permutation_and_tp_stays_in_a_node(tp: int, cp: int, dp: int, pp: int, gpn: int,
                                                          spare: int) -> None:
    lay = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
    n_nodes = -(-lay.world_size // gpn) + spare
    nodes = [NodeSpec(id=f"n{i}", gpus=gpn) for i in range(n_nodes)]
    if tp > gpn or (lay.world_size > gpn * n_nodes):
        return
    slots, groups, counts = rank_grid(lay, nodes)
    assert [s.rank for s in slots] == list(range(lay.world_size))
    assert len({(s.node, s.local_gpu) for s in slots}) == lay.world_size
    node_of = {s.rank: s.node for s in slots}
    for group in lay.groups("tp"):
        assert len({node_of[r] for r in group}) == 1
    assert counts["tp"] == 0 and not [g for g in groups if g.dim == "tp"]
    # spanning counts agree with a brute-force count
    for dim in ("cp", "dp", "pp"):
        brute = sum(1 for g in lay.groups(dim) if len({node_of[r] for r in g}) > 1)  # type: ignore[arg-type]
        assert counts[dim] == brute


def test_tp_group_kept_in_node_with_uneven_nodes_and_marked_when_impossible() -> None:
    lay = Layout(tp=4, dp=2)
    slots, _, counts = rank_grid(lay, [NodeSpec("a", 2), NodeSpec("b", 4), NodeSpec("c", 4)])
    assert counts["tp"] == 0 and {s.node for s in slots} == {"b", "c"}
    slots, groups, counts = rank_grid(Layout(tp=8), [NodeSpec("a", 4), NodeSpec("b", 4)])
    assert counts["tp"] == 1 and groups[0].dim == "tp" and groups[0].nodes == ("a", "b")


def test_fixed_fields_are_honoured_and_dp_left_free() -> None:
    raw = a100_spec(parallel={"tp": 2, "pp": 2})
    result = plan(raw)
    assert result.plans and all(p.layout.tp == 2 and p.layout.pp == 2 for p in result.plans)
    assert {p.layout.dp * p.layout.cp for p in result.plans} == {8}
    assert len({p.layout.dp for p in result.plans}) > 1  # dp is searched


def test_fewer_gpus_when_allowed() -> None:
    raw = tiny_spec()
    raw["cluster"]["nodes"][2]["speed"] = 0.2
    exact = plan(raw)
    assert all(p.num_gpus == 12 for p in exact.plans)
    raw["cluster"]["min_gpus"] = 4
    fewer = plan(raw)
    assert fewer.plans[0].estimate.step_time_s <= exact.plans[0].estimate.step_time_s
    assert "node-2" not in fewer.plans[0].nodes_used  # the slow node is left out
    assert all(4 <= p.num_gpus <= 12 for p in fewer.plans)


def test_engine_only_restrictions() -> None:
    raw = a100_spec(model={"name": "llama3-8b", "layers": 30})
    result = plan(raw, engine_only=True, top_k=8)
    assert result.plans
    for p in result.plans:
        assert_plan_valid(raw, p, engine_only=True)
    general = plan(raw, top_k=8)
    assert any(30 % (p.layout.pp * p.layout.vpp) for p in general.plans) or general.searched > result.searched


def test_rejections_have_reasons() -> None:
    raw = a100_spec(model={"name": "llama3-70b"}, cluster={"gpu_type": "A100", "num_gpus": 8},
                    parallel={"tp": 1, "pp": 1, "zero": 0})
    result = plan(raw)
    assert not result.plans
    assert result.rejected_counts.get("memory")
    assert any("GiB" in r.reason for r in result.rejected)
    bad_tp = evaluate(a100_spec(), Layout(tp=3, dp=10))
    assert isinstance(bad_tp, Rejection) and "heads" in bad_tp.reason
    interleaved = evaluate(a100_spec(training={"global_batch": 36}), Layout.parse("tp=2,pp=4,dp=4,vpp=2"))
    assert isinstance(interleaved, Rejection)
    assert "interleaved" in interleaved.reason or "divisible" in interleaved.reason
    cp_bad = evaluate(a100_spec(model={"name": "llama3-8b", "seq_len": 8190}), Layout(tp=2, cp=2, dp=8))
    assert isinstance(cp_bad, Rejection) and "2*cp" in cp_bad.reason


def test_plan_result_round_trips_through_json() -> None:
    result = plan(tiny_spec())
    text = json.dumps(result.to_dict())
    back = PlanResult.from_dict(json.loads(text))
    assert back.plans == result.plans
    p = result.plans[0]
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.version == 1 and p.to_dict()["version"] == 1
    with pytest.raises(AttributeError):
        p.num_gpus = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="newer"):
        Plan.from_dict({**p.to_dict(), "version": 99})
