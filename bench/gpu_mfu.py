"""MFU of the real engine on one GPU: ``RankTrainer`` (single rank, NCCL process group of one, bf16
autocast, fused attention, the engine's AdamW) training a ~1B-parameter Llama.

Run ``python -m bench.gpu_mfu`` (``--quick``: one size). Without CUDA it prints a clear skip and
exits 0; :func:`measure` itself also runs on CPU (gloo, fp32, math attention), which is how the
CPU test suite exercises this exact path. MFU is ``tokens/s * flops_per_token / peak`` with
``flops_per_token = 6 * non-embedding params + 6 * layers * hidden * seq`` (causal attention) and the
GPU's dense bf16 peak looked up by name (override with ``ORTHOPLEX_PEAK_TFLOPS``). Every step is the
engine's own ``train_batch`` (forward, backward, gradient clipping, learning-rate schedule, AdamW,
loss read back), so the number is what a one-GPU job gets, not a bare model's upper bound.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0,
                    "4090": 165.0, "B200": 2250.0}


def peak_tflops(name: str) -> float | None:
    env = os.environ.get("ORTHOPLEX_PEAK_TFLOPS")
    if env:
        return float(env)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value
    return None


@contextlib.contextmanager
def fused_attention(device: Any) -> Iterator[None]:
    """On CUDA, allow only fused SDPA kernels (flash, memory-efficient, cuDNN): attention that would
    fall back to the unfused math kernel raises instead. Elsewhere, nothing changes."""
    if getattr(device, "type", str(device)) != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        yield


def measure(preset: str = "llama-1b", seq: int = 2048, batch: int = 4, warmup: int = 3, steps: int = 5,
            ) -> dict[str, Any]:
    """Time ``steps`` engine steps (after ``warmup``) of ``preset`` at ``seq`` x ``batch`` on this
    machine's device, through ``RankTrainer`` in a process group of one; one result row."""
    import torch

    from planner.layout import Layout
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.launch import single_rank_group
    from workers.engine.trainer import RankTrainer

    model = ModelConfig.from_dict({**ModelConfig.preset(preset).to_dict(), "seq_len": seq})
    cfg = TrainConfig(model=model, steps=warmup + steps, global_batch=batch, lr=1e-4, min_lr=1e-5,
                      warmup_steps=0)
    x = torch.randint(0, model.vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    with single_rank_group() as backend:
        torch.backends.cuda.matmul.allow_tf32 = True
        trainer = RankTrainer(cfg, Layout(micro_batch=batch), 0, 1)
        try:
            dev = trainer.device
            sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            losses = []
            with fused_attention(dev):
                for _ in range(warmup):
                    losses.append(trainer.train_batch(x).loss)
                sync()
                t0 = time.perf_counter()
                for _ in range(steps):
                    losses.append(trainer.train_batch(x).loss)
                sync()
            dt = (time.perf_counter() - t0) / steps
            name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
            mem = round(torch.cuda.max_memory_allocated() / 2**30, 1) if dev.type == "cuda" else None
        finally:
            trainer.close()
    tps = batch * seq / dt
    achieved = tps * model.flops_per_token() / 1e12
    peak = peak_tflops(name) if dev.type == "cuda" else None
    return {"gpu": name, "engine": "RankTrainer", "backend": backend,
            "autocast": "bf16" if dev.type == "cuda" else "none",
            "attention": "fused only" if dev.type == "cuda" else "any", "params_b": round(model.num_params() / 1e9, 3),
            "seq": seq, "batch": batch, "step_s": round(dt, 4), "tokens_per_s": round(tps),
            "tflops": round(achieved, 3), "mfu": round(achieved / peak, 4) if peak else None, "max_mem_gb": mem,
            "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4)}


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        msg = "SKIP: no CUDA device here; bench/gpu_mfu.py measures MFU only on a GPU"
        print(msg)
        return {"name": "gpu_mfu", "rows": [], "skipped": True, "markdown": msg}
    rows = []
    for seq, batch in ([(2048, 4)] if quick else [(2048, 4), (2048, 8)]):
        rows.append(measure("llama-1b", seq, batch, warmup=3, steps=5 if quick else 10))
        torch.cuda.empty_cache()
    lines = ["MFU of `RankTrainer` (1 rank, NCCL group of one, bf16 autocast, fused attention only, AdamW); "
             "peak = the GPU's dense bf16 peak by name (no baseline: an absolute fraction of peak).", "",
             "| GPU | params (B) | seq | batch | step s | tokens/s | TFLOP/s | MFU | mem GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gpu']} | {r['params_b']} | {r['seq']} | {r['batch']} | {r['step_s']} | "
                     f"{r['tokens_per_s']} | {r['tflops']} | {r['mfu']} | {r['max_mem_gb']} |")
    return {"name": "gpu_mfu", "rows": rows, "markdown": "\n".join(lines)}


if __name__ == "__main__":
    import sys

    result = run(quick="--quick" in sys.argv)
    if not result.get("skipped"):
        print(result["markdown"])
