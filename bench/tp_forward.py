"""TP forward/backward cost per rank: the engine's split on local shards vs DTensor's plan, same run.

The engine splits TP on plain tensors: every TP weight is a DTensor, the forward uses its local
shard and explicit collectives (``workers/engine/parallel/tensor.py``). The baseline is the plan
the engine used before 2026-12-06, kept here (:func:`dtensor_plan`): DTensor's
``parallelize_module`` with TorchTitan's styles, the same placements and collectives, every op of
the forward and backward dispatched through DTensor. Both train the same model on the same batch in
the same invocation; the single-process (``tp=1``) pass is measured too.

Measured per layout: CPU seconds per ``forward_backward`` (one micro-batch of ``ROWS`` rows) on each
rank, and its wall time, over ``PASSES`` passes after ``WARMUP``. The ranks are 2 local processes
with one thread each (on a 2-core box: one core each, nothing else running). The loss must be the
same to 1e-6 relative for both plans, or the benchmark fails.
"""

from __future__ import annotations

import os
import time
from typing import Any

ROWS, WARMUP, PASSES = 2, 5, 30


def dtensor_plan(model: Any, tp_mesh: Any, sp: bool) -> None:
    """The baseline: TorchTitan's TP plan through DTensor's ``parallelize_module`` (tp <= kv_heads)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sp else Replicate()
    top: dict[str, Any] = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
                           "output": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1))}
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
            "attention": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        }
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
        parallelize_module(block, tp_mesh, plan)


def _rank(rank: int, world: int, plan: str, sp: bool) -> dict[str, Any]:
    import torch

    import workers.engine.parallelize as parallelize
    from planner.layout import Layout
    from workers.engine.config import ModelConfig, TrainConfig
    from workers.engine.trainer import RankTrainer

    if plan == "dtensor":
        parallelize.apply_tp = lambda m, mesh, sp: dtensor_plan(m, mesh, sp) if mesh.size() > 1 else None
    cfg = TrainConfig(model=ModelConfig.preset("tiny"), steps=100, global_batch=ROWS, seed=0)
    trainer = RankTrainer(cfg, Layout(tp=world, sp=sp, micro_batch=ROWS), rank, world)
    batch = torch.randint(0, cfg.model.vocab, (ROWS, cfg.model.seq_len + 1), generator=torch.Generator().manual_seed(0))
    try:
        for _ in range(WARMUP):
            loss = trainer.forward_backward(batch)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(PASSES):
            loss = trainer.forward_backward(batch)
        return {"cpu_ms": (time.process_time() - cpu0) / PASSES * 1e3,
                "wall_ms": (time.perf_counter() - wall0) / PASSES * 1e3, "loss": float(loss)}
    finally:
        trainer.close()


def run(quick: bool = False) -> dict[str, Any]:
    """Measure every (plan, tp, sp) row; returns ``{"name": "tp_forward", "rows": [...], "markdown": ...}``."""
    from workers.engine.launch import run_ranks

    cases = [("local", 1, False), ("dtensor", 2, False), ("local", 2, False)]
    if not quick:
        cases += [("dtensor", 2, True), ("local", 2, True)]
    rows: list[dict[str, Any]] = []
    for plan, tp, sp in cases:
        res = run_ranks(_rank, tp, plan, sp, timeout_s=900)
        rows.append({"plan": plan, "tp": tp, "sp": sp, "cpu_ms": round(max(r["cpu_ms"] for r in res), 1),
                     "wall_ms": round(max(r["wall_ms"] for r in res), 1), "loss": res[0]["loss"]})
    single = rows[0]
    lines = [f"Model `tiny`, one micro-batch of {ROWS} rows per `forward_backward` (vocab-parallel loss "
             f"included, optimizer not), {PASSES} passes after {WARMUP} warm-up, one process per rank with one "
             f"thread, {os.cpu_count()} CPU cores; the slowest rank's CPU and wall time per pass.", "",
             "| plan | tp | sp | CPU ms/pass | wall ms/pass | vs DTensor plan (CPU) | vs tp=1 (CPU) | loss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next((b for b in rows if b["plan"] == "dtensor" and b["tp"] == r["tp"] and b["sp"] == r["sp"]), None)
        if base is not None and abs(r["loss"] - base["loss"]) > 1e-6 * abs(base["loss"]):
            raise RuntimeError(f"the two plans disagree on the loss: {r} vs {base}")
        r["vs_dtensor"] = round(r["cpu_ms"] / base["cpu_ms"], 2) if base else None
        r["vs_single"] = round(r["cpu_ms"] / single["cpu_ms"], 2)
        name = ("single process" if r["tp"] == 1 else "local shards (engine)" if r["plan"] == "local"
                else "DTensor `parallelize_module` (baseline)")
        lines.append(f"| {name} | {r['tp']} | {'on' if r['sp'] else 'off'} | {r['cpu_ms']} | {r['wall_ms']} | "
                     f"{'-' if r['vs_dtensor'] is None else str(r['vs_dtensor']) + 'x'} | {r['vs_single']}x | "
                     f"{r['loss']:.6f} |")
    lines += ["", "The baseline's limits: it is the engine's own model and trainer with only the TP plan swapped "
              "(`dtensor_plan` here, the engine's plan before 2026-12-06, without the KV-head gather for tp > "
              "kv_heads); on 2 cores the two ranks' collectives wait for each other, so the CPU time includes "
              "gloo's spinning. A tiny model measures the per-op overhead, not the matmuls."]
    return {"name": "tp_forward", "rows": rows, "markdown": "\n".join(lines)}


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(run(quick="--quick" in sys.argv)["markdown"])
