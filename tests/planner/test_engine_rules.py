"""One home for the engine's limits (``planner/engine_rules.py``), called by the planner's engine-only
search and by the engine's validation: a plan made for the engine is never refused by it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from planner import engine_rules
from planner.api import plan
from planner.layout import Layout
from workers.engine.config import ModelConfig
from workers.engine.validate import layout_problems

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _raw(model: dict[str, int], nodes: list[int], gb: int, fixed: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": model,
        "cluster": {"gpu_type": "cpu", "nodes": [{"id": f"n{i}", "gpus": g} for i, g in enumerate(nodes)],
                    "allow_fewer": True},
        "parallel": dict(fixed),
        "training": {"global_batch": gb},
        "engine_only": True,
    }


@st.composite
def small_specs(draw: st.DrawFn) -> dict[str, Any]:
    fixed = draw(st.sampled_from([{}, {"schedule": "interleaved"}, {"pp": 2}, {"pp": 4}, {"vpp": 2},
                                  {"sp": True}, {"cp_method": "ulysses"}, {"tp": 2}, {"cp": 2},
                                  {"micro_batch": 1}, {"dp_replicate": 2}, {"dp_replicate": 2, "zero": 1},
                                  {"recompute": "op"}, {"recompute": "layer:3"}, {"recompute": "selective_layer"},
                                  {"recompute": "op", "pp": 2}]))
    heads = draw(st.sampled_from([2, 4, 6, 8]))
    kv = draw(st.sampled_from([d for d in (1, 2, 3, 4, 6, 8) if heads % d == 0]))
    model = {
        # layer:N past the model's layers is a spec error (planner/spec.py), not a plan to check
        "layers": draw(st.integers(3 if fixed.get("recompute") == "layer:3" else 1, 8)),
        "hidden": heads * draw(st.sampled_from([4, 8])),
        "heads": heads,
        "kv_heads": kv,
        "ffn": draw(st.sampled_from([24, 48, 96, 172])),
        "vocab": draw(st.sampled_from([96, 100, 128, 250, 256])),
        "seq_len": draw(st.sampled_from([12, 16, 24, 32, 48, 60, 64])),
    }
    nodes = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3))
    gb = draw(st.integers(1, 16))
    return _raw(model, nodes, gb, fixed)


@SETTINGS
@given(small_specs())
def test_every_engine_only_plan_is_accepted_by_the_engine(raw: dict[str, Any]) -> None:
    result = plan(raw, top_k=5)
    event(f"plans returned: {min(len(result.plans), 1)}")
    cfg = ModelConfig(name="prop", **raw["model"])
    for p in result.plans:
        assert layout_problems(cfg, p.layout, raw["training"]["global_batch"], world_size=p.num_gpus) == [], (
            p.layout.short(), raw)


def test_engine_only_rules_reject_what_the_engine_refuses() -> None:
    """The rules that used to live only in the engine now also shape the planner's engine-only search."""
    model = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 64, "vocab": 100, "seq_len": 64}
    # vocab 100 does not split over tp=8: the engine's vocab-parallel loss refuses it
    result = plan(_raw(model, [8], 8, {"tp": 8}), top_k=3)
    assert not result.plans and result.rejected_counts.get("vocab"), result.rejected_counts
    # interleaved with 6 micro-batches on pp=4: Megatron's rule (6 % 4) refuses it, the engine's runs it
    lay = Layout.parse("pp=4,vpp=1,schedule=interleaved").with_global_batch(6)
    shape = ModelConfig(name="m", **model)
    assert engine_rules.schedule_rule(lay, 6) is None and layout_problems(shape, lay, 6) == []
    # 1F1B needs at least pp micro-batches per step
    lay = Layout.parse("pp=4").with_global_batch(2)
    assert engine_rules.schedule_rule(lay, 2) == (
        "schedule", "schedule 1f1b needs at least pp=4 micro-batches per step, got 2")
    result = plan(_raw(model, [4], 2, {"pp": 4, "schedule": "1f1b"}), top_k=3)
    assert not result.plans and result.rejected_counts.get("schedule"), result.rejected_counts
    # sequence parallelism: the per-CP-rank sequence must split over tp
    odd = dict(model, seq_len=12)
    result = plan(_raw(odd, [8], 8, {"tp": 8, "sp": True, "cp": 1}), top_k=3)
    assert all(not p.layout.sp for p in result.plans)
    assert engine_rules.cp_rule(ModelConfig(name="o", **dict(odd, vocab=128)), Layout.parse("tp=8,sp=true")) == (
        "sp", "per-CP-rank sequence 12 not divisible by tp=8 (sequence parallelism)")


def test_engine_validation_words_the_same_rules() -> None:
    cfg = ModelConfig(name="m", layers=4, hidden=64, heads=8, kv_heads=4, ffn=64, vocab=100, seq_len=64)
    lay = Layout.parse("tp=8")
    assert layout_problems(cfg, lay, 8) == [r for _, r in engine_rules.refusals(cfg, lay, 8)]
    assert engine_rules.first_refusal(cfg, lay, 8) == ("vocab", "vocab 100 not divisible by tp=8")


@pytest.mark.parametrize("mode", ["op", "layer:4", "selective_op", "layer", "full", "selective", "none"])
def test_engine_only_plans_with_a_fixed_recompute_mode_are_run_by_the_engine(mode: str) -> None:
    """TorchTitan's op-level and layer-level modes are planned for the engine and pass its validation."""
    model = {"layers": 8, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 172, "vocab": 256, "seq_len": 64}
    result = plan(_raw(model, [4], 8, {"recompute": mode}), top_k=3)
    assert result.plans, result.rejected_counts
    cfg = ModelConfig(name="m", **model)
    for p in result.plans:
        assert p.layout.recompute == {"selective_op": "op", "layer": "layer:2"}.get(mode, mode)
        assert layout_problems(cfg, p.layout, 8, world_size=p.num_gpus) == []


def test_unknown_recompute_is_refused_with_the_engines_modes() -> None:
    assert engine_rules.ENGINE_RECOMPUTE == ("none", "selective", "op", "layer:N", "full")
    assert all(engine_rules.recompute_rule(m) is None for m in ("none", "selective", "op", "layer:2", "layer:9",
                                                                "full"))
    assert engine_rules.recompute_rule("sometimes") == (
        "recompute", "the engine runs recompute none, selective, op, layer:N, full (N an integer >= 2), "
                     "not 'sometimes'")
    assert engine_rules.recompute_rule("layer:1")[0] == "recompute"
    # a Layout cannot hold an unknown mode; one that does anyway is refused by the engine's validation
    cfg = ModelConfig(name="m", layers=4, hidden=64, heads=8, kv_heads=4, ffn=64, vocab=128, seq_len=64)
    lay = Layout.parse("dp=2")
    object.__setattr__(lay, "recompute", "layer:1")  # frozen: past Layout's own check
    assert any("the engine runs recompute" in r for r in layout_problems(cfg, lay, 8))
