"""Every 4-rank factorisation tp*cp*pp*dp = 4 (plus ZeRO / schedule / CP-method variants) equals the
single process: loss 1e-5 relative, every gradient 1e-4, 10 AdamW steps 1e-4 relative."""

import pytest
from engine_harness import (
    assert_equivalent,
    assert_recompute_changes_nothing,
    assert_sp_memory_drops,
    equivalence_and_sp_body,
    equivalence_inputs,
)

from workers.engine.launch import run_ranks

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)

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
    "cp=2,pp=2,recompute=selective",  # ring attention recomputed inside 1F1B's backward
    "tp=2,dp=2,zero=3,recompute=op",  # op-level SAC on TP DTensors (SP: reduce-scatters kept, all-gathers
    # run again) inside FSDP2
    # replica groups (HSDP): ZeRO shards inside a group, gradients all-reduced across groups
    "dp=4,dp_replicate=2,zero=3",  # FSDP2 on a 2-D (replicate, shard) mesh
    "tp=2,dp=2,dp_replicate=2,zero=3",  # TP x HSDP (shard group of one: pure replication of TP shards)
    "cp=2,dp=2,dp_replicate=2,zero=1",  # optimizer state sharded over cp inside each replica group
]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """One spawn of 4 ranks builds and tears down every layout in turn (and the SP measurement)."""
    return run_ranks(equivalence_and_sp_body, 4, SPECS, equivalence_inputs(), timeout_s=1500)


@pytest.mark.engine
def test_sequence_parallel_divides_norm_region_activations_by_tp(results: list[dict]) -> None:
    assert_sp_memory_drops(results, tp=4)


@pytest.mark.engine
def test_every_four_rank_layout_matches_single_process(results: list[dict]) -> None:
    assert_equivalent([r["eq"] for r in results])


@pytest.mark.engine
def test_recompute_modes_train_exactly_as_without(results: list[dict]) -> None:
    """op and layer:N (TorchTitan's modes) against the same layout without recompute."""
    compared = assert_recompute_changes_nothing([r["eq"] for r in results])
    assert {s for s in compared if "recompute=op" in s or "recompute=layer:" in s} == {
        "tp=2,dp=2,zero=3,recompute=op"}


@pytest.mark.engine
def test_1f1b_keeps_at_most_pp_micro_batches_in_flight(results: list[dict]) -> None:
    peak = {r["spec"]: r["in_flight_peak"] for r in results[0]["eq"]}
    assert peak["pp=4,micro_batch=1"] == 4  # 8 micro-batches through 4 stages
