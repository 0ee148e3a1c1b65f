"""GPU tier: the real engine on one CUDA GPU. Runs only where CUDA exists (skipped cleanly
elsewhere, e.g. in CPU CI; ``tests/engine/test_single_rank.py`` runs the same path on gloo/CPU).

``bench/gpu_check.sh`` runs this file and ``bench/gpu_mfu.py`` in one go on a GPU machine.
``test_engine_matches_transformers_on_gpu`` is the outside oracle on the GPU: the engine, importing
a random ``transformers`` Llama, gives transformers' loss on real text and follows transformers'
own training loop step for step with gradient clipping active, under the same bf16 autocast.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def _hf_fixtures():  # tests/engine's helpers (a plain folder, not a package)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    import hf_fixtures

    return hf_fixtures


def test_engine_matches_transformers_on_gpu(tmp_path) -> None:
    """Same weights (a random ``LlamaForCausalLM``, imported by the engine from safetensors), same
    real-text windows: the engine's loss on CUDA under bf16 autocast is transformers' fp32 loss
    (2e-2 relative; a wrong weight or rotary layout moves it by far more), and 6 training steps at a
    learning rate where every step clips (norm > 1) give transformers' losses in a plain loop with
    ``torch.optim.AdamW`` and ``clip_grad_norm_`` under the same autocast (3e-2 relative)."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.launch import single_rank_group
    from workers.engine.optim import param_groups
    from workers.engine.trainer import RankTrainer

    text = Path(__file__).resolve().parents[2] / "README.md"
    cfg_dict, batch, hf_fp32_loss = _hf_fixtures().oracle_case(tmp_path / "hf", text, seed=3, seq=64, windows=8)
    cfg = TrainConfig.from_dict({**cfg_dict, "steps": 6, "lr": 3e-3, "min_lr": 3e-3, "warmup_steps": 0})
    steps = 6
    with single_rank_group() as backend:
        assert backend == "nccl"
        trainer = RankTrainer(cfg, Layout(micro_batch=8), 0, 1)
        try:
            assert trainer.device.type == "cuda"
            eval_loss = trainer.forward_loss(batch)
            engine = [trainer.train_batch(batch) for _ in range(steps)]
        finally:
            trainer.close()
    assert abs(eval_loss - hf_fp32_loss) <= 2e-2 * hf_fp32_loss, (eval_loss, hf_fp32_loss)
    assert all(r.grad_norm > cfg.grad_clip for r in engine), [r.grad_norm for r in engine]  # clipping active

    model = AutoModelForCausalLM.from_pretrained(cfg.model.hf, dtype=torch.float32).cuda().train()
    opt = torch.optim.AdamW(param_groups(list(model.named_parameters()), cfg.weight_decay), lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), eps=1e-8, foreach=True)
    x = batch.cuda()
    reference = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        reference.append(loss.item())
    ours = [r.loss for r in engine]
    print("engine", ours, "transformers", reference, "fp32 eval", hf_fp32_loss, eval_loss)
    assert reference[-1] < reference[0]
    for a, b in zip(ours, reference, strict=True):
        assert abs(a - b) <= 3e-2 * b, (ours, reference)


REJOIN = """
import torch, torch.distributed as dist
from planner.layout import Layout
from workers.engine.groups import ParallelGroups
from workers.engine.launch import free_port
from workers.runtime.cluster.rendezvous import Rendezvous, join, leave
for attempt in range(3):
    join(Rendezvous("127.0.0.1", free_port(), "nccl", 60.0), 0, 1)
    ParallelGroups(Layout(), 0, 1)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    print("attempt", attempt, float(t.sum()), flush=True)
    leave()
"""


def test_one_process_survives_three_rendezvous() -> None:
    """A warm-pool actor joins a new NCCL group per attempt in the same process. With ``device_id``
    passed to ``init_process_group`` the second attempt's device mesh crashed the process (SIGSEGV in
    ``split_group``, H200, torch 2.11); ``rendezvous.join`` passes none. In a child process, so that
    a crash fails this test instead of killing the run."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", REJOIN], cwd=root, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("attempt")] == ["0", "1", "2"]
