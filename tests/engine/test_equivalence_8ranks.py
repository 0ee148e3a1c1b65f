"""Eight-rank layouts combining three of the four dimensions at a time (all four covered together)
equal the single process: in CI each combination once plus the TP x FSDP cases; the soak tier adds
the other schedules and CP method on 8 ranks (in CI those run on 2 and 4 ranks).

The same spawned group also checks ``transformers``' Llama as an outside oracle on the 8-rank
layouts (the multi-dimensional part of tests/engine/test_hf_oracle.py): a random ``LlamaForCausalLM`` imported
under ``HF_SPECS`` (and ``SOAK_HF_SPECS``) gives transformers' loss on the same windows to 1e-4 relative, in training
(forward/backward) and in evaluation (forward only, no backward pass). On 8 ranks every layout
leaves one dimension at 1; the layout with all four > 1 (16 ranks) is ``test_hf_oracle_4d.py``."""

import dataclasses
from pathlib import Path

import pytest
import torch
from engine_harness import TINY, assert_equivalent, equivalence_inputs, run_equivalence
from hf_fixtures import oracle_case, train_then_eval_loss

from workers.engine.launch import run_ranks

# spawned multi-rank runs: generous on a shared/loaded box (the suite budget is for an idle one)
pytestmark = pytest.mark.timeout(1800)

# the tiny model with an FFN of 176 (not 172) so that tp=8 divides it
TINY8 = dataclasses.replace(TINY, name="tiny-ffn176", ffn=176)

# CI: each three-dimension combination once, plus the two TP x FSDP cases (strided shards, HSDP)
SPECS = [
    "tp=2,cp=2,pp=2",
    "tp=2,pp=2,dp=2,vpp=2",
    "tp=2,cp=2,dp=2,zero=1",
    "cp=2,pp=2,dp=2,zero=3",
    "tp=4,dp=2,zero=3",  # FSDP over TP-sharded dim 0 (strided shards): the global norm must count them
    "tp=2,dp=4,dp_replicate=2,zero=3",  # TP x HSDP with real shards: the norm counts each replica once
]
# soak tier: the other schedules and CP method combined on 8 ranks (each also runs on 2 and 4 ranks in CI)
SOAK_SPECS = [
    "tp=2,cp=2,pp=2,schedule=gpipe",
    "tp=2,pp=2,dp=2,zero=3",
    "cp=2,pp=2,dp=2,cp_method=ulysses,vpp=2",
    "tp=8",  # tp > kv_heads: KV heads replicated
    "tp=4,dp=2,zero=1",
]


# tp x FSDP against transformers on real text (what random tokens once hid); the 4-D 16-rank layout is
# test_hf_oracle_4d.py, the 4-rank combinations test_hf_oracle.py
HF_SPECS = ["tp=2,cp=2,dp=2,zero=3"]
SOAK_HF_SPECS = ["tp=2,pp=2,cp=2", "pp=2,cp=2,dp=2,schedule=gpipe"]
HF_SEQ = 64


def _hf_oracle(rank: int, world: int, hf_specs: list[str], cfg_dict: dict,
               batch: torch.Tensor) -> list[tuple[str, float, float]]:
    """Every layout of ``hf_specs``: (layout, training-path loss, forward-only loss) of ``batch``."""
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    cfg = TrainConfig.from_dict(cfg_dict)
    out = []
    for spec in hf_specs:
        trainer = RankTrainer(cfg, Layout.parse(spec).with_global_batch(cfg.global_batch), rank, world)
        try:
            loss, evaluated = train_then_eval_loss(trainer, batch)
            out.append((spec, loss, evaluated))
        finally:
            trainer.close()
    return out


def _body(rank: int, world: int, specs: list[str], inputs: tuple, hf: tuple[list[str], dict, torch.Tensor]) -> dict:
    torch.set_num_threads(1)
    return {"equivalence": run_equivalence(rank, world, specs, inputs), "hf": _hf_oracle(rank, world, *hf)}


def _check(tmp_path: Path, specs: list[str], hf_specs: list[str]) -> None:
    cfg, batch, expected = oracle_case(tmp_path / "hf", Path(__file__), seed=3, seq=HF_SEQ)  # real text windows
    results = run_ranks(_body, 8, specs, equivalence_inputs(TINY8), (hf_specs, cfg, batch), timeout_s=1800)
    assert_equivalent([r["equivalence"] for r in results])
    rows = results[0]["hf"]
    assert [r[0] for r in rows] == hf_specs
    for other in results[1:]:  # identical on every rank
        assert other["hf"] == rows
    for spec, loss, evaluated in rows:
        print(f"hf {spec:<32} orthoplex {loss:.6f} (eval {evaluated:.6f}) transformers {expected:.6f}")
        assert abs(loss - expected) / expected < 1e-4, (spec, loss, expected)
        assert abs(evaluated - expected) / expected < 1e-4, (spec, evaluated, expected)


@pytest.mark.engine
@pytest.mark.slow
def test_eight_rank_layouts_match_single_process(tmp_path: Path) -> None:
    _check(tmp_path, SPECS, HF_SPECS)


@pytest.mark.engine
@pytest.mark.soak
def test_more_eight_rank_layouts_match_single_process(tmp_path: Path) -> None:
    _check(tmp_path, SOAK_SPECS, SOAK_HF_SPECS)
