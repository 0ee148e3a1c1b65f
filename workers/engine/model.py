"""A Llama-style decoder: token embedding, RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head.

The module tree uses TorchTitan's names (``tok_embeddings``, ``layers.<i>.attention.wq``, ...,
``norm``, ``output``) and keeps ``layers`` an ``nn.ModuleDict`` so a pipeline stage that deletes
the other layers keeps the global parameter names (checkpoints are keyed by them).

Parallelism hooks, all set by ``workers.engine.parallel``; the single-process model leaves them
at their defaults:

- ``Attention.core(q, k, v) -> o`` computes causal attention on ``[B, H, S, D]`` tensors (local
  SDPA by default, ring or Ulysses attention under CP);
- ``Attention.kv_hook(k)`` turns the output of ``wk``/``wv`` into this rank's KV heads (used when
  TP > KV heads, where KV heads are replicated);
- ``Rotary.positions`` holds the global positions of this rank's tokens (CP's zigzag split).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine.config import ModelConfig
from workers.engine.recompute import op_checkpoint

AttnCore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q [B,H,S,D]`` over ``k, v [B,KV,S,D]`` (GQA by head repetition)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary tables for this rank's positions (non-persistent buffers: not in checkpoints)."""

    def __init__(self, head_dim: int, seq_len: int, theta: float, scaling: tuple[float, float, float, int] | None = None
                 ) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.scaling = scaling  # (factor, low_freq_factor, high_freq_factor, original_max_position): llama3
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.reset(torch.arange(seq_len))

    def reset(self, positions: torch.Tensor) -> None:
        """(Re)compute every table for ``positions``, on their device (also after ``to_empty`` of a
        model built on the meta device)."""
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=positions.device)
        self.inv_freq = 1.0 / (self.theta ** (steps / self.head_dim))
        if self.scaling is not None:
            self.inv_freq = llama3_scaled(self.inv_freq, *self.scaling)
        self.set_positions(positions)

    def set_positions(self, positions: torch.Tensor) -> None:
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        self.cos = angles.cos().float()
        self.sin = angles.sin().float()

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos, self.sin


def llama3_scaled(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                  original_max_position: int) -> torch.Tensor:
    """Llama 3.1's rotary scaling (``rope_type: llama3``): long wavelengths divided by ``factor``,
    short ones kept, the band between interpolated smoothly."""
    low_wavelen = original_max_position / low_freq_factor
    high_wavelen = original_max_position / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of ``x [B, S, H, D]`` by the position's angles."""
    xr = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.head_dim = hd
        self.wq = nn.Linear(cfg.hidden, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)
        self.core: AttnCore = sdpa_causal
        self.kv_hook: Callable[[torch.Tensor], torch.Tensor] | None = None
        # recompute="selective" (Korthikanti et al.): keep only the core's inputs (q, k, v) and run the
        # core -- scores, softmax, the CP ring or all-to-all -- again in the backward
        self.recompute_core = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.wq(x)
        k = self.wk(x)
        v = self.wv(x)
        if self.kv_hook is not None:
            k, v = self.kv_hook(k), self.kv_hook(v)
        b, s = q.shape[0], q.shape[1]
        q = apply_rope(q.view(b, s, -1, self.head_dim), cos, sin)  # -1: local heads under TP
        k = apply_rope(k.view(b, s, -1, self.head_dim), cos, sin)
        v = v.view(b, s, -1, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.recompute_core and torch.is_grad_enabled():
            o = torch.utils.checkpoint.checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            o = self.core(q, k, v)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


#: the tied parameter's name, and the name its copy has on a last pipeline stage (``tie_embeddings``)
TIED_EMBEDDING = "tok_embeddings.weight"
TIED_HEAD = "output.weight"


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.recompute_ops = False  # recompute="op": op-level selective checkpointing (engine.recompute)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it (missing parts are ``None``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.hidden)
        scaling = ((cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                    cfg.rope_original_max_position) if cfg.rope_scaling_factor else None)
        self.rope = Rotary(cfg.head_dim, cfg.seq_len, cfg.rope_theta, scaling)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        # recompute="full" / "layer:N": the names of the blocks run under activation checkpointing
        self.checkpointed: set[str] = set()
        self.tie()

    def tie(self) -> None:
        """``tie_embeddings``: the head uses the embedding's parameter (one parameter, named
        ``tok_embeddings.weight``); a no-op when either is not on this stage."""
        if self.cfg.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens_or_h: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens_or_h) if self.tok_embeddings is not None else tokens_or_h
        cos, sin = self.rope()
        grad = torch.is_grad_enabled()
        for name, layer in self.layers.items():
            if grad and name in self.checkpointed:
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, use_reentrant=False)
            elif grad and layer.recompute_ops:
                h = op_checkpoint(layer, h, cos, sin)
            else:
                h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def initial_values(cfg: ModelConfig, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole model's initial parameters, one full tensor at a time, in the one order that defines
    them (sorted names, one generator): norms 1, other weights normal(0, std), the residual
    projections (``wo``, ``w2``) scaled by ``1/sqrt(2 * layers)``."""
    with torch.device("meta"):
        shapes = sorted((n, tuple(p.shape)) for n, p in Transformer(cfg).named_parameters())
    g = torch.Generator().manual_seed(seed)
    std = cfg.init_std
    for name, shape in shapes:
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape)
        else:
            scale = std / (2 * cfg.layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else std
            yield name, torch.randn(shape, generator=g, dtype=torch.float32) * scale


@torch.no_grad()
def init_local_shards(modules: list[Transformer], cfg: ModelConfig, seed: int) -> None:
    """Give the parameters in ``modules`` -- the whole model (``build_model``), or the pipeline stages
    a rank holds as TP/FSDP-sharded DTensors or plain tensors, materialised with ``to_empty`` --
    exactly the values :func:`initial_values` gives the whole model, without ever holding it: the
    full tensors are generated one at a time (the generator must pass through all of them) and each
    parameter copies out the slice it holds. Peak extra memory: the largest single parameter."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    held = {n: p for m in modules for n, p in m.named_parameters()}
    for name, value in initial_values(cfg, seed):
        # tied: a last pipeline stage holds the embedding's copy as ``output.weight``
        names = [name, TIED_HEAD] if cfg.tie_embeddings and name == TIED_EMBEDDING else [name]
        for p in (held[n] for n in names if n in held):
            if isinstance(p, DTensor):
                shard = distribute_tensor(value.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
                p._local_tensor.copy_(shard._local_tensor)
            else:
                p.copy_(value)


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> Transformer:
    """The whole model with the seed's weights in one process (the single-process reference; ranks of
    a parallel layout build only their shards, with the same values: ``init_local_shards``)."""
    model = Transformer(cfg)
    init_local_shards([model], cfg, seed)
    return model.to(device)
