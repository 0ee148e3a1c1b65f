"""MFU of the real engine on one GPU: ``RankTrainer`` (single rank, NCCL process group of one, bf16
autocast, fused attention, the engine's AdamW) training a ~1B-parameter Llama, against two
baselines measured in the same run: ``transformers``' ``LlamaForCausalLM`` of the same shape
trained by a plain PyTorch loop (same batch, bf16 autocast over fp32 weights, SDPA fused attention,
``torch.optim.AdamW`` foreach, gradient clipping, loss read back every step; no ``torch.compile``),
and the GPU's own bf16 matrix-product rate (8192^3, the ceiling the engine's matrix work can reach).

Run ``python -m bench.gpu_mfu`` (``--quick``: one size; ``--out DIR``: write ``gpu_mfu.json`` and
``.md`` there, default ``bench/results``). Without CUDA it prints a clear skip and exits 0;
:func:`measure` and :func:`measure_transformers` also run on CPU (gloo, fp32, math attention), which is
how the CPU test suite exercises these exact paths. MFU is ``tokens/s * flops_per_token / peak`` with
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
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with fused_attention(dev):
                dt, losses = _timed(lambda: trainer.train_batch(x).loss, warmup, steps, dev)
        finally:
            trainer.close()
    return _row("RankTrainer", backend, dev, model, model.num_params(), batch, dt, losses)


def _row(engine: str, backend: str, device: Any, model: Any, params: int, batch: int, dt: float,
         losses: list[float]) -> dict[str, Any]:
    """One result row: throughput, model FLOP rate, MFU against the datasheet peak, peak memory."""
    import torch

    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    tps = batch * model.seq_len / dt
    achieved = tps * model.flops_per_token() / 1e12
    peak = peak_tflops(name) if cuda else None
    return {"gpu": name, "engine": engine, "backend": backend, "autocast": "bf16" if cuda else "none",
            "attention": "fused only" if cuda else "any", "params": params,
            "params_b": round(params / 1e9, 3), "seq": model.seq_len, "batch": batch, "step_s": round(dt, 4), "tokens_per_s": round(tps),
            "tflops": round(achieved, 3), "mfu": round(achieved / peak, 4) if peak else None,
            "max_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
            "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4)}


def _timed(step: Any, warmup: int, steps: int, device: Any) -> tuple[float, list[float]]:
    """Mean seconds per ``step()`` over ``steps`` calls after ``warmup``; all losses."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses = [step() for _ in range(warmup)]
    sync()
    t0 = time.perf_counter()
    losses += [step() for _ in range(steps)]
    sync()
    return (time.perf_counter() - t0) / steps, losses


def measure_transformers(preset: str = "llama-1b", seq: int = 2048, batch: int = 4, warmup: int = 3,
                         steps: int = 5) -> dict[str, Any]:
    """The baseline: ``transformers``' ``LlamaForCausalLM`` with ``preset``'s shape (its config from
    :func:`workers.engine.hf.hf_config`) trained by a plain loop on the same device, batch, precision,
    attention kernels, optimizer and clipping as :func:`measure`; one result row."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.hf import hf_config
    from workers.engine.optim import param_groups

    model_cfg = ModelConfig.from_dict({**ModelConfig.preset(preset).to_dict(), "seq_len": seq})
    cfg = TrainConfig(model=model_cfg, steps=warmup + steps, global_batch=batch, lr=1e-4, min_lr=1e-5,
                      warmup_steps=0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # as the engine's run sets it
    torch.manual_seed(0)
    hf = LlamaConfig(**hf_config(model_cfg, max_position=seq))
    hf._attn_implementation = "sdpa"
    with device:  # initialised where it trains
        model = LlamaForCausalLM(hf).to(dtype=torch.float32).train()
    opt = torch.optim.AdamW(param_groups(list(model.named_parameters()), cfg.weight_decay), lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), eps=1e-8, foreach=True)
    x = torch.randint(0, model_cfg.vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0)).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext():
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return loss.item()

    with fused_attention(device):
        dt, losses = _timed(step, warmup, steps, device)
    params = sum(p.numel() for p in model.parameters())
    return _row("transformers", "none", device, model_cfg, params, batch, dt, losses)


def matmul_tflops(n: int = 8192, warmup: int = 3, reps: int = 10) -> float:
    """The device's measured dense bf16 rate: mean of ``reps`` ``n x n x n`` products of random data."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return round(2 * n**3 * reps / (time.perf_counter() - t0) / 1e12, 1)


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        msg = "SKIP: no CUDA device here; bench/gpu_mfu.py measures MFU only on a GPU"
        print(msg)
        return {"name": "gpu_mfu", "rows": [], "skipped": True, "markdown": msg}
    ceiling = matmul_tflops()
    rows, baselines = [], []
    for seq, batch in ([(2048, 4)] if quick else [(2048, 4), (2048, 8)]):
        for fn, out in ((measure, rows), (measure_transformers, baselines)):
            out.append(fn("llama-1b", seq, batch, warmup=3, steps=5 if quick else 10))
            torch.cuda.empty_cache()
            print(out[-1], flush=True)
    for r, b in zip(rows, baselines, strict=True):
        r["vs_transformers"] = round(r["tokens_per_s"] / b["tokens_per_s"], 3)
        r["of_measured_matmul"] = round(r["tflops"] / ceiling, 4)
    lines = ["Training throughput of `RankTrainer` (1 rank, NCCL group of one, bf16 autocast over fp32 weights, "
             "fused attention only, AdamW foreach, clipping, loss read back each step) against, in the same run, "
             "`transformers`' `LlamaForCausalLM` of the same shape in a plain PyTorch loop (same batch, precision, "
             "attention kernels, optimizer and clipping; eager, no `torch.compile`, no fused loss) and the GPU's "
             f"measured bf16 8192^3 matrix-product rate: **{ceiling} TFLOP/s**. MFU = model FLOPs "
             "(6 N + attention) / the GPU's datasheet dense bf16 peak by name.", "",
             "| GPU | run | params (B) | seq | batch | step s | tokens/s | TFLOP/s | MFU | of measured matmul | "
             "vs transformers | mem GB | loss first -> last |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, b in zip(rows, baselines, strict=True):
        for x in (r, b):
            ratio = f"**{r['vs_transformers']}x**" if x is r else "1 (baseline)"
            lines.append(f"| {x['gpu']} | {x['engine']} | {x['params_b']} | {x['seq']} | {x['batch']} | "
                         f"{x['step_s']} | {x['tokens_per_s']} | {x['tflops']} | {x['mfu']} | "
                         f"{round(x['tflops'] / ceiling, 3)} | {ratio} | {x['max_mem_gb']} | "
                         f"{x['first_loss']} -> {x['last_loss']} |")
    return {"name": "gpu_mfu", "rows": rows, "baselines": baselines, "matmul_tflops": ceiling,
            "markdown": "\n".join(lines)}


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from bench.common import RESULTS_DIR, write_result

    result = run(quick="--quick" in sys.argv)
    if not result.get("skipped"):
        print(result["markdown"])
        out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else RESULTS_DIR
        print("wrote", *write_result(result, out))
