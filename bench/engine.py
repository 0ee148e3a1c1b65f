"""Engine benchmark: training tokens/s of several layouts against the single-process run.

Every layout trains the same model on the same random batches for a few steps in its own set of
local processes (one per rank, one thread each); the first steps are warm-up (DTensor sharding
caches, pipeline shape inference) and the rest are timed. The single-process run is measured in
the same invocation, so the ratio compares like with like on whatever machine this runs. On a
CPU box with fewer cores than ranks the ranks time-share the cores: the numbers then measure the
parallelism's overhead, not a speed-up.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from planner.layout import Layout


def _bench_rank(rank: int, world: int, cfg_dict: dict[str, Any], spec: str, warmup: int, steps: int
                ) -> dict[str, Any]:
    import torch

    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer

    cfg = TrainConfig.from_dict(cfg_dict)
    layout = Layout.parse(spec) if spec else Layout()
    g = torch.Generator().manual_seed(0)
    trainer = RankTrainer(cfg, layout, rank, world)
    times, losses = [], []
    try:
        for i in range(warmup + steps):
            batch = torch.randint(0, cfg.model.vocab, (cfg.global_batch, cfg.model.seq_len + 1), generator=g)
            t0 = time.perf_counter()
            res = trainer.train_batch(batch)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
            losses.append(res.loss)
    finally:
        trainer.close()
    return {"step_s": statistics.median(times), "losses": losses}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure tokens/s per layout; returns ``{"name": "engine", "rows": [...], "markdown": ...}``."""
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.launch import run_ranks

    model = ModelConfig.preset("tiny" if quick else "small")
    gb = 8
    cfg = TrainConfig(model=model, steps=100, global_batch=gb, seed=0)
    warmup, steps = (1, 2) if quick else (2, 5)
    specs = ["", "dp=2", "pp=2,micro_batch=2", "tp=2,micro_batch=4"] if quick else [
        "", "dp=2", "dp=2,zero=1", "dp=2,zero=3", "tp=2,micro_batch=4", "cp=2,micro_batch=4",
        "pp=2,micro_batch=2", "pp=2,vpp=2,micro_batch=2", "tp=2,pp=2,micro_batch=2", "tp=2,cp=2,dp=2,micro_batch=4",
    ]
    tokens = gb * model.seq_len
    rows: list[dict[str, Any]] = []
    base_tps = None
    base_losses = None
    for spec in specs:
        layout = Layout.parse(spec) if spec else Layout()
        t0 = time.perf_counter()
        res = run_ranks(_bench_rank, layout.world_size, cfg.to_dict(), spec, warmup, steps, timeout_s=1800)
        step_s = max(r["step_s"] for r in res)
        tps = tokens / step_s
        if base_tps is None:
            base_tps, base_losses = tps, res[0]["losses"]
        drift = max(abs(a - b) / b for a, b in zip(res[0]["losses"], base_losses, strict=True))
        rows.append({"layout": spec or "single process", "ranks": layout.world_size, "step_s": round(step_s, 4),
                     "tokens_per_s": round(tps, 1), "vs_single": round(tps / base_tps, 3),
                     "loss_rel_diff_vs_single": float(f"{drift:.2e}"),
                     "wall_s": round(time.perf_counter() - t0, 1)})
    lines = [f"Model `{model.name}` ({model.num_params() / 1e6:.2f} M params), global batch {gb} x "
             f"{model.seq_len} tokens, median of {steps} steps after {warmup} warm-up, "
             f"{os.cpu_count()} CPU cores, one thread per rank.", "",
             "| layout | ranks | step s | tokens/s | vs single | loss rel. diff |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layout']} | {r['ranks']} | {r['step_s']} | {r['tokens_per_s']} | {r['vs_single']} | "
                     f"{r['loss_rel_diff_vs_single']} |")
    return {"name": "engine", "rows": rows, "markdown": "\n".join(lines)}


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(run(quick="--quick" in sys.argv)["markdown"])
