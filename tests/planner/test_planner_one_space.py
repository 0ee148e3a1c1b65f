"""One search space: the free search explores every layout the cost model accepts.

Fixing a field to the value the free search chose can only narrow the space, so it can never find a
better plan; uneven pipeline and virtual stages are part of that space; a plan labelled
"interleaved" always has vpp >= 2.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import parse_spec, plan
from planner.spec import SpecError

pytestmark = pytest.mark.unit

FIELDS = ("tp", "pp", "cp", "dp", "vpp", "micro_batch", "sp", "zero", "recompute", "schedule", "cp_method",
          "dp_replicate")

ISSUE_SPEC: dict[str, Any] = {
    "model": {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256,
              "seq_len": 8192},
    "cluster": {"num_gpus": 512, "gpus_per_node": 8, "gpu_mem_gb": 96, "peak_tflops": 989.0,
                "intra_node_bw_GBps": 450, "inter_node_bw_Gbps_per_gpu": 400},
    "parallel": {"tp": 8, "pp": 8, "cp": 1, "dp": 8, "global_batch": 256, "sp": True, "zero": 3,
                 "recompute": "full", "schedule": "interleaved"},
    "precision": "fp8",
}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.sampled_from([3, 5, 6, 7, 8]), heads=st.sampled_from([4, 8]), seq=st.sampled_from([64, 512, 4096]),
       gpus=st.sampled_from([4, 6, 8, 16]), gpn=st.sampled_from([2, 4, 8]), gb=st.sampled_from([8, 16, 24]),
       mem=st.sampled_from([0.06, 0.2, 16.0]), precision=st.sampled_from(["bf16", "fp8"]),
       field=st.sampled_from(FIELDS))
def test_fixing_a_field_to_the_free_choice_never_finds_better(layers: int, heads: int, seq: int, gpus: int,
                                                              gpn: int, gb: int, mem: float, precision: str,
                                                              field: str) -> None:
    raw = {"model": {"layers": layers, "hidden": 64 * heads, "heads": heads, "kv_heads": heads // 2,
                     "ffn": 172 * heads, "vocab": 512, "seq_len": seq},
           "cluster": {"gpu_type": "H100", "num_gpus": gpus, "gpus_per_node": gpn, "gpu_mem_gb": mem},
           "training": {"global_batch": gb}, "precision": precision}
    free = plan(raw, top_k=1)
    if not free.plans:
        return
    best = free.plans[0]
    assert not (best.layout.schedule == "interleaved" and best.layout.vpp == 1)
    fixed = plan({**raw, "parallel": {field: getattr(best.layout, field)}}, top_k=1)
    assert fixed.plans, f"fixing {field} to the free choice left nothing"
    assert fixed.plans[0].estimate.step_time_s >= best.estimate.step_time_s * (1 - 1e-9), field


def test_issue_spec_explores_uneven_virtual_stages() -> None:
    fixed_vpp2 = plan({**ISSUE_SPEC, "parallel": {**ISSUE_SPEC["parallel"], "vpp": 2}}, top_k=1).plans[0]
    assert fixed_vpp2.layout.vpp == 2 and 126 % (8 * 2)  # uneven: 126 layers over 16 chunks
    free = plan(ISSUE_SPEC, top_k=5)
    assert free.plans
    for p in free.plans:
        assert p.layout.schedule == "interleaved" and p.layout.vpp >= 2
    assert free.plans[0].estimate.step_time_s <= fixed_vpp2.estimate.step_time_s
    assert free.plans[0].estimate.bubble_fraction < fixed_vpp2.estimate.bubble_fraction


def test_interleaved_with_one_virtual_stage_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**ISSUE_SPEC, "parallel": {**ISSUE_SPEC["parallel"], "vpp": 1}})
    assert err.value.field == "parallel.vpp"
    with pytest.raises(SpecError) as err:
        parse_spec({**ISSUE_SPEC, "parallel": {"vpp": 2, "schedule": "1f1b", "global_batch": 256}})
    assert err.value.field == "parallel.schedule"
