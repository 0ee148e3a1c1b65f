"""Checkpoint benchmark: sync vs async save, per-step overhead, load time (one process, CPU).

A stack of linear layers trained with AdamW; the same number of steps is run three times: without
checkpoints, with a synchronous save every ``every`` steps, and with an asynchronous one (staged to a
CPU copy, written, hashed and committed on a background thread). The overhead per save is the extra
wall time of the run over the run without checkpoints, divided by the number of saves; the blocking
time is how long ``save()`` held the training loop.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workers.engine.checkpoint import Checkpointer, ModelOptimizerState, load_latest


def _model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])


def _run(mode: str, root: Path, width: int, depth: int, steps: int, every: int) -> dict[str, Any]:
    model = _model(width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(1))
    ckpt = Checkpointer(root, keep=2, async_save=mode == "async")
    state = ModelOptimizerState(model, opt)
    blocking, totals, pending, step_times = [], [], [], []
    nbytes = 0
    t_run = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if mode != "none" and step % every == 0:
            state.extra = {"step": step}
            info = ckpt.save(step, state, async_save=mode == "async")
            blocking.append(info.seconds)
            pending.append(info)
        step_times.append(time.perf_counter() - t0)
    for info in pending:
        done = info.wait()
        totals.append(done.seconds)
        nbytes = done.bytes
    ckpt.close()
    wall = time.perf_counter() - t_run
    return {"mode": mode, "steps": steps, "saves": len(pending), "wall_s": wall,
            "step_ms_median": 1e3 * statistics.median(step_times),
            "save_blocking_s": statistics.mean(blocking) if blocking else 0.0,
            "save_total_s": statistics.mean(totals) if totals else 0.0, "checkpoint_bytes": nbytes}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure; returns ``{"name": "checkpoint", "rows": [...], "markdown": "..."}``."""
    torch.set_num_threads(1)
    width, depth, steps, every = (256, 4, 12, 6) if quick else (1024, 8, 40, 10)
    params = depth * (width * width + width)
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="orthoplex-bench-ckpt-"))
    try:
        for mode in ("none", "sync", "async"):
            row = _run(mode, tmp / mode, width, depth, steps, every)
            row["params"] = params
            rows.append(row)
        base = rows[0]
        for row in rows[1:]:
            extra = row["wall_s"] - base["wall_s"]
            row["overhead_per_save_s"] = extra / max(row["saves"], 1)
            row["overhead_per_step_ms"] = 1e3 * extra / row["steps"]
        model = _model(width, depth)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        t0 = time.perf_counter()
        res = load_latest(tmp / "sync", ModelOptimizerState(model, opt))
        load_s = time.perf_counter() - t0
        rows.append({"mode": "load", "params": params, "load_s": load_s, "step": res.step if res else None,
                     "checkpoint_bytes": rows[1]["checkpoint_bytes"]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"name": "checkpoint", "rows": rows, "markdown": _markdown(rows, width, depth, every)}


def _markdown(rows: list[dict[str, Any]], width: int, depth: int, every: int) -> str:
    save_rows = [r for r in rows if r["mode"] != "load"]
    load = next(r for r in rows if r["mode"] == "load")
    mb = rows[1]["checkpoint_bytes"] / 2**20
    lines = [
        f"Model: {depth} x Linear({width}, {width}) + AdamW = {rows[0]['params'] / 1e6:.2f} M params; "
        f"checkpoint {mb:.1f} MiB (params + exp_avg + exp_avg_sq); a save every {every} steps, keep 2.",
        "",
        "| mode | steps | saves | step (median, ms) | save blocks loop (s) | save to commit (s) "
        "| overhead / save (s) | overhead / step (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in save_rows:
        lines.append(f"| {r['mode']} | {r['steps']} | {r['saves']} | {r['step_ms_median']:.1f} | "
                     f"{r['save_blocking_s']:.3f} | {r['save_total_s']:.3f} | "
                     f"{r.get('overhead_per_save_s', 0.0):.3f} | {r.get('overhead_per_step_ms', 0.0):.1f} |")
    lines += ["", f"Load of the newest verified checkpoint (sha256 of every file + DCP read): {load['load_s']:.3f} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    out = run(quick="--quick" in sys.argv)
    print(out["markdown"])
