"""``transformers``' Llama as the outside oracle under a layout with all four dimensions > 1.

``tp=2,pp=2,cp=2,dp=2`` needs 16 ranks (16 processes on this 2-core box: about 45 s when it is
quiet). A random ``LlamaForCausalLM`` imported under the 4D layout gives transformers' loss on the
same real-text windows to 1e-4 relative, through the training path and forward only (no backward
pass). The 8-rank layouts (each with one dimension at 1) are in ``test_equivalence_8ranks.py``."""

from pathlib import Path

import pytest
import torch
from hf_fixtures import oracle_case, train_then_eval_loss

from workers.engine.launch import run_ranks

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1800)]

SPEC = "tp=2,pp=2,cp=2,dp=2"
SEQ = 64


def _body(rank: int, world: int, cfg_dict: dict, batch: torch.Tensor) -> tuple[float, float]:
    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(cfg_dict)
    trainer = RankTrainer(cfg, Layout.parse(SPEC).with_global_batch(cfg.global_batch), rank, world)
    try:
        return train_then_eval_loss(trainer, batch)
    finally:
        trainer.close()


def test_four_dimensional_layout_matches_transformers(tmp_path: Path) -> None:
    cfg, batch, expected = oracle_case(tmp_path / "hf", Path(__file__), seed=4, seq=SEQ)  # real text windows
    results = run_ranks(_body, 16, cfg, batch, timeout_s=1800, collective_timeout_s=600)
    assert all(r == results[0] for r in results)  # identical on every rank
    loss, evaluated = results[0]
    print(f"hf {SPEC} orthoplex {loss:.6f} (eval {evaluated:.6f}) transformers {expected:.6f}")
    assert abs(loss - expected) / expected < 1e-4, (loss, expected)
    assert abs(evaluated - expected) / expected < 1e-4, (evaluated, expected)
