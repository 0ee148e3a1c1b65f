"""Every 2-rank layout (and its schedule / ZeRO / CP-method / SP variants) equals the single process."""

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
    "dp=2,dp_replicate=2,zero=1",  # two replica groups of one rank: the norm sums no replica twice
    "dp=2,micro_batch=1",  # gradient accumulation over 4 micro-batches
    "dp=2,recompute=full",  # activation checkpointing per block
    "tp=2,recompute=selective",  # the attention core run again in the backward
    "cp=2,recompute=selective",  # ... the ring's p2p included
    # TorchTitan's modes (workers/engine/recompute.py)
    # (op on TP DTensors with SP inside FSDP2: tp=2,dp=2,zero=3,recompute=op in the 4-rank group)
    "cp=2,recompute=op",  # op-level SAC around the ring (recomputed with its p2p)
    "pp=2,vpp=2,recompute=op",  # ... inside interleaved 1F1B
    "pp=2,recompute=layer:2",  # each rank's 2nd block checkpointed, in 1F1B
    "dp=2,zero=3,recompute=layer:3",  # FSDP2 around a checkpointed block; N=3 does not divide 4 layers
]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """One spawn of 2 ranks builds and tears down every layout in turn (and the SP measurement)."""
    return run_ranks(equivalence_and_sp_body, 2, SPECS, equivalence_inputs(), timeout_s=1500)


@pytest.mark.engine
def test_sequence_parallel_divides_norm_region_activations_by_tp(results: list[dict]) -> None:
    assert_sp_memory_drops(results, tp=2)


@pytest.mark.engine
def test_tensor_parallel_block_issues_the_planners_collectives(results: list[dict]) -> None:
    """Per block and micro-batch, forward and backward: two all-reduces each way without SP, and
    with SP the Megatron pairs (two all-gathers and two reduce-scatters each way) plus the all-reduce
    of the two sequence-parallel norms' weight gradients; the planner's timing model prices 2
    all-reduce-equivalents forward and 2 backward per layer (planner/timing.py). The attention's and
    MLP's column-parallel projections share one replicated input, so their input gradients are
    reduced once per module, not once per projection (7 all-reduces a block before 2026-12-06)."""
    for r in results:
        assert r["comm"]["no_sp"] == {"all_reduce": 4, "allreduce_": 0}, r["comm"]
        assert r["comm"]["sp"] == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4, "all_reduce": 2,
                                   "allreduce_": 0}, r["comm"]


@pytest.mark.engine
def test_tensor_parallel_splits_dtensor_weights_but_runs_on_local_tensors(results: list[dict]) -> None:
    """Every TP weight is a DTensor with Megatron's placement (what checkpoints, FSDP2, the optimizer
    and the HF loader read), and no module of the forward takes or returns a DTensor: the split runs on the
    local shards, with no per-op DTensor dispatch (``workers/engine/parallel/tensor.py``)."""
    col = ("tok_embeddings.weight", "output.weight", "wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight")
    for r in results:
        for mode, t in r["tp"].items():
            assert t["dtensor_io"] == [], (mode, t["dtensor_io"])
            for name, placements in t["placements"].items():
                if name.endswith(col):
                    assert placements == ["S(0)"], (mode, name, placements)
                elif name.endswith(("wo.weight", "w2.weight")):
                    assert placements == ["S(1)"], (mode, name, placements)
                else:  # norms: replicated DTensors under SP (their gradient summed over TP), plain without
                    assert placements == (["R"] if mode == "sp" else None), (mode, name, placements)


@pytest.mark.engine
def test_every_two_rank_layout_matches_single_process(results: list[dict]) -> None:
    assert_equivalent([r["eq"] for r in results])


@pytest.mark.engine
def test_recompute_modes_train_exactly_as_without(results: list[dict]) -> None:
    """op and layer:N (TorchTitan's modes) against the same layout without recompute."""
    compared = assert_recompute_changes_nothing([r["eq"] for r in results])
    assert {s for s in compared if "recompute=op" in s or "recompute=layer:" in s} == {
        "cp=2,recompute=op", "dp=2,zero=3,recompute=layer:3", "pp=2,recompute=layer:2",
        "pp=2,vpp=2,recompute=op"}


@pytest.mark.engine
def test_1f1b_keeps_at_most_pp_micro_batches_in_flight(results: list[dict]) -> None:
    peak = {r["spec"]: r["in_flight_peak"] for r in results[0]["eq"]}
    assert peak["pp=2,micro_batch=1"] == 2  # 8 micro-batches, pp=2: 1F1B holds at most 2
    assert peak["pp=2,schedule=gpipe,micro_batch=1"] == 8  # GPipe holds all of them
