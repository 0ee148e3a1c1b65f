"""Parameter counts and FLOP conventions.

The planner's MFU uses **Megatron's general model-FLOP form** (July 2024): per token
``6·(L·P_layer + V·h) + 12·L·s·h`` where ``P_layer`` counts the matmul weights of one layer (QKV with
GQA, output projection, MLP with 2 or 3 matrices). The attention term is *not* halved for causal
masking; recomputation is not counted. For GPT (MHA, ffn = 4h, untied head) this equals Korthikanti's
``72·B·s·l·h²·(1 + s/6h + V/12lh)``. ``hfu`` adds what is actually executed again (recompute).

Other conventions (for comparing with published numbers) are in :data:`CONVENTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from planner.spec import ModelSpec


@lru_cache(maxsize=256)
def layer_matmul_params(m: ModelSpec) -> int:
    """Weights of one decoder layer's matmuls (QKV, output, MLP)."""
    h, kv = m.hidden, m.kv_heads * m.head_dim
    attn = h * (h + 2 * kv) + h * h
    mlp = (3 if m.gated_mlp else 2) * h * m.ffn
    return attn + mlp


@lru_cache(maxsize=256)
def layer_params(m: ModelSpec) -> int:
    return layer_matmul_params(m) + 2 * m.hidden  # + two norms


def embedding_params(m: ModelSpec) -> int:
    return m.vocab * m.hidden


def total_params(m: ModelSpec) -> int:
    head = 0 if m.tied_embeddings else m.vocab * m.hidden
    return m.layers * layer_params(m) + embedding_params(m) + head + m.hidden


def model_flops_per_token(m: ModelSpec) -> float:
    """The planner's convention (see module docstring), forward + backward, no recompute."""
    return 6.0 * (m.layers * layer_matmul_params(m) + m.vocab * m.hidden) + 12.0 * m.layers * m.seq_len * m.hidden


def recompute_flops_per_token(m: ModelSpec, recompute: str) -> float:
    """Extra FLOPs actually executed per token by activation recomputation (for HFU)."""
    if recompute == "full":
        return 2.0 * m.layers * layer_matmul_params(m) + 4.0 * m.layers * m.seq_len * m.hidden
    if recompute.startswith("layer:"):
        return recompute_flops_per_token(m, "full") / int(recompute.split(":", 1)[1])
    if recompute == "op":  # the even-numbered matmuls: k, the output projection, fc1's second half
        kv = m.kv_heads * m.head_dim
        return 2.0 * m.layers * m.hidden * (kv + m.hidden + (m.ffn if m.gated_mlp else 0))
    if recompute == "selective":
        return 4.0 * m.layers * m.seq_len * m.hidden
    return 0.0


# ---------------------------------------------------------------------------------- conventions
def narayanan_per_token(m: ModelSpec) -> float:
    """Narayanan Eq. 3 (counts full recompute): 96·B·s·l·h²·(1 + s/6h + V/16lh) per B·s tokens."""
    n_l, h, s, v = m.layers, m.hidden, m.seq_len, m.vocab
    return 96.0 * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))


def korthikanti_per_token(m: ModelSpec) -> float:
    """Korthikanti model FLOPs: 72·B·s·l·h²·(1 + s/6h + V/12lh) per B·s tokens."""
    n_l, h, s, v = m.layers, m.hidden, m.seq_len, m.vocab
    return 72.0 * n_l * h * h * (1 + s / (6 * h) + v / (12 * n_l * h))


def palm_per_token(m: ModelSpec) -> float:
    """PaLM / MosaicML / TorchTitan: 6N + 12·L·h·s (N with one embedding matrix)."""
    n = m.layers * layer_params(m) + embedding_params(m)
    return 6.0 * n + 12.0 * m.layers * m.hidden * m.seq_len


CONVENTIONS: dict[str, Callable[[ModelSpec], float]] = {
    "megatron": model_flops_per_token,
    "narayanan": narayanan_per_token,
    "korthikanti": korthikanti_per_token,
    "palm": palm_per_token,
}


def convention_of(text: str | None) -> str:
    """Map a published case's ``flops_convention`` text to a key of :data:`CONVENTIONS`."""
    t = (text or "").lower()
    if t.startswith("megatron"):
        return "megatron"
    if "96*" in t or "narayanan" in t or "4*2" in t:
        return "narayanan"
    if "6n" in t or "palm" in t:
        return "palm"
    return "korthikanti"
