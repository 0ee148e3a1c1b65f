"""``transformers``' Llama as the outside oracle under a layout with all four dimensions > 1.

``tp=2,pp=2,cp=2,dp=2`` needs 16 ranks: 16 processes on this 2-core box take minutes, so this is a
``soak``-tier test (``./dev test -m soak``); the default run checks every 8-rank layout (each with one
dimension at 1, all four covered together) in ``test_equivalence_8ranks.py``. A random
``LlamaForCausalLM`` imported under the 4D layout gives transformers' loss on the same real-text
windows to 1e-4 relative, through the training path and forward only (no backward pass)."""

from pathlib import Path

import pytest
import torch
from hf_fixtures import hf_window_loss, make_hf_llama, train_then_eval_loss

from workers.engine.launch import run_ranks

pytestmark = [pytest.mark.engine, pytest.mark.soak, pytest.mark.timeout(1800)]

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
    from workers.engine.config import TrainConfig
    from workers.engine.hf import model_config_from_hf, read_hf_config

    hf = make_hf_llama(tmp_path / "hf", tied=False, seed=4)
    data = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    batch = torch.stack([data[i * SEQ:i * SEQ + SEQ + 1] for i in range(8)])  # real text windows
    expected = hf_window_loss(hf, batch)
    cfg = TrainConfig(model=model_config_from_hf(read_hf_config(hf), SEQ, name="hf"), steps=1, global_batch=8,
                      init_hf=str(hf))
    results = run_ranks(_body, 16, cfg.to_dict(), batch, timeout_s=1800, collective_timeout_s=600)
    assert all(r == results[0] for r in results)  # identical on every rank
    loss, evaluated = results[0]
    print(f"hf {SPEC} orthoplex {loss:.6f} (eval {evaluated:.6f}) transformers {expected:.6f}")
    assert abs(loss - expected) / expected < 1e-4, (loss, expected)
    assert abs(evaluated - expected) / expected < 1e-4, (evaluated, expected)
