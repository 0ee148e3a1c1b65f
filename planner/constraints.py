"""Validity rules, each with the reason a candidate is rejected (None = passes).

Split by what they need, so the search can reject a whole factorization before looking at knobs.
For engine-only specs (``PlanSpec.engine_only``) each check applies the engine's own limits from
:mod:`planner.engine_rules` (their one home, also called by ``workers.engine.validate``), so a plan
made for the engine is never refused by it; the general rules here describe what the cost model
assumes of other engines (Megatron-style interleaving, uneven stages).
"""

from __future__ import annotations

from planner import engine_rules as E
from planner.layout import Layout, checkpoint_interval
from planner.memory import head_layer_equivalents, stage_layers
from planner.spec import PlanSpec


def check_tp(spec: PlanSpec, tp: int) -> tuple[str, str] | None:
    m = spec.model
    if spec.engine_only:
        return E.tp_rule(m, tp)
    if m.heads % tp:
        return "heads", f"heads {m.heads} not divisible by tp {tp}"
    if m.kv_heads % tp and tp % m.kv_heads:
        return "kv_heads", f"kv_heads {m.kv_heads} neither divisible by tp {tp} nor a divisor of it (no KV replication)"
    if m.ffn % tp:
        return "ffn", f"ffn {m.ffn} not divisible by tp {tp}"
    return None


def check_cp(spec: PlanSpec, cp: int) -> tuple[str, str] | None:
    if spec.engine_only:
        return E.cp_split_rule(spec.model, cp)
    if cp > 1 and spec.model.seq_len % (2 * cp):
        return "seq_len", f"seq_len {spec.model.seq_len} not divisible by 2*cp = {2 * cp} (zigzag load balancing)"
    return None


def check_pp(spec: PlanSpec, pp: int, vpp: int) -> tuple[str, str] | None:
    layers = spec.model.layers
    if pp * vpp > layers:
        return "layers", f"pp*vpp = {pp * vpp} exceeds the {layers} layers"
    if spec.engine_only:
        return E.stage_rule(spec.model, pp, vpp)
    if layers % (pp * vpp):
        chunk = -(-layers // (pp * vpp))
        if layers - chunk * vpp * (pp - 1) <= 0:
            return "layers", f"layers {layers} cannot be split unevenly over pp*vpp = {pp * vpp} (last stage empty)"
    return None


def check_batch(spec: PlanSpec, dp: int, micro_batch: int) -> tuple[str, str] | None:
    if spec.global_batch % (dp * micro_batch):
        return "global_batch", (f"global_batch {spec.global_batch} not divisible by dp*micro_batch = "
                                f"{dp}*{micro_batch}")
    return None


def check_schedule(spec: PlanSpec, lay: Layout, num_micro_batches: int) -> tuple[str, str] | None:
    if spec.engine_only:
        return E.schedule_rule(lay, num_micro_batches)
    if lay.schedule == "interleaved" and num_micro_batches % lay.pp:
        return "schedule", (f"interleaved schedule needs micro-batches ({num_micro_batches}) to be a multiple "
                            f"of pp ({lay.pp})")
    return None


def layer_checkpoint_cap(spec: PlanSpec, pp: int, vpp: int) -> int:
    """The largest N of ``layer:N`` that means something for this stage split: the layers of the
    busiest pipeline stage (every N-th layer of a stage is checkpointed, so a larger N checkpoints
    none, which is ``none``; 1 would be ``full``)."""
    return max(stage_layers(spec.model.layers, pp, vpp, head_layer_equivalents(spec.model)))


def check_recompute(spec: PlanSpec, lay: Layout) -> tuple[str, str] | None:
    every = checkpoint_interval(lay.recompute)
    if every > 1:
        cap = layer_checkpoint_cap(spec, lay.pp, lay.vpp)
        if every > cap:
            allowed = f"N must be 2..{cap}" if cap >= 2 else "layer:N does not apply (use full or none)"
            return "recompute", (f"recompute {lay.recompute} checkpoints every {every}-th layer of a pipeline "
                                 f"stage, but the busiest stage has {cap} layer(s): {allowed} "
                                 "(a larger N checkpoints no layer: that is recompute none)")
    return None


def check_knobs(spec: PlanSpec, lay: Layout) -> tuple[str, str] | None:
    m = spec.model
    bad = check_recompute(spec, lay)
    if bad:
        return bad
    if spec.engine_only:
        bad = E.cp_rule(m, lay)
        if bad:
            return bad
    if lay.cp > 1 and lay.cp_method == "ulysses":
        heads_local = m.heads // lay.tp
        if heads_local % lay.cp:
            return "cp_method", f"ulysses needs heads/tp = {heads_local} divisible by cp {lay.cp}"
    if lay.sp and lay.tp == 1:
        return "sp", "sequence parallelism needs tp > 1"
    return None


def check_all(spec: PlanSpec, lay: Layout) -> tuple[str, str] | None:
    """Every structural rule for a complete layout (memory is checked separately)."""
    if lay.num_micro_batches and lay.num_micro_batches * lay.dp * lay.micro_batch != spec.global_batch:
        return "global_batch", (f"dp*micro_batch*num_micro_batches = {lay.dp}*{lay.micro_batch}*"
                                f"{lay.num_micro_batches} is not the global_batch {spec.global_batch}")
    nmb = lay.num_micro_batches or (spec.global_batch // (lay.dp * lay.micro_batch)
                                    if spec.global_batch % (lay.dp * lay.micro_batch) == 0 else 0)
    bad = (check_tp(spec, lay.tp) or check_cp(spec, lay.cp) or check_pp(spec, lay.pp, lay.vpp)
           or check_batch(spec, lay.dp, lay.micro_batch) or check_schedule(spec, lay, nmb)
           or check_knobs(spec, lay))
    if bad is None and spec.engine_only:
        bad = E.first_refusal(spec.model, lay, spec.global_batch)
    return bad
