"""The pruned search finds exactly the best step time of a naive exhaustive search."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.planner import naive_search
from planner import parse_spec, plan

pytestmark = pytest.mark.unit


@settings(max_examples=12, deadline=None)
@given(gpus=st.sampled_from([4, 6, 8, 12]), gpn=st.sampled_from([2, 4]), layers=st.sampled_from([4, 6, 8]),
       seq=st.sampled_from([64, 256, 4096]), gb=st.sampled_from([8, 12, 24]), mem=st.sampled_from([0.05, 16.0]))
def test_pruning_is_exact(gpus: int, gpn: int, layers: int, seq: int, gb: int, mem: float) -> None:
    raw = {"model": {"layers": layers, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 688, "vocab": 512,
                     "seq_len": seq},
           "cluster": {"gpu_type": "A100", "num_gpus": gpus, "gpus_per_node": gpn, "gpu_mem_gb": mem},
           "training": {"global_batch": gb}}
    naive = naive_search(parse_spec(raw))
    result = plan(raw, top_k=3)
    if math.isinf(naive["best_step_s"]):
        assert not result.plans
    else:
        assert result.plans[0].estimate.step_time_s == pytest.approx(naive["best_step_s"], rel=1e-9)
