"""GPU tier: the real engine on one CUDA GPU. Runs only where CUDA exists (skipped cleanly
elsewhere, e.g. in CPU CI; ``tests/engine/test_single_rank.py`` runs the same path on gloo/CPU).

``bench/gpu_check.sh`` runs this file and ``bench/gpu_mfu.py`` in one go on a GPU machine.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_rank_trainer_single_rank_nccl_bf16_fused_attention(tmp_path) -> None:
    from bench.gpu_mfu import fused_attention
    from planner.layout import Layout
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.launch import single_rank_group
    from workers.engine.trainer import RankTrainer

    model = ModelConfig.preset("tiny")
    cfg = TrainConfig(model=model, steps=30, global_batch=8, lr=3e-3, checkpoint_dir=str(tmp_path))
    x = torch.randint(0, model.vocab, (8, model.seq_len + 1), generator=torch.Generator().manual_seed(0))
    with single_rank_group() as backend:
        assert backend == "nccl"
        trainer = RankTrainer(cfg, Layout(micro_batch=8), 0, 1)
        try:
            assert trainer.device.type == "cuda" and trainer.groups.backend == "nccl"
            assert trainer.async_checkpoints  # on CUDA the trainer saves in the background
            dtypes: list[torch.dtype] = []
            hook = trainer.parts.modules[0].register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
            with fused_attention(trainer.device):  # the math fallback would raise here
                losses = [trainer.train_batch(x).loss for _ in range(20)]
            hook.remove()
            assert dtypes and set(dtypes) == {torch.bfloat16}  # logits under bf16 autocast
            assert all(p.dtype == torch.float32 and p.is_cuda for p in trainer.params)  # fp32 master weights
            assert losses[-1] < 0.8 * losses[0], losses  # it learns the fixed batch
            assert trainer.start_save() == []  # async: committed later
            (info,) = trainer.finish_saves()
            assert info.step == 20 and info.bytes > 0
        finally:
            trainer.close()


def test_mfu_benchmark_measures_the_engine() -> None:
    from bench.gpu_mfu import run

    result = run(quick=True)
    assert result["rows"], result
    row = result["rows"][0]
    assert row["engine"] == "RankTrainer" and row["backend"] == "nccl" and row["autocast"] == "bf16"
    assert row["mfu"] is None or 0.01 < row["mfu"] < 1.0, row
