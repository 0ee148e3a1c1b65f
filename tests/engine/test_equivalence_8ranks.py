"""Eight-rank layouts combining three of the four dimensions at a time (all four covered together),
with every schedule, ZeRO stage and CP method, equal the single process."""

import dataclasses

import pytest
from engine_harness import TINY, assert_equivalent, equivalence_inputs, run_equivalence

from workers.engine.launch import run_ranks

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)

# the tiny model with an FFN of 176 (not 172) so that tp=8 divides it
TINY8 = dataclasses.replace(TINY, name="tiny-ffn176", ffn=176)

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
    "tp=4,dp=2,zero=3",  # FSDP over TP-sharded dim 0 (strided shards): the global norm must count them
    "tp=2,dp=4,dp_replicate=2,zero=3",  # TP x HSDP with real shards: the norm counts each replica once
]


@pytest.mark.engine
@pytest.mark.slow
def test_eight_rank_layouts_match_single_process() -> None:
    results = run_ranks(run_equivalence, 8, SPECS, equivalence_inputs(TINY8), timeout_s=1800)
    assert_equivalent(results)
