"""The engine's limits: which (model shape, layout, batch) the 4D engine in ``workers/engine`` runs.

The one home of these rules. Pure Python (no torch), so both sides call it: the planner, for
engine-only plans (``PlanSpec.engine_only``: a plan it returns is never refused by ``RankTrainer``
after the GPUs are reserved), and the engine's own validation (``workers.engine.validate``), which the
CLI and the trainer run before any collective starts.

Every rule returns ``(kind, reason)`` or ``None``; ``kind`` is the planner's rejection category
(the model field or layout knob at fault). The model shape is
anything with ``layers, heads, kv_heads, ffn, vocab, seq_len`` (the engine's ``ModelConfig`` and the
planner's ``ModelSpec`` both are).
"""

from __future__ import annotations

from typing import Protocol

from planner.layout import RECOMPUTE_MODES, Layout, LayoutError, recompute_error

Refusal = tuple[str, str]


class ModelShape(Protocol):
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int


#: the recompute modes the engine runs (``workers/engine/recompute.py``): every mode the planner
#: models, ``layer:N`` for any N >= 2 (``planner.layout.RECOMPUTE_MODES``)
ENGINE_RECOMPUTE: tuple[str, ...] = RECOMPUTE_MODES


def recompute_rule(recompute: object) -> Refusal | None:
    """The engine runs every mode of :data:`ENGINE_RECOMPUTE`; anything else is refused with that list."""
    if recompute_error(recompute):
        return "recompute", (f"the engine runs recompute {', '.join(ENGINE_RECOMPUTE)} (N an integer >= 2), "
                             f"not {recompute!r}")
    return None


def tp_rule(m: ModelShape, tp: int) -> Refusal | None:
    """Tensor parallelism splits heads, the MLP and the vocabulary (vocab-parallel embedding and loss)."""
    if tp == 1:
        return None
    if m.heads % tp:
        return "heads", f"heads {m.heads} not divisible by tp={tp}"
    if m.kv_heads % tp and tp % m.kv_heads:
        return "kv_heads", (f"kv_heads {m.kv_heads} and tp={tp}: one must divide the other "
                            f"(KV heads are replicated when tp > kv_heads)")
    if m.ffn % tp:
        return "ffn", f"ffn {m.ffn} not divisible by tp={tp}"
    if m.vocab % tp:
        return "vocab", f"vocab {m.vocab} not divisible by tp={tp}"
    return None


def cp_split_rule(m: ModelShape, cp: int) -> Refusal | None:
    """The sequence is cut into ``2*cp`` chunks (zigzag load balancing), also at ``cp=1``."""
    if m.seq_len % (2 * cp):
        return "seq_len", f"sequence length {m.seq_len} not divisible by 2*cp = {2 * cp} (zigzag split)"
    return None


def cp_rule(m: ModelShape, layout: Layout) -> Refusal | None:
    """Context parallelism (zigzag halves), sequence parallelism and Ulysses head splits."""
    cp, tp = layout.cp, layout.tp
    split = cp_split_rule(m, cp)
    if split:
        return split
    local = m.seq_len // cp
    if layout.sp and tp > 1 and local % tp:
        return "sp", f"per-CP-rank sequence {local} not divisible by tp={tp} (sequence parallelism)"
    if cp > 1 and layout.cp_method == "ulysses":
        heads_local = m.heads // tp if m.heads % tp == 0 else m.heads
        if heads_local % cp:
            return "cp_method", (f"cp_method=ulysses needs the attention heads of each TP rank ({heads_local}) "
                                 f"to be divisible by cp={cp}: the all-to-all gives every CP rank heads/cp "
                                 f"whole heads; use cp_method=ring")
    return None


def stage_rule(m: ModelShape, pp: int, vpp: int) -> Refusal | None:
    """The engine cuts the layers into ``pp*vpp`` equal stages."""
    if m.layers % (pp * vpp):
        return "layers", f"layers {m.layers} not divisible by pp*vpp = {pp}*{vpp} = {pp * vpp}"
    return None


def schedule_rule(layout: Layout, num_micro_batches: int) -> Refusal | None:
    """What each pipeline schedule needs of the micro-batch count per step."""
    if layout.pp > 1 and layout.schedule == "1f1b" and num_micro_batches < layout.pp:
        return "schedule", (f"schedule 1f1b needs at least pp={layout.pp} micro-batches per step, "
                            f"got {num_micro_batches}")
    if layout.schedule == "interleaved":
        rounds = max(1, num_micro_batches // layout.pp)
        if num_micro_batches % rounds:
            return "schedule", (f"schedule interleaved needs the micro-batches ({num_micro_batches}) to be a "
                                f"multiple of max(1, micro-batches // pp) = {rounds}")
    return None


def pp_rule(m: ModelShape, layout: Layout, num_micro_batches: int) -> Refusal | None:
    """Even stages, and the schedule's need of micro-batches."""
    return stage_rule(m, layout.pp, layout.vpp) or schedule_rule(layout, num_micro_batches)


def micro_batches(layout: Layout, global_batch: int) -> tuple[int, Refusal | None]:
    """Micro-batches per replica for ``global_batch``, or 0 and why it does not divide."""
    try:
        return layout.micro_batches_for(global_batch), None
    except LayoutError as e:
        return 0, ("global_batch", str(e))


def refusals(m: ModelShape, layout: Layout, global_batch: int, world_size: int | None = None) -> list[Refusal]:
    """Every reason the engine refuses ``layout`` for ``m`` and ``global_batch`` (empty: it runs)."""
    out: list[Refusal] = []
    if world_size is not None and layout.world_size != world_size:
        out.append(("world_size", f"tp*cp*pp*dp = {layout.world_size} does not match the world size {world_size}"))
    n_mb, bad = micro_batches(layout, global_batch)
    if bad:
        out.append(bad)
    for r in (recompute_rule(layout.recompute), tp_rule(m, layout.tp), cp_rule(m, layout),
              pp_rule(m, layout, n_mb) if n_mb else None):
        if r:
            out.append(r)
    return out


def first_refusal(m: ModelShape, layout: Layout, global_batch: int) -> Refusal | None:
    """The first of :func:`refusals` (what the planner reports for a rejected candidate)."""
    found = refusals(m, layout, global_batch)
    return found[0] if found else None
