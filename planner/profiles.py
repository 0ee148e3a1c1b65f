"""Built-in GPU profiles and model presets.

A profile fills the cluster fields a spec leaves out. Numbers are vendor data sheets (dense, no
sparsity) plus kernel efficiencies: ``gemm_efficiency`` (the fraction of the dense bf16 peak large
GEMMs sustain in training), ``fp8_gemm_efficiency`` (the same for fp8 GEMMs, of the fp8 peak; their
casts are priced separately), ``attention_efficiency`` (a FlashAttention-2 class kernel, forward +
backward, long sequences, head dim 128) and ``fused_attention_efficiency`` (the vendor's fused
kernel: cuDNN / Transformer Engine, FlashAttention-3 class on Hopper). The timing model applies
size, causality and head-dim fall-offs to these.

The Hopper (H100, H800, H200) and Ampere (A100, A800) values are fitted to 86 published runs from
11 sources by ``bench/fit.py`` (``orthoplex bench planner`` refits them and reports the error on
sources left out of the fit, and on sources kept out of every fit); Hopper's fp8 GEMM fraction is
:data:`FP8_FRACTION` of its bf16 one, not fitted. The other GPUs keep data-sheet-class estimates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    mem_gb: float  # HBM capacity, GB (1e9 bytes) as marketed; the memory model treats it as GiB-safe
    peak_tflops: float  # dense bf16/fp16
    peak_tflops_fp8: float | None  # dense fp8; None = no fp8 tensor cores
    mem_bw_GBps: float  # HBM bandwidth
    intra_node_bw_GBps: float  # NVLink/xGMI, per GPU, per direction
    inter_node_bw_Gbps_per_gpu: float  # NIC bandwidth per GPU
    gpus_per_node: int = 8
    gemm_efficiency: float = 0.75
    attention_efficiency: float = 0.5  # flash attention, forward + backward, fraction of dense peak
    fused_attention_efficiency: float = 0.0  # the vendor's fused kernel (cuDNN/TE, FA3 class); 0 = as flash
    fp8_gemm_efficiency: float = 0.0  # large fp8 GEMMs, fraction of the fp8 peak; 0 = 0.8 x gemm_efficiency


# Hopper's sustained large-GEMM fraction of the dense bf16 peak (fitted, bench/fit.py), and the
# fraction of that fraction its fp8 GEMMs reach of the (twice as high) fp8 peak: one hardware ratio,
# not fitted. FP8_FRACTION is the median over published H100 microbenchmarks that measured large bf16
# and fp8 GEMMs on the same card, (fp8 TFLOP/s / 1979) / (bf16 TFLOP/s / 989): 0.88, 0.96, 1.17,
# median 0.96, rounded to 0.95 (sources and numbers: docs/planner.md, "Step time")
HOPPER_GEMM = 0.586
FP8_FRACTION = 0.95

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("A100", 80, 312.0, None, 2039, 300, 200, 8, 0.71, 0.42),
        GpuProfile("A100-40GB", 40, 312.0, None, 1555, 300, 200, 8, 0.71, 0.42),
        GpuProfile("A800", 80, 312.0, None, 2039, 200, 200, 8, 0.71, 0.42),
        GpuProfile("H100", 80, 989.0, 1979.0, 3350, 450, 400, 8, HOPPER_GEMM, 0.284, 0.353, FP8_FRACTION * HOPPER_GEMM),
        GpuProfile("H800", 80, 989.0, 1979.0, 3350, 200, 400, 8, HOPPER_GEMM, 0.284, 0.353, FP8_FRACTION * HOPPER_GEMM),
        GpuProfile("H200", 141, 989.0, 1979.0, 4800, 450, 400, 8, HOPPER_GEMM, 0.284, 0.353, FP8_FRACTION * HOPPER_GEMM),
        GpuProfile("H20", 96, 148.0, 296.0, 4000, 450, 400, 8, 0.80, 0.60),
        GpuProfile("B200", 180, 2250.0, 4500.0, 8000, 900, 400, 8, 0.66, 0.40),
        GpuProfile("V100", 32, 125.0, None, 900, 150, 100, 8, 0.75, 0.50),
        GpuProfile("L40S", 48, 362.0, 733.0, 864, 32, 100, 8, 0.60, 0.45),
        GpuProfile("MI300X", 192, 1307.0, 2615.0, 5300, 448, 400, 8, 0.50, 0.30),
        # Test/CPU stand-ins: the runtime runs the engine on CPU with "fake" GPUs.
        GpuProfile("CPU", 16, 0.5, None, 20, 5, 10, 4, 0.5, 0.4),
    )
}

ALIASES: dict[str, str] = {"FAKE": "CPU", "GLOO": "CPU"}


def lookup_gpu(gpu_type: str) -> GpuProfile | None:
    """Match ``A100-SXM4-80GB``, ``h100``, ``H800-80GB``, ``A100 40GB`` ... to a profile.

    The longest profile name that prefixes the normalised type wins; a ``NNGB`` in the type overrides
    the memory size (so ``A100-SXM4-40GB`` and ``H100 96GB`` get their own capacity).
    """
    norm = gpu_type.strip().upper().replace("_", "-").replace(" ", "-")
    if not norm:
        return None
    norm = norm.removeprefix("NVIDIA-").removeprefix("AMD-")
    for alias, target in ALIASES.items():
        if norm.startswith(alias):
            norm = target + norm[len(alias) :]
    best: GpuProfile | None = None
    for name, prof in PROFILES.items():
        if norm.startswith(name) and (best is None or len(name) > len(best.name)):
            best = prof
    if best is None:
        return None
    m = re.search(r"(\d+)\s*GB", norm)
    if m and "-" not in best.name:
        mem = float(m.group(1))
        if mem != best.mem_gb:
            from dataclasses import replace

            best = replace(best, mem_gb=mem)
    return best


# ---------------------------------------------------------------------------------------------------
# Model presets: fields a spec may leave out when it names one.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, seq_len=8192),
    "llama3-405b": dict(
        layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256, seq_len=8192
    ),
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000, seq_len=4096),
    "llama2-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000, seq_len=4096),
    "llama2-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq_len=4096),
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, kv_heads=96, ffn=49152, vocab=51200, seq_len=2048),
    "gpt3-1.3b": dict(layers=24, hidden=2048, heads=16, kv_heads=16, ffn=8192, vocab=51200, seq_len=2048),
    "gpt3-6.7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=51200, seq_len=2048),
    "gpt3-13b": dict(layers=40, hidden=5120, heads=40, kv_heads=40, ffn=20480, vocab=51200, seq_len=2048),
    "mpt-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=50368, seq_len=2048),
    "mpt-30b": dict(layers=48, hidden=7168, heads=56, kv_heads=56, ffn=28672, vocab=50368, seq_len=2048),
    "mpt-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=64, ffn=32768, vocab=50368, seq_len=2048),
    "tiny": dict(layers=4, hidden=64, heads=8, kv_heads=4, ffn=172, vocab=256, seq_len=64),
}

_PRESET_ALIASES = {"llama-3-8b": "llama3-8b", "llama-3.1-8b": "llama3-8b", "llama3.1-8b": "llama3-8b",
                   "llama-3-70b": "llama3-70b", "llama-3.1-70b": "llama3-70b", "llama3.1-70b": "llama3-70b",
                   "llama-3.1-405b": "llama3-405b", "llama3.1-405b": "llama3-405b",
                   "llama-2-70b": "llama2-70b", "gpt-3-175b": "gpt3-175b", "gpt3": "gpt3-175b"}


def lookup_model(name: str) -> dict[str, int] | None:
    key = name.strip().lower().replace("_", "-")
    key = _PRESET_ALIASES.get(key, key)
    preset = MODEL_PRESETS.get(key)
    return dict(preset) if preset is not None else None
