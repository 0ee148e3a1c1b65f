"""Every 4-rank factorisation tp*cp*pp*dp = 4 (plus ZeRO / schedule / CP-method variants) equals the
single process: loss 1e-5 relative, every gradient 1e-4, 10 AdamW steps 1e-4 relative."""

import pytest

from engine_harness import assert_equivalent, run_equivalence
from workers.engine.launch import run_ranks

SPECS = [
    # the ten factorisations of 4 over (tp, cp, pp, dp)
    "tp=4",  # one KV head per TP rank
    "cp=4",
    "pp=4",
    "dp=4",
    "tp=2,cp=2",
    "tp=2,pp=2",
    "tp=2,dp=2",
    "cp=2,pp=2",
    "cp=2,dp=2",
    "pp=2,dp=2",
    # variants
    "tp=2,dp=2,zero=3",  # FSDP2 + TP DTensors
    "cp=2,dp=2,zero=1",  # optimizer state sharded over dp*cp
    "pp=2,dp=2,vpp=2",  # interleaved
    "cp=4,cp_method=ulysses",
    "pp=4,micro_batch=1",  # 8 micro-batches through a 4-stage 1F1B
]


@pytest.mark.engine
def test_every_four_rank_layout_matches_single_process() -> None:
    results = run_ranks(run_equivalence, 4, SPECS, timeout_s=1200)
    assert_equivalent(results)
    peak = {r["spec"]: r["in_flight_peak"] for r in results[0]}
    assert peak["pp=4,micro_batch=1"] == 4  # at most pp in flight on the first stage
