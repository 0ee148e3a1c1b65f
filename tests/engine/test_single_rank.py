"""The one-rank engine path of the GPU tier (``tests/gpu``, ``bench/gpu_mfu.py``), run on CPU: a
gloo process group of one in this process, ``RankTrainer`` training, the asynchronous checkpoint
of the trainer, and a resume that restores the RNG states the checkpoint carries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.layout import Layout
from workers.engine.checkpoint import list_checkpoints, verify_checkpoint
from workers.engine.config import ModelConfig, TrainConfig
from workers.engine.launch import single_rank_group
from workers.engine.trainer import RankTrainer

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_async_save_then_resume_restores_rng_and_continues_the_curve(tmp_path: Path) -> None:
    cfg = TrainConfig(model=ModelConfig.preset("tiny"), steps=6, global_batch=4, checkpoint_dir=str(tmp_path),
                      keep_checkpoints=3)
    with single_rank_group() as backend:
        assert backend == "gloo"
        first = RankTrainer(cfg, Layout(), 0, 1, async_checkpoints=True)
        try:
            assert first.async_checkpoints and first.groups.backend == "gloo"
            first.step(), first.step()
            assert first.start_save() == []  # step 2 is written in the background
            # even with one rank the background save runs over a gloo group of its own: on a GPU the
            # default group is NCCL only, which DCP's async_save refuses (seen on an H200)
            group = first._checkpointer().async_group
            assert group is not None and torch.distributed.get_backend(group) == "gloo"
            first.step()
            rng_at_save = torch.get_rng_state()
            (two,) = first.start_save()  # finishes step 2's save, starts step 3's
            assert two.step == 2 and two.bytes > 0
            with pytest.raises(RuntimeError, match="in flight"):
                first.save()
            (three,) = first.finish_saves()
            assert three.step == 3 and first.finish_saves() == []
            torch.rand(1000)  # the run goes on drawing random numbers after the checkpoint
            expected = [first.step().loss for _ in range(3)]
        finally:
            first.close()
        records = list_checkpoints(tmp_path)
        assert [r.step for r in records] == [2, 3]
        for r in records:
            verify_checkpoint(r.path)  # raises on a torn or corrupt checkpoint

        torch.manual_seed(12345)  # a fresh process would have other RNG states
        second = RankTrainer(cfg, Layout(micro_batch=2), 0, 1)  # another layout, a synchronous trainer
        try:
            assert not second.async_checkpoints
            assert second.restore() == 3
            assert torch.equal(torch.get_rng_state(), rng_at_save)
            resumed = [second.step().loss for _ in range(3)]
            assert resumed == pytest.approx(expected, rel=1e-5)
            info = second.save()
            assert info.step == 6
        finally:
            second.close()


def test_mfu_benchmark_path_runs_the_engine_on_cpu() -> None:
    from bench.gpu_mfu import measure

    row = measure("tiny", seq=32, batch=2, warmup=1, steps=2)
    assert row["engine"] == "RankTrainer" and row["backend"] == "gloo" and row["autocast"] == "none"
    assert row["tokens_per_s"] > 0 and row["step_s"] > 0 and row["mfu"] is None


def test_mfu_benchmark_baseline_trains_transformers_llama_of_the_same_shape_on_cpu() -> None:
    """The benchmark's baseline (``transformers``' Llama in a plain loop) has the engine's parameter
    count for the same preset, and learns the fixed batch with the same optimizer settings."""
    from bench.gpu_mfu import measure, measure_transformers

    base = measure_transformers("tiny", seq=32, batch=2, warmup=2, steps=6)
    row = measure("tiny", seq=32, batch=2, warmup=1, steps=1)
    assert base["engine"] == "transformers" and base["autocast"] == "none" and base["tokens_per_s"] > 0
    assert base["params"] == row["params"] > 0
    assert base["last_loss"] < base["first_loss"], base
