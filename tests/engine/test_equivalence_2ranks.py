"""Every 2-rank layout (and its schedule / ZeRO / CP-method / SP variants) equals the single process."""

import pytest

from engine_harness import assert_equivalent, run_equivalence
from workers.engine.launch import run_ranks

SPECS = [
    "tp=2",  # TP + SP (the default companion)
    "tp=2,sp=false",
    "cp=2",  # ring attention
    "cp=2,cp_method=ulysses",
    "pp=2",  # 1F1B
    "pp=2,schedule=gpipe,micro_batch=1",
    "pp=2,vpp=2",  # interleaved 1F1B
    "pp=2,micro_batch=1",  # 8 micro-batches through 1F1B
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=3",
    "dp=2,micro_batch=1",  # gradient accumulation over 4 micro-batches
]


@pytest.mark.engine
def test_every_two_rank_layout_matches_single_process() -> None:
    results = run_ranks(run_equivalence, 2, SPECS, timeout_s=900)
    assert_equivalent(results)
    by_spec = {r["spec"]: r for r in results[0]}
    # 1F1B keeps at most pp micro-batches in flight on the first stage; GPipe keeps them all
    assert by_spec["pp=2,micro_batch=1"]["in_flight_peak"] == 2
    assert by_spec["pp=2,schedule=gpipe,micro_batch=1"]["in_flight_peak"] == 8
