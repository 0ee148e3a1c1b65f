"""Eight-rank layouts combining three of the four dimensions at a time (all four covered together),
with every schedule, ZeRO stage and CP method, equal the single process."""

import pytest
from engine_harness import assert_equivalent, equivalence_inputs, run_equivalence

from workers.engine.launch import run_ranks

SPECS = [
    "tp=2,cp=2,pp=2",
    "tp=2,pp=2,dp=2,vpp=2",
    "tp=2,cp=2,dp=2,zero=1",
    "cp=2,pp=2,dp=2,zero=3",
    "tp=2,cp=2,pp=2,schedule=gpipe",
    "tp=2,pp=2,dp=2,zero=3",
    "cp=2,pp=2,dp=2,cp_method=ulysses,vpp=2",
    "tp=8",  # tp > kv_heads: KV heads replicated
    "tp=4,dp=2,zero=1",
]


@pytest.mark.engine
@pytest.mark.slow
def test_eight_rank_layouts_match_single_process() -> None:
    results = run_ranks(run_equivalence, 8, SPECS, equivalence_inputs(), timeout_s=1800)
    assert_equivalent(results)
