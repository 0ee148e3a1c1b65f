"""Re-planning: lost nodes, slow nodes, switch costs."""

from __future__ import annotations

from typing import Any

import pytest

from planner import Replan, SpecError, plan, replan
from tests.planner.conftest import a100_spec

pytestmark = pytest.mark.unit


def four_nodes() -> dict[str, Any]:
    return a100_spec(cluster={"gpu_type": "A100", "nodes": [{"id": f"n{i}", "gpus": 8} for i in range(4)]})


def test_node_lost_replans_on_what_remains() -> None:
    spec = four_nodes()
    before = plan(spec).plans[0]
    out = replan(before, before.layout, {"lost_nodes": ["n1"]}, spec)
    assert isinstance(out, Replan)
    assert out.decision in ("replan", "shrink_dp")
    assert "n1" not in out.plan.nodes_used and out.plan.num_gpus <= 24
    assert {s.node for s in out.plan.rank_grid} <= {"n0", "n2", "n3"}
    assert out.options["keep"]["rejected"]
    assert out.switch_cost_s >= 60.0  # the restart alone
    assert 0 < out.new_tokens_per_s < before.estimate.tokens_per_s
    assert out.old_tokens_per_s > 0 and out.reason
    assert out.to_dict()["decision"] == out.decision


def test_slow_node_is_left_out_when_faster() -> None:
    spec = four_nodes()
    before = plan(spec).plans[0]
    out = replan(before.to_dict(), before.layout.to_dict(), {"node_speeds": {"n3": 0.3}}, spec)
    assert out.decision != "keep"
    assert "n3" not in out.plan.nodes_used
    assert out.new_tokens_per_s > out.options["keep"]["tokens_per_s"]


def test_small_slowdown_keeps_the_plan() -> None:
    spec = four_nodes()
    before = plan(spec).plans[0]
    out = replan(before, None, {"node_speeds": {"n3": 0.97}}, spec)
    assert out.decision == "keep" and out.switch_cost_s == 0.0
    assert out.plan.layout == before.layout


def test_switch_cost_decides_on_a_short_horizon() -> None:
    spec = four_nodes()
    spec["training"] = {"global_batch": 256, "horizon_s": 30.0}
    before = plan(spec).plans[0]
    out = replan(before, before.layout, {"node_speeds": {"n3": 0.6}}, spec)
    assert out.decision == "keep"  # 30 s is less than any restart


def test_added_node_and_bad_change() -> None:
    spec = four_nodes()
    before = plan(spec).plans[0]
    out = replan(before, before.layout, {"added_nodes": [{"id": "n4", "gpus": 8}]}, spec)
    assert out.plan.num_gpus >= before.num_gpus
    with pytest.raises(SpecError) as info:
        replan(before, before.layout, {"lost_nodes": ["zz"]}, spec)
    assert info.value.field == "cluster_change.lost_nodes"
    with pytest.raises(SpecError) as info:
        replan(before, before.layout, {"teleport": 1}, spec)
    assert info.value.field == "cluster_change.teleport"


def test_runtime_shaped_spec_and_change() -> None:
    """The spec and change the runtime sends (workers/runtime/policy/planning.py): Ray node ids, a GPU cap,
    min_gpus, engine_only, a layout hint; re-plan with ``slow_nodes``."""
    spec = {
        "model": {"name": "tiny", "layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 172, "vocab": 256,
                  "seq_len": 64},
        "cluster": {"gpu_type": "CPU", "nodes": [{"id": f"ray-{i:02x}", "gpus": 4, "speed": 1.0} for i in range(3)],
                    "num_gpus": 12, "min_gpus": 4},
        "parallel": {"global_batch": 12, "tp": 2, "pp": 2},
        "training": {"restart_s": 5.0, "horizon_s": 600.0},
        "engine_only": True,
    }
    first = plan(spec).plans[0]
    assert first.layout.tp == 2 and first.layout.pp == 2
    assert all(s.node in {"ray-00", "ray-01", "ray-02"} for s in first.rank_grid)
    free = {**spec, "parallel": {"global_batch": 12}}
    out = replan(first, first.layout, {"lost_nodes": ["ray-01"], "slow_nodes": {"ray-02": 0.9}}, free)
    assert "ray-01" not in out.plan.nodes_used
    assert out.plan.layout.world_size <= 8 and out.plan.layout.recompute in ("none", "full")
    assert out.decision in ("replan", "shrink_dp")


def test_max_gpus_caps_the_replan_and_rejects_keep_above_it() -> None:
    """The scheduler's grant bounds a re-plan: after a node loss the job does not grow onto every free
    GPU of the survivors, and a shrink below the running size rules out ``keep``."""
    spec = four_nodes()
    spec["cluster"]["num_gpus"] = 16
    before = plan(spec).plans[0]
    assert before.num_gpus <= 16
    out = replan(before, before.layout, {"lost_nodes": ["n1"], "max_gpus": 16}, spec)
    assert out.plan.num_gpus <= 16 and "n1" not in out.plan.nodes_used
    uncapped = replan(before, before.layout, {"lost_nodes": ["n1"]}, spec)
    assert uncapped.plan.num_gpus > 16  # without the cap the survivors' 24 GPUs are all used
    shrink = replan(before, before.layout, {"max_gpus": 8}, spec)
    assert shrink.decision != "keep" and shrink.plan.num_gpus <= 8
    assert "more than the 8" in shrink.options["keep"]["rejected"]
    with pytest.raises(SpecError) as info:
        replan(before, before.layout, {"max_gpus": 0}, spec)
    assert info.value.field == "cluster_change.max_gpus"
