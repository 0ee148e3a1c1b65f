"""Step time by component.

Per micro-batch and pipeline stage (``tok = b·s/cp`` tokens on a rank, ``T`` = TP):

- **GEMMs** (QKV, proj, fc1, fc2; logits on the last stage) at a roofline with a size-dependent
  efficiency: ``t = max(2MNK / (peak·eff·g(min(M,N,K))), bytes / (HBM·0.7)) + launch``,
  ``g(d) = d/(d+32)``, ``eff`` the GPU's sustained large-GEMM fraction. Backward = 2 x forward.
  **fp8** GEMMs run at the fp8 peak with the GPU's ``fp8_gemm_efficiency``, deeper tiles
  (``g(d) = d/(d+64)``) and their casts, priced by the stack (:func:`gemm_time`): unfused (torchao,
  plain PyTorch) or Transformer Engine's (``model.attention: fused``: casts fused into the norms,
  weights cached across micro-batches). The output layer stays in bf16 under fp8.
- **Attention core**: a flash-type kernel (FlashAttention-2 class, or the vendor's fused kernel:
  cuDNN / Transformer Engine, FlashAttention-3 class on Hopper) with the causal half skipped, at an
  efficiency curve in block length, causality and head dim (:func:`attention_efficiency`;
  ``L = s/(2cp)`` under zigzag CP), backward 2.5 x forward; or materialized (full s² batched GEMMs
  at the roofline plus softmax/dropout traffic).
- **Memory-bound ops** (norms, residuals, dropout, activation function, RoPE): bytes / (HBM·0.7);
  the replicated part is divided by T only with SP.
- **TP/SP collectives**: per layer 2 all-reduce-equivalents forward, 2 backward (+2 with full
  recompute) of ``2·tok·h`` bytes, ring cost ``2(T-1)/T·S/BW``, on NVLink when the TP group fits in
  a node, on the NICs otherwise (a group with k members per node gets k NICs: NCCL runs a ring per
  NIC). Not overlapped, unless the software pipelines them with the GEMMs (``spec.tp_overlap``:
  TE userbuffers, PyTorch AsyncTP; see :func:`tp_overlapped`: the all-gather side hides whole).
- **CP**: ring passes K/V chunks ``(cp-1)`` times (backward 2 x), each transfer overlapped with one
  step's attention (a ``cp``-th of it): what a step cannot hide is exposed, plus 20 µs of
  launch/synchronisation per ring step. Ulysses: two all-to-alls each way, exposed.
- **PP**: point-to-point ``2·tok·h/T`` bytes per chunk boundary, forward and backward, exposed in
  a plain pipeline, overlapped with the other chunks' compute when interleaved (:func:`p2p_exposed`);
  bubble ``(p-1)/v`` stage-times, i.e. ``(p-1)/(v·m+p-1)`` of the pipeline time.
- **DP**: gradient all-reduce (ZeRO-0) or reduce-scatter + parameter all-gather (ZeRO-1) over
  DP x CP, bucketed and overlapped with the last micro-batch's backward and the first forward, over
  the cool-down / warm-up of every model chunk when interleaved (:func:`dp_windows`); ZeRO-3
  (FSDP2) gathers parameters forward and backward and reduce-scatters gradients for every
  micro-batch, prefetched under the previous layer's compute: the first gather of each pass and the last reduce-scatter (a layer's
  share) are always exposed.
- **Overlap is not free**: every second of communication hidden under compute slows that compute by
  0.15 s (NCCL kernels occupy SMs and HBM bandwidth), charged to that communication's component;
  CP also pays the online-softmax merges of partial results.
- **Recompute**: full = one more forward (with its TP collectives); ``layer:N`` = that for one layer
  in N; ``op`` = the even-numbered matmuls (k, output projection, fc1's second half) and the
  memory-bound ops again; selective = attention core again.
- **Optimizer**: ~30 bytes of HBM traffic per local parameter shard.

Compute terms are divided by the slowest used node's relative speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from planner.flops import layer_params
from planner.layout import Layout, checkpoint_interval
from planner.memory import head_layer_equivalents, stage_layers
from planner.spec import ModelSpec, PlanSpec

GEMM_LAUNCH_S = 4e-6
GEMM_DIM_HALF = 32.0
MEM_EFF = 0.70
NVLINK_EFF = 0.75
NIC_EFF = 0.80
LAT_INTRA_S = 2e-6
LAT_INTER_S = 6e-6
FP8_AMAX_S = 4e-6  # the amax reductions of one fp8 GEMM's casts (small kernels), per forward-equivalent
FLASH_HALF_LEN = 256.0  # flash attention reaches half its efficiency at this sequence (block) length
FLASH_BLOCK = 128.0  # causal: the diagonal tiles of this size are computed whole, half of them masked
HEAD_DIM_HALF = 32.0  # head-dim fall-off of flash kernels (d/(d+32), relative to d = 128)
CP_STEP_S = 20e-6  # per ring step: kernel launch + send/recv synchronisation, not hidden
ELEM_REPLICATED_BYTES = 32.0  # bytes per hidden element per token per layer forward
OPT_BYTES_PER_PARAM = 30.0
OVERLAP_COST = 0.15  # compute lost per second of communication hidden under it (NCCL takes SMs and HBM)


@dataclass(frozen=True, slots=True)
class Hardware:
    peak: float  # FLOP/s for GEMMs at this precision
    peak_bf16: float
    eff: float
    attn_eff: float  # flash attention forward + backward, fraction of the bf16 peak
    fused_attn_eff: float  # the vendor's fused attention kernel, same measure
    mem_bw: float  # bytes/s achieved by memory-bound kernels
    intra_bw: float  # bytes/s, effective collective bandwidth on NVLink
    inter_bw: float  # bytes/s per GPU on the NICs
    speed: float  # slowest used node's relative speed
    fp8: bool = False  # GEMMs in fp8: bigger tiles, casts and amax reductions
    tp_overlap: bool = False  # TP collectives pipelined with their GEMMs (TE userbuffers, PyTorch AsyncTP)
    te: bool = False  # Transformer Engine's layers (Megatron-Core / NeMo): fp8 casts fused into the norms
    eff_bf16: float = 0.0  # the bf16 GEMM fraction (GEMMs kept in bf16 under fp8: the output layer); 0 = eff


def hardware_for(spec: PlanSpec, speed: float = 1.0) -> Hardware:
    c = spec.cluster
    fp8 = spec.precision == "fp8"
    return Hardware(
        peak=(c.peak_tflops_fp8 if fp8 else c.peak_tflops) * 1e12,
        peak_bf16=c.peak_tflops * 1e12,
        eff=c.fp8_gemm_efficiency if fp8 else c.gemm_efficiency,
        attn_eff=c.attention_efficiency,
        fused_attn_eff=c.fused_attention_efficiency or c.attention_efficiency,
        mem_bw=c.mem_bw_GBps * 1e9 * MEM_EFF,
        intra_bw=c.intra_node_bw_GBps * 1e9 * NVLINK_EFF,
        inter_bw=c.inter_node_bw_Gbps_per_gpu / 8 * 1e9 * NIC_EFF,
        speed=speed,
        fp8=fp8,
        tp_overlap=spec.tp_overlap,
        te=spec.model.attention == "fused",
        eff_bf16=c.gemm_efficiency,
    )


def gemm_time(hw: Hardware, m: float, n: float, k: float, peak: float | None = None,
              eff: float | None = None, fused_input: bool = False) -> float:
    """One GEMM (M x K by K x N) at the roofline with a size-dependent efficiency.

    In fp8 (``hw.fp8`` and no explicit ``peak``) the tiles are twice as deep, so small dimensions
    cost more (``g(d) = d/(d + 2·32)``), and every GEMM pays its casts, all memory-bound, returned as
    one forward-equivalent (the caller counts backward as two forwards, so a third of the casts is
    charged here):

    - unfused (torchao float8, plain PyTorch): the activation and weight inputs are read in bf16,
      their amax taken and written in fp8 (5 bytes per element) forward; backward casts the output
      gradient the same way and transposes both inputs (3 bytes per element).
    - Transformer Engine (``hw.te``): the weight is cast once per step and cached for the other
      micro-batches (``is_first_microbatch``); an input produced by a TE norm (``fused_input``:
      ``LayerNormLinear`` before QKV and fc1) comes out of the norm kernel already in fp8 with its
      transpose; other inputs pay one fused cast-transpose (read 2, write 1 + 1 bytes per element);
      the output gradient pays the same fused cast-transpose backward.
    """
    flops = 2.0 * m * n * k
    d = min(m, n, k)
    fp8 = hw.fp8 and peak is None
    g = d / (d + GEMM_DIM_HALF * (2.0 if fp8 else 1.0))
    compute = flops / ((peak or hw.peak) * (eff or hw.eff) * g)
    traffic = (1.0 if fp8 else 2.0) * (m * k + k * n) / hw.mem_bw + 2.0 * m * n / hw.mem_bw
    t = max(compute, traffic) + GEMM_LAUNCH_S
    if fp8:
        if hw.te:
            casts = (0.0 if fused_input else 4.0 * m * k) + 4.0 * m * n
        else:
            casts = 5.0 * (m * k + k * n) + 5.0 * m * n + 3.0 * (m * k + k * n)
        t += casts / hw.mem_bw / 3.0 + FP8_AMAX_S
    return t


def group_link(hw: Hardware, inside_node: bool, per_node: int = 1) -> tuple[float, float]:
    """(bandwidth, per-hop latency) of a collective's group.

    Inside a node: NVLink. Across nodes NCCL runs one ring per NIC, so a group with ``per_node``
    members on every node gets ``per_node`` NICs' worth of bus bandwidth (capped by NVLink);
    point-to-point traffic (``per_node = 1``) gets one NIC.
    """
    if inside_node:
        return hw.intra_bw, LAT_INTRA_S
    return min(max(1, per_node) * hw.inter_bw, hw.intra_bw), LAT_INTER_S


def allreduce_time(size: float, n: int, bw: float, lat: float) -> float:
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * size / bw + 2 * (n - 1) * lat


def half_collective_time(size: float, n: int, bw: float, lat: float) -> float:
    """Reduce-scatter or all-gather of a tensor of ``size`` bytes (full size) over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * size / bw + (n - 1) * lat


def attention_efficiency(hw: Hardware, kernel: str, length: float, head_dim: int) -> float:
    """Fraction of the bf16 peak a flash-type kernel sustains (forward + backward).

    The kernel's long-sequence value at head dim 128 (FlashAttention-2 class, or the vendor's fused
    kernel), times three physical fall-offs: short blocks (fixed per-tile overhead,
    ``L/(L+256)``), causal masking (of the ``n(n+1)/2`` tiles computed, ``n = L/128`` are diagonal
    and half wasted: ``n/(n+1)``) and small heads (``d/(d+32)``, relative to ``d = 128``).
    """
    top = hw.fused_attn_eff if kernel == "fused" else hw.attn_eff
    tiles = length / FLASH_BLOCK
    heads = min(1.0, (head_dim / (head_dim + HEAD_DIM_HALF)) / (128.0 / (128.0 + HEAD_DIM_HALF)))
    return top * length / (length + FLASH_HALF_LEN) * tiles / (tiles + 1.0) * heads


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One layer, one micro-batch, one rank. Compute terms already divided by node speed."""

    gemm_f: float
    attn_f: float
    attn_b: float
    elem_f: float
    tp_f: float  # TP collectives of one forward pass
    cp_f: float  # CP exposed, forward
    cp_b: float
    cp_hidden: float  # CP traffic hidden under attention (both passes)
    rc: float  # recompute extra (compute + its collectives)
    tp_hidden: float = 0.0  # TP traffic hidden under the GEMMs, one pass (``tp_overlap``)

    @property
    def fwd(self) -> float:
        return self.gemm_f + self.attn_f + self.elem_f + self.tp_f + self.cp_f

    @property
    def bwd(self) -> float:
        return 2 * self.gemm_f + self.attn_b + 2 * self.elem_f + self.tp_f + self.cp_b

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.rc


@lru_cache(maxsize=65536)
def layer_times(m: ModelSpec, precision: str, hw: Hardware, b: int, tp: int, cp: int, sp: bool,
                recompute: str, cp_method: str, tp_link: tuple[float, float],
                cp_link: tuple[float, float]) -> LayerTimes:
    h, s = m.hidden, m.seq_len
    dh = m.head_dim
    kv_local = max(1, m.kv_heads // tp) * dh  # KV heads replicate when tp > kv_heads
    q_local = h / tp
    tok = b * s / cp
    fc1 = (2 if m.gated_mlp else 1) * m.ffn
    gemm = (
        gemm_time(hw, tok, q_local + 2 * kv_local, h, fused_input=True)
        + gemm_time(hw, tok, h, q_local)
        + gemm_time(hw, tok, fc1 / tp, h, fused_input=True)
        + gemm_time(hw, tok, h, m.ffn / tp)
    )
    heads_local = m.heads / tp
    if m.attention != "materialized":
        flops = 4.0 * b * (s / cp) * s * q_local * 0.5  # causal: half the blocks skipped
        chunk = s / (2 * cp) if cp > 1 else s  # zigzag ring: each step works on s/(2cp)-long blocks
        attn_f = flops / (hw.peak_bf16 * attention_efficiency(hw, m.attention, chunk, dh))
        attn_b = 2.5 * attn_f  # backward recomputes the scores: 2.5 x the forward FLOPs
        attn_elem = 0.0
    else:
        sq = s / cp
        per_head = gemm_time(hw, sq, s, dh, peak=hw.peak_bf16) + gemm_time(hw, sq, dh, s, peak=hw.peak_bf16)
        attn_f = b * heads_local * (per_head - 2 * GEMM_LAUNCH_S) + 2 * GEMM_LAUNCH_S
        attn_elem = 9.0 * b * heads_local * sq * s / hw.mem_bw  # scale-mask-softmax + dropout
        attn_f += attn_elem
        attn_b = 2.0 * attn_f
    sp_div = tp if sp else 1
    elem_bytes = (
        ELEM_REPLICATED_BYTES * tok * h / sp_div
        + (6.0 if m.gated_mlp else 4.0) * tok * m.ffn / tp
        + 4.0 * tok * (q_local + kv_local)  # rotary / bias on q, k
    )
    elem_f = elem_bytes / hw.mem_bw
    speed = hw.speed
    gemm, attn_f, attn_b, elem_f = gemm / speed, attn_f / speed, attn_b / speed, elem_f / speed

    bw, lat = tp_link
    tp_f = 2 * allreduce_time(2.0 * tok * h, tp, bw, lat)
    tp_hidden = 0.0
    if hw.tp_overlap and tp > 1:
        tp_f, tp_hidden = tp_overlapped(tp_f, gemm, tp)

    cp_f = cp_b = cp_hidden = 0.0
    if cp > 1:
        cbw, clat = cp_link
        if cp_method == "ring":
            chunk = 2.0 * tok * kv_local * 2.0
            ring_f = (cp - 1) * (chunk / cbw + clat)
            merge = (cp - 1) * 12.0 * tok * q_local / hw.mem_bw / hw.speed  # online-softmax merges (fp32)
            # step by step: each of the cp-1 transfers hides under one step's attention (a cp-th of
            # the whole), so a transfer longer than a step is exposed even when the totals balance
            cp_f = (cp - 1) * max(0.0, ring_f / (cp - 1) - attn_f / cp) + (cp - 1) * CP_STEP_S
            cp_b = (cp - 1) * max(0.0, 2 * ring_f / (cp - 1) - attn_b / cp) + 2 * (cp - 1) * CP_STEP_S
            hidden_f = ring_f - (cp_f - (cp - 1) * CP_STEP_S)
            hidden_b = 2 * ring_f - (cp_b - 2 * (cp - 1) * CP_STEP_S)
            cp_hidden = hidden_f + hidden_b
            cp_f += merge + OVERLAP_COST * hidden_f
            cp_b += 2 * merge + OVERLAP_COST * hidden_b
        else:
            a2a = (cp - 1) / cp * (2.0 * tok * (q_local + 2 * kv_local) + 2.0 * tok * q_local) / cbw
            cp_f = a2a + 2 * (cp - 1) * clat
            cp_b = 2 * cp_f
    rc = 0.0
    every = checkpoint_interval(recompute)
    if every:
        rc = (gemm + attn_f + elem_f + tp_f + cp_f) / every
    elif recompute == "op":
        # k, the output projection and fc1's second half again, and the cheap ops; the saved
        # collectives' outputs are not recomputed
        rc = (gemm_time(hw, tok, kv_local, h) + gemm_time(hw, tok, h, q_local)
              + (gemm_time(hw, tok, m.ffn / tp, h) if m.gated_mlp else 0.0)) / speed + elem_f
    elif recompute == "selective":
        rc = attn_f
    return LayerTimes(gemm, attn_f, attn_b, elem_f, tp_f, cp_f, cp_b, cp_hidden, rc, tp_hidden)


def tp_overlapped(tp_comm: float, gemm: float, tp: int) -> tuple[float, float]:
    """(exposed, hidden) seconds of a pass's TP collectives when they are pipelined with the GEMMs
    they feed (Transformer Engine's userbuffers ``--tp-comm-overlap``, PyTorch's AsyncTP): each
    all-gather / reduce-scatter is split into its ``tp`` ring steps, step ``i``'s transfer running
    under the GEMM on chunk ``i - 1``. An all-gather starts on the rank's own shard, so its first
    transfer hides under that chunk's GEMM and none of it is exposed; a reduce-scatter's last
    transfer has no GEMM after it (one step exposed). Half the traffic is each kind, so ``1/(2·tp)``
    of it is exposed, or more when the traffic is longer than the GEMMs; what is hidden costs
    :data:`OVERLAP_COST` of compute."""
    exposed = max(tp_comm / (2 * tp), tp_comm - gemm)
    hidden = tp_comm - exposed
    return exposed + OVERLAP_COST * hidden, hidden


@dataclass(frozen=True, slots=True)
class Links:
    """(bandwidth bytes/s, latency s) per group kind, from the rank placement."""

    tp: tuple[float, float]
    cp: tuple[float, float]
    dp: tuple[float, float]
    pp: tuple[float, float]
    # replica groups (HSDP): the ZeRO shard group's link and the cross-replica all-reduce's link
    # (None without replica groups: the shard group is the whole DP x CP group, link ``dp``)
    dp_shard: tuple[float, float] | None = None
    dp_replicate: tuple[float, float] | None = None
    # ZeRO-3's per-layer parameter gathers and gradient reduce-scatters over the shard group: one NIC
    # per GPU once the group leaves a node (see :func:`zero3_traffic_s`; None: the shard group's link)
    zero3: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class TimeEstimate:
    step_time_s: float
    components: dict[str, float]  # exposed seconds per step; they add up to step_time_s
    hidden: dict[str, float]  # communication hidden under compute, seconds per step
    bubble_fraction: float


@lru_cache(maxsize=4096)
def head_time(m: ModelSpec, hw: Hardware, b: int, tp: int, cp: int) -> float:
    """Logits GEMM (bf16 in every precision) + cross-entropy (fp32) for one micro-batch, forward and
    backward."""
    tok = b * m.seq_len / cp
    # the output layer stays in bf16 under fp8 (Megatron's output layer is not a TE module; torchao's
    # float8 conversion skips it by default)
    g = gemm_time(hw, tok, m.vocab / tp, m.hidden, peak=hw.peak_bf16, eff=hw.eff_bf16 or hw.eff)
    ce = 16.0 * tok * m.vocab / tp / hw.mem_bw
    return (3 * g + ce) / hw.speed


def p2p_time(m: ModelSpec, b: int, tp: int, cp: int, pp: int, vpp: int, link: tuple[float, float]) -> float:
    """Pipeline point-to-point per micro-batch on a stage: one activation each way per chunk."""
    if pp <= 1:
        return 0.0
    size = 2.0 * b * m.seq_len / cp * m.hidden / tp
    return 2 * vpp * (size / link[0] + link[1])


def p2p_exposed(p2p: float, vpp: int, link: tuple[float, float], chunk_fwd: float,
                chunk_bwd: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of a micro-batch's point-to-point traffic on a stage.

    Plain pipelines (``vpp = 1``) wait for each send/receive. The interleaved schedule issues them
    asynchronously (Megatron-Core's ``overlap_p2p_comm``, torch.distributed.pipelining's batched
    isend/irecv) and waits only before the chunk that needs the data, so each transfer runs under
    one chunk's forward (or backward) compute: only what is longer than that chunk, and the
    latency, is exposed; what is hidden costs :data:`OVERLAP_COST` of compute.
    """
    if p2p <= 0.0 or vpp <= 1:
        return p2p, 0.0
    lat = link[1]
    x = p2p / (2 * vpp) - lat  # one transfer's bandwidth time
    exposed = vpp * (max(0.0, x - chunk_fwd) + max(0.0, x - chunk_bwd) + 2 * lat)
    hidden = p2p - exposed
    return exposed + OVERLAP_COST * hidden, hidden


def p2p_floor(pp: int, vpp: int, link: tuple[float, float]) -> float:
    """A lower bound of :func:`p2p_exposed` for any compute: the latencies of interleaved transfers."""
    return 2 * vpp * link[1] if pp > 1 else 0.0


def dp_windows(fwd_mb: float, bwd_mb: float, vpp: int, pp: int, nmb: int) -> tuple[float, float]:
    """(gradient reduce-scatter, parameter all-gather) compute windows of ZeRO-0/1 data parallelism.

    Bucketed, overlapped synchronisation (Megatron-Core's ``--overlap-grad-reduce`` /
    ``--overlap-param-gather``, PyTorch DDP's buckets): a gradient bucket is reduced as soon as the
    last micro-batch's backward has produced it, so the reduction hides under the rest of that
    backward (one micro-batch's backward of the stage, ``bwd_mb``); the parameter all-gather of a
    bucket is issued ahead of the next step's first forward through it (``fwd_mb``). Under the
    interleaved schedule each of the ``vpp`` model chunks has its own buckets and finishes its last
    backward ``min(nmb, pp)`` chunk-backwards before the next chunk does (the cool-down runs the
    chunks in turn), so the chunks' reductions spread over the cool-down: the window grows to
    ``bwd_mb/vpp · (1 + min(nmb, pp)·(vpp - 1))``; the gathers likewise over the warm-up forwards.
    """
    if vpp <= 1:
        return bwd_mb, fwd_mb
    spread = 1.0 + min(nmb, pp) * (vpp - 1)
    return bwd_mb / vpp * spread, fwd_mb / vpp * spread


def stage_param_count(m: ModelSpec, n_layers: float, tp: int) -> float:
    """Parameters a rank of a pipeline stage holds (its layers plus one vocabulary matrix)."""
    return n_layers * layer_params(m) / tp + m.vocab * m.hidden / tp


def zero3_traffic_s(precision: str, stage_params: float, shard: int, link: tuple[float, float]) -> tuple[float, float]:
    """ZeRO-3 per micro-batch: (parameter all-gather, gradient reduce-scatter) seconds.

    Every GPU receives the whole stage's parameters (2 B each, twice: forward and backward) and
    sends its whole gradient, reduce-scattered in the dtype of the gradient shards it keeps: fp32
    for every precision (:func:`planner.memory.state_bytes_per_param`, FSDP2's ``reduce_dtype``).
    ``link`` is :attr:`Links.zero3`: once the shard group leaves a node, one NIC per GPU (the
    per-GPU volume is the whole model whatever the group size, and the measured ZeRO-3 / FSDP runs
    move it at about one NIC's bandwidth, not at the node-aggregated rate of a bucketed all-reduce).
    Forward and backward each gather once, so a micro-batch's stage time is at least
    ``2·ag + rs`` however well they overlap (the search's bound uses this)."""
    del precision  # the gradient shards are fp32 for every precision
    return (half_collective_time(2.0 * stage_params, shard, link[0], link[1]),
            half_collective_time(4.0 * stage_params, shard, link[0], link[1]))


def replica_allreduce_s(precision: str, stage_params: float, shard: int, replicas: int,
                        link: tuple[float, float]) -> float:
    """HSDP: all-reduce of one gradient shard (``stage_params / shard`` values) across ``replicas``
    replica groups (0 without replica groups)."""
    if replicas <= 1:
        return 0.0
    grad_bytes = 2.0 if precision == "fp16" else 4.0
    return allreduce_time(grad_bytes * stage_params / shard, replicas, link[0], link[1])


def estimate_time(spec: PlanSpec, hw: Hardware, lay: Layout, links: Links, detail: bool = True) -> TimeEstimate:
    m = spec.model
    p, v, b, tp, cp, dp = lay.pp, lay.vpp, lay.micro_batch, lay.tp, lay.cp, lay.dp
    nmb = lay.num_micro_batches or spec.global_batch // (dp * b)
    lt = layer_times(m, spec.precision, hw, b, tp, cp, lay.sp, lay.recompute, lay.cp_method, links.tp, links.cp)
    first_layers, last_layers = stage_layers(m.layers, p, v, head_layer_equivalents(m))
    head = head_time(m, hw, b, tp, cp)
    # the busiest stage sets the pace: the first (most layers) or the last (layers + output layer)
    if p > 1 and first_layers * lt.total > last_layers * lt.total + head:
        n_layers, head = first_layers, 0.0
    else:
        n_layers = last_layers

    p2p, p2p_hidden = p2p_exposed(p2p_time(m, b, tp, cp, p, v, links.pp), v, links.pp,
                                  n_layers / v * lt.fwd, n_layers / v * (lt.bwd + lt.rc))

    # ZeRO-3: per micro-batch parameter gathers and gradient reduce-scatter (over the shard group:
    # dp_shard x cp, which is dp x cp without replica groups), plus with replica groups (HSDP) the
    # all-reduce of the reduced shard across the replicas (FSDP2 runs it after every backward)
    shard = lay.dp_shard * cp
    rep = lay.dp_replicate if lay.zero else 1
    stage_params = stage_param_count(m, n_layers, tp)
    grad_bytes = 2.0 if spec.precision == "fp16" else 4.0
    shard_link = links.dp_shard or links.dp
    rep_ar = replica_allreduce_s(spec.precision, stage_params, shard, rep, links.dp_replicate or links.dp)
    dbw, dlat = shard_link
    z3_exposed = z3_hidden = 0.0
    fwd_mb = n_layers * lt.fwd
    bwd_mb = n_layers * (lt.bwd + lt.rc)
    if lay.zero >= 3 and shard * rep > 1:
        ag, rs = zero3_traffic_s(spec.precision, stage_params, shard, links.zero3 or shard_link) \
            if shard > 1 else (0.0, 0.0)
        rs += rep_ar
        # FSDP2 prefetches the next layer's gather under this layer's compute: the first gather of
        # each pass and the last reduce-scatter are never hidden
        first = 1.0 / max(1, n_layers)
        z3_exposed = max(first * ag, ag - fwd_mb) + max(first * (ag + rs), ag + rs - bwd_mb)
        z3_hidden = 2 * ag + rs - z3_exposed
        z3_exposed += OVERLAP_COST * z3_hidden

    stage_mb = n_layers * lt.total + head + p2p + z3_exposed
    bubble = (p - 1) / v * stage_mb
    pipe = nmb * stage_mb + bubble

    # data-parallel gradient synchronisation (ZeRO 0/1), overlapped with the last backward
    dp_exposed = dp_hidden = 0.0
    if lay.zero < 3 and shard * rep > 1:
        if lay.zero == 0:
            comm = allreduce_time(grad_bytes * stage_params, shard, dbw, dlat)
            ag = 0.0
        else:
            comm = half_collective_time(grad_bytes * stage_params, shard, dbw, dlat) + rep_ar
            ag = half_collective_time(2.0 * stage_params, shard, dbw, dlat)
        rs_window, ag_window = dp_windows(fwd_mb, bwd_mb, v, p, nmb)
        dp_exposed = max(0.0, comm - rs_window) + max(0.0, ag - ag_window)
        dp_hidden = comm + ag - dp_exposed
        dp_exposed += OVERLAP_COST * dp_hidden
    local_params = stage_params / (shard if lay.zero >= 1 else 1)
    optimizer = OPT_BYTES_PER_PARAM * local_params / hw.mem_bw / hw.speed

    step = pipe + dp_exposed + optimizer
    bubble_fraction = bubble / pipe if pipe > 0 else 0.0
    if not detail:
        return TimeEstimate(step_time_s=step, components={}, hidden={}, bubble_fraction=bubble_fraction)
    k = nmb
    comps = {
        "gemm": k * n_layers * lt.gemm_f * 3,
        "attention": k * n_layers * (lt.attn_f + lt.attn_b),
        "elementwise": k * n_layers * lt.elem_f * 3,
        "logits": k * head,
        "recompute": k * n_layers * lt.rc,
        "tp_comm": k * n_layers * 2 * lt.tp_f,
        "cp_comm": k * n_layers * (lt.cp_f + lt.cp_b),
        "pp_p2p": k * p2p if p > 1 else 0.0,
        "zero3_comm": k * z3_exposed,
        "bubble": bubble,
        "dp_comm": dp_exposed,
        "optimizer": optimizer,
    }
    hidden = {"cp_comm": k * n_layers * lt.cp_hidden, "dp_comm": dp_hidden + k * z3_hidden,
              "tp_comm": k * n_layers * 2 * lt.tp_hidden, "pp_p2p": k * p2p_hidden}
    if not math.isfinite(step) or step <= 0:  # pragma: no cover - defensive
        raise ValueError(f"non-finite step time for {lay.short()}")
    return TimeEstimate(step_time_s=step, components=comps, hidden=hidden, bubble_fraction=bubble_fraction)
