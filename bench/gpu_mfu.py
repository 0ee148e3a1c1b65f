"""MFU of the engine's model on one GPU for a ~1B-parameter Llama (bf16 autocast).

Run ``python -m bench.gpu_mfu``. Without CUDA it prints a clear skip and exits 0. MFU is
``tokens/s * flops_per_token / peak`` with ``flops_per_token = 6 * non-embedding params +
6 * layers * hidden * seq`` (causal attention) and the GPU's dense bf16 peak looked up by name
(override with ``ORTHOPLEX_PEAK_TFLOPS``).
"""

from __future__ import annotations

import os
import time
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


def train_step(model: Any, opt: Any, x: Any, vocab: int) -> float:
    """One bf16-autocast training step on CUDA of next-token prediction on ``x``; returns the loss."""
    import torch
    import torch.nn.functional as F

    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        msg = "SKIP: no CUDA device here; bench/gpu_mfu.py measures MFU only on a GPU"
        print(msg)
        return {"name": "gpu_mfu", "rows": [], "skipped": True, "markdown": msg}

    from workers.engine.config import ModelConfig
    from workers.engine.model import build_model

    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = True
    base = ModelConfig.preset("llama-1b")
    rows = []
    for seq, batch in ([(2048, 4)] if quick else [(2048, 4), (2048, 8)]):
        cfg = ModelConfig.from_dict({**base.to_dict(), "seq_len": seq})
        model = build_model(cfg, seed=0, device=dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randint(0, cfg.vocab, (batch, seq + 1), device=dev)

        for _ in range(3):
            train_step(model, opt, x, cfg.vocab)
        torch.cuda.synchronize()
        n = 5 if quick else 10
        t0 = time.perf_counter()
        for _ in range(n):
            train_step(model, opt, x, cfg.vocab)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / n
        tps = batch * seq / dt
        name = torch.cuda.get_device_name(0)
        peak = peak_tflops(name)
        achieved = tps * cfg.flops_per_token() / 1e12
        rows.append({"gpu": name, "params_b": round(cfg.num_params() / 1e9, 3), "seq": seq, "batch": batch,
                     "step_s": round(dt, 4), "tokens_per_s": round(tps), "tflops": round(achieved, 1),
                     "mfu": round(achieved / peak, 4) if peak else None,
                     "max_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1)})
        del model, opt
        torch.cuda.empty_cache()
    lines = ["| GPU | params (B) | seq | batch | step s | tokens/s | TFLOP/s | MFU | mem GB |",
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
