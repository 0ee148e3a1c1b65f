"""Memory per GPU, by component (GiB = 2**30 bytes).

- **Model states** (Megatron ``dist_optimizer.md``): bf16/fp8 params + fp32 grads + fp32 Adam
  (master, m, v) = 2 + 4 + 12 = 18 B/param; fp16 = 2 + 2 + 16 = 20 B/param (fp8 keeps an extra
  1 B fp8 weight copy). ZeRO-1 shards the optimizer over the DP x CP group. ZeRO-3 (FSDP2) shards
  fp32 parameters (the master copy), fp32 gradients and Adam's m, v: 16 B/param over DP x CP.
  With replica groups (HSDP, ``dp_replicate`` > 1) the shard group is ``dp_shard x cp`` instead:
  every replica group holds the whole model and optimizer state.
- **Activations** (Korthikanti et al. 2022, Table 2, generalised to GQA, gated MLPs, flash
  attention and CP): per layer and micro-batch, with ``t = b·s/cp`` tokens on the rank,
  ``t·[10h/(T if SP else 1) + (2h + 4·kv·dh + 2h + 2·fc1 + 2·F)/T] + 5·a·(s/cp)·s·b/T`` bytes (the
  last term only for materialized attention). Selective recompute drops the attention-score term;
  full recompute keeps only the layer input ``2·t·h`` (/T with SP) plus one layer's working set;
  ``layer:N`` (every N-th layer checkpointed) averages the two; ``op`` (TorchTitan's op-level SAC)
  keeps the layer input, q, v, the attention output, the first fc1 half and the LSE.
  The first stage holds ``min(m, p)`` micro-batches of its layers (1F1B; GPipe keeps ``m``;
  interleaving multiplies by ``1 + (p-1)/(p·v)``).
- **Embedding/logits**: embedding output on the first stage; fp32 logits ``4·t·(h+V)/T`` on the last.
- **Runtime overhead**: CUDA context, NCCL buffers, allocator slack: a fixed ``min(3, 4% of HBM)`` GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from planner.flops import layer_params
from planner.layout import Layout, checkpoint_interval
from planner.spec import ModelSpec, PlanSpec

GiB = float(2**30)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    components: dict[str, float]  # GiB, on the busiest stage
    total_gb: float
    first_stage_gb: float
    last_stage_gb: float


@lru_cache(maxsize=8192)
def stage_layers(layers: int, pp: int, vpp: int, head_eq: float = 0.0) -> tuple[int, int]:
    """(layers on the first stage, layers on the last stage).

    Even splits follow Megatron (``L/p`` everywhere; the last stage also runs the output layer).
    Uneven ones (not run by the engine) balance the output layer as ``head_eq`` layers' worth of
    work, as DeepSpeed's partitioner and Megatron's ``--decoder-last-pipeline-num-layers`` allow;
    with interleaving the first stages take ``ceil(L/(p·v))`` layers per chunk.
    """
    if pp == 1:
        return layers, layers
    if layers % (pp * vpp) == 0:
        return layers // pp, layers // pp
    if vpp > 1:
        first = math.ceil(layers / (pp * vpp)) * vpp
        return first, max(0, layers - first * (pp - 1))
    best: tuple[float, int, int] | None = None
    for last in range(1, layers - pp + 2):
        first = math.ceil((layers - last) / (pp - 1))
        cost = max(first, last + head_eq)
        if best is None or cost < best[0]:
            best = (cost, first, last)
    assert best is not None
    return best[1], best[2]


@lru_cache(maxsize=256)
def head_layer_equivalents(m: ModelSpec) -> float:
    """The output layer's work in decoder layers (FLOP ratio), for balancing uneven stages."""
    from planner.flops import layer_matmul_params

    return m.vocab * m.hidden / (layer_matmul_params(m) + m.seq_len * m.hidden)


def state_bytes_per_param(precision: str, zero: int, shard: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter after ZeRO sharding over ``shard`` ranks."""
    if zero >= 3:
        # FSDP2 / ZeRO-3: the fp32 sharded parameters are the master copy (the low-precision
        # weights exist only gathered, one or two layers at a time: see the ZeRO-3 buffer), fp32
        # sharded gradients (reduce_dtype fp32), Adam m and v: 4 + 4 + 8 = 16 B per parameter
        return 4.0 / shard, 4.0 / shard, 8.0 / shard
    w = 3.0 if precision == "fp8" else 2.0
    g, o = (2.0, 16.0) if precision == "fp16" else (4.0, 12.0)
    if zero >= 1:
        o /= shard
    return w, g, o


def activation_bytes_per_layer(spec: PlanSpec, lay: Layout, recompute: str | None = None) -> float:
    """Activation bytes one layer keeps for one micro-batch on one rank (see module docstring)."""
    m = spec.model
    rc = recompute or lay.recompute
    tok = lay.micro_batch * m.seq_len / lay.cp
    h, t = m.hidden, lay.tp
    sp_div = t if lay.sp else 1
    if rc == "full":
        return 2.0 * tok * h / sp_div
    every = checkpoint_interval(rc)
    if every > 1:  # layer:N: one layer in N keeps only its input, the others everything
        return (activation_bytes_per_layer(spec, lay, "full") + (every - 1) * activation_bytes_per_layer(spec, lay, "none")) / every
    kv = m.kv_heads * m.head_dim
    fc1 = (2 if m.gated_mlp else 1) * m.ffn
    lse = 4.0 * m.heads * tok / t  # flash attention's softmax statistics (fp32)
    if rc == "op":
        # TorchTitan's op-level SAC: saves the outputs of the odd-numbered matmuls (q, v, fc1's
        # first half, fc2), the attention output and the collectives; recomputes the rest. The
        # layer input stays (replicated without SP), fc2's output is the next layer's input.
        return 2.0 * tok * h / sp_div + tok * (2 * h + 2 * kv + 2 * h + 2 * m.ffn) / t + lse
    replicated = 10.0 * tok * h / sp_div
    split = tok * (2 * h + 4 * kv + 2 * h + 2 * fc1 + 2 * m.ffn) / t
    if m.attention == "materialized":
        scores = 5.0 * m.heads * (m.seq_len / lay.cp) * m.seq_len * lay.micro_batch / t
    else:
        scores = lse
    if rc == "selective":
        scores = 0.0 if m.attention == "materialized" else scores
    return replicated + split + scores


def inflight_factor(lay: Layout, m: int) -> float:
    """Micro-batches whose activations the first stage holds at the peak."""
    p, v = lay.pp, lay.vpp
    if p == 1:
        return 1.0
    if lay.schedule == "gpipe":
        return float(m)
    held = float(min(m, p))
    if v > 1:
        held *= 1 + (p - 1) / (p * v)
    return held


def _stages(spec: PlanSpec, lay: Layout, recompute: str | None = None) -> tuple[dict[str, float], dict[str, float]]:
    m = spec.model
    rc = recompute or lay.recompute
    p, t = lay.pp, lay.tp
    mb = lay.num_micro_batches or max(1, spec.global_batch // (lay.dp * lay.micro_batch))
    first_layers, last_layers = stage_layers(m.layers, p, lay.vpp, head_layer_equivalents(m))
    # ZeRO shards over one replica group's dp_shard x cp (all of dp x cp without replica groups)
    w, g, o = state_bytes_per_param(spec.precision, lay.zero, lay.dp_shard * lay.cp)
    per_param = w + g + o
    lp = layer_params(m) / t
    emb = m.vocab * m.hidden / t
    head = 0.0 if (m.tied_embeddings and p == 1) else emb  # untied head, or the tied copy on the last stage

    tok = lay.micro_batch * m.seq_len / lay.cp
    sp_div = t if lay.sp else 1
    act_layer = activation_bytes_per_layer(spec, lay, rc)
    # a fully recomputed layer rebuilds all its activations during its backward
    working = activation_bytes_per_layer(spec, lay, "none") if checkpoint_interval(rc) else 0.0
    zero3_buf = 2.0 * lp * 2.0 + lp * 4.0 if lay.zero >= 3 else 0.0
    emb_act = 3.0 * tok * m.hidden / sp_div
    logits = 4.0 * tok * (m.hidden + m.vocab) / t
    overhead = runtime_overhead_bytes(spec)

    def stage(layers: int, with_emb: bool, with_head: bool, held: float) -> dict[str, float]:
        params_layers = layers * lp
        params_emb = (emb if with_emb else 0.0) + (head if with_head else 0.0)
        return {
            "weights": params_layers * w,
            "grads": params_layers * g,
            "optimizer": params_layers * o,
            "embedding_states": params_emb * per_param,
            "activations": act_layer * layers * held + working + zero3_buf,
            "embedding_logits_act": (emb_act * held if with_emb else 0.0) + (logits if with_head else 0.0),
            "runtime_overhead": overhead,
        }

    if p == 1:
        first = stage(first_layers, True, True, 1.0)
        return first, first
    return (stage(first_layers, True, False, inflight_factor(lay, mb)), stage(last_layers, False, True, 1.0))


def runtime_overhead_bytes(spec: PlanSpec) -> float:
    """CUDA context, NCCL buffers, allocator slack."""
    return min(3.0, 0.04 * spec.cluster.gpu_mem_gb) * GiB


def states_floor_gb(spec: PlanSpec, tp: int, pp: int, shard: int, zero: int) -> float:
    """A lower bound on memory per GPU for any micro-batch, vpp, recompute and SP: the model states
    of ``layers/pp`` layers (the busiest stage holds at least that many) plus the runtime overhead."""
    w, g, o = state_bytes_per_param(spec.precision, zero, shard)
    states = spec.model.layers / pp * layer_params(spec.model) / tp * (w + g + o)
    return (states + runtime_overhead_bytes(spec)) / GiB


def stage_memory_gb(spec: PlanSpec, lay: Layout) -> tuple[dict[str, float], dict[str, float]]:
    """Components (GiB) of the first and of the last pipeline stage (the same stage when pp = 1)."""
    first, last = _stages(spec, lay)
    return {k: v / GiB for k, v in first.items()}, {k: v / GiB for k, v in last.items()}


def estimate_memory(spec: PlanSpec, lay: Layout) -> MemoryEstimate:
    first, last = _stages(spec, lay)
    ft = sum(first.values()) / GiB
    lt = sum(last.values()) / GiB
    busiest = first if ft >= lt else last
    comps = {k: v / GiB for k, v in busiest.items()}
    return MemoryEstimate(components=comps, total_gb=max(ft, lt), first_stage_gb=ft, last_stage_gb=lt)


def memory_total_gb(spec: PlanSpec, lay: Layout, recompute: str | None = None) -> float:
    """Same as ``estimate_memory(...).total_gb`` (the search's fast path), for ``lay`` with
    ``recompute`` instead of its own mode when given."""
    first, last = _stages(spec, lay, recompute)
    return max(sum(first.values()), sum(last.values())) / GiB


def largest_checkpoint_interval(spec: PlanSpec, lay: Layout, limit_gb: float, cap: int) -> int:
    """The largest N in ``2..cap`` for which ``lay`` with ``recompute=layer:N`` needs at most
    ``limit_gb``; 0 when none does.

    Closed form: only the activations depend on N, one layer's being ``none - (none - full)/N``
    (see :func:`activation_bytes_per_layer`), so a stage holding ``w`` layer-micro-batches needs
    ``P - Q/N`` bytes with ``Q = w·(none - full)``: it fits for ``N <= Q / (P - limit)``. Memory
    grows with N and recompute time falls with it, so this is the fastest ``layer:N`` that fits.
    """
    if cap < 2:
        return 0
    first, last = _stages(spec, lay, "layer:2")
    m = spec.model
    mb = lay.num_micro_batches or max(1, spec.global_batch // (lay.dp * lay.micro_batch))
    first_layers, last_layers = stage_layers(m.layers, lay.pp, lay.vpp, head_layer_equivalents(m))
    gap = activation_bytes_per_layer(spec, lay, "none") - activation_bytes_per_layer(spec, lay, "full")
    stages = [(sum(first.values()), first_layers * inflight_factor(lay, mb))]
    if lay.pp > 1:
        stages.append((sum(last.values()), float(last_layers)))
    limit = limit_gb * GiB
    best = cap
    for at_two, weight in stages:
        q = weight * gap
        p = at_two + q / 2.0
        if p > limit:
            best = min(best, math.floor(q / (p - limit)) if q > 0 else 0)
    # the closed form's rounding, checked exactly
    while best >= 2 and memory_total_gb(spec, lay, f"layer:{best}") > limit_gb:
        best -= 1
    return best if best >= 2 else 0


def memory_limit_gb(spec: PlanSpec) -> float:
    return spec.cluster.gpu_mem_gb * (1.0 - spec.memory_headroom)
