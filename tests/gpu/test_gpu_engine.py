"""GPU tier: runs only where CUDA exists (skipped cleanly elsewhere, e.g. in CPU CI)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_model_trains_under_bf16_autocast_on_cuda() -> None:
    from bench.gpu_mfu import train_step
    from workers.engine.config import ModelConfig
    from workers.engine.model import build_model

    cfg = ModelConfig.preset("tiny")
    dev = torch.device("cuda", 0)
    model = build_model(cfg, seed=0, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, cfg.vocab, (8, cfg.seq_len + 1), device=dev, generator=None)
    losses = []
    for _ in range(20):
        losses.append(train_step(model, opt, x, cfg.vocab))
    assert losses[-1] < 0.8 * losses[0]  # it learns the fixed batch


def test_mfu_benchmark_reports_a_plausible_mfu() -> None:
    from bench.gpu_mfu import run

    result = run(quick=True)
    assert result["rows"], result
    mfu = result["rows"][0]["mfu"]
    assert mfu is None or 0.01 < mfu < 1.0
