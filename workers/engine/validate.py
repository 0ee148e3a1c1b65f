"""Which (model, layout, batch) combinations the engine runs, and why not. Pure Python (no torch).

The CLI calls :func:`layout_problems` before any process starts; the trainer calls it again.
"""

from __future__ import annotations

from planner.layout import Layout, LayoutError
from workers.engine.config import ModelConfig


def tp_refusal(cfg: ModelConfig, tp: int) -> str | None:
    if tp == 1:
        return None
    if cfg.heads % tp:
        return f"heads {cfg.heads} not divisible by tp={tp}"
    if cfg.kv_heads % tp and tp % cfg.kv_heads:
        return (f"kv_heads {cfg.kv_heads} and tp={tp}: one must divide the other "
                f"(KV heads are replicated when tp > kv_heads)")
    if cfg.ffn % tp:
        return f"ffn {cfg.ffn} not divisible by tp={tp}"
    if cfg.vocab % tp:
        return f"vocab {cfg.vocab} not divisible by tp={tp}"
    return None


def cp_refusal(cfg: ModelConfig, layout: Layout) -> str | None:
    cp, tp = layout.cp, layout.tp
    if cfg.seq_len % (2 * cp):
        return f"sequence length {cfg.seq_len} not divisible by 2*cp = {2 * cp} (zigzag split)"
    local = cfg.seq_len // cp
    if layout.sp and tp > 1 and local % tp:
        return f"per-CP-rank sequence {local} not divisible by tp={tp} (sequence parallelism)"
    if cp > 1 and layout.cp_method == "ulysses":
        heads_local = cfg.heads // tp if cfg.heads % tp == 0 else cfg.heads
        if heads_local % cp:
            return (f"cp_method=ulysses needs the attention heads of each TP rank ({heads_local}) to be "
                    f"divisible by cp={cp}: the all-to-all gives every CP rank heads/cp whole heads; "
                    f"use cp_method=ring")
    return None


def pp_refusal(cfg: ModelConfig, layout: Layout, num_micro_batches: int) -> str | None:
    stages = layout.pp * layout.vpp
    if cfg.layers % stages:
        return f"layers {cfg.layers} not divisible by pp*vpp = {layout.pp}*{layout.vpp} = {stages}"
    if layout.pp > 1 and layout.schedule == "1f1b" and num_micro_batches < layout.pp:
        return f"schedule 1f1b needs at least pp={layout.pp} micro-batches per step, got {num_micro_batches}"
    if layout.schedule == "interleaved":
        rounds = max(1, num_micro_batches // layout.pp)
        if num_micro_batches % rounds:
            return (f"schedule interleaved needs the micro-batches ({num_micro_batches}) to be a multiple of "
                    f"max(1, micro-batches // pp) = {rounds}")
    return None


def layout_problems(cfg: ModelConfig, layout: Layout, global_batch: int, world_size: int | None = None
                    ) -> list[str]:
    """Every reason ``layout`` cannot train ``cfg`` with ``global_batch`` (empty when it can)."""
    problems: list[str] = []
    if world_size is not None and layout.world_size != world_size:
        problems.append(f"tp*cp*pp*dp = {layout.world_size} does not match the world size {world_size}")
    try:
        n_mb = layout.micro_batches_for(global_batch)
    except LayoutError as e:
        problems.append(str(e))
        n_mb = 0
    for reason in (tp_refusal(cfg, layout.tp), cp_refusal(cfg, layout),
                   pp_refusal(cfg, layout, n_mb) if n_mb else None):
        if reason:
            problems.append(reason)
    return problems
