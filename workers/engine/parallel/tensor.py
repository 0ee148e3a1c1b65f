"""Tensor and sequence parallelism: Megatron's split, on plain local tensors, with DTensor parameters.

Every TP-split weight is a ``DTensor`` on the TP mesh (checkpoints, FSDP2, the optimizer, clipping
and the HF loader read its placements), but the forward runs on plain tensors: each split module
takes its weight's local shard (``to_local()``, whose backward hands the gradient back as a DTensor
with the weight's placements) and the TP collectives are explicit autograd functions calling
``torch.ops._c10d_functional`` (the ops DTensor itself issues, so ``CommDebugMode`` counts them and
op-level recompute saves the same reduce-scatters). DTensor's per-op dispatch costs about 50 ms of
CPU per tp=2 pass of the tiny model against 10 ms for tp=1; the explicit split leaves no such
per-op cost (``docs/engine.md``, "Tensor parallelism without DTensor dispatch").

- ``tok_embeddings``: split over the vocabulary (``Shard(0)``): masked lookup of this rank's rows,
  then a sum over TP (reduce-scatter along the sequence under SP, all-reduce without).
- ``wq/wk/wv/w1/w3``: column-parallel (``Shard(0)``: each rank owns whole heads / a slice of the FFN).
- ``wo/w2``: row-parallel (``Shard(1)``); their partial outputs are summed over TP: under SP a
  reduce-scatter along the sequence, without SP an all-reduce.
- attention and MLP take their input once per module (Megatron's ``f``): without SP an identity
  whose backward all-reduces the input gradient, under SP an all-gather of the sequence whose
  backward reduce-scatters. The column-parallel projections share that input, so their partial
  input gradients are summed locally and reduced once per module, not once per projection.
- norms under SP (``Replicate`` DTensors): each rank normalises its ``S/tp`` tokens; the weight's
  gradient is summed over TP in the backward.
- ``output``: column-parallel over the vocabulary: each rank keeps only its vocabulary slice of the
  logits, and :func:`vocab_parallel_cross_entropy` computes the loss from those slices with three
  small all-reduces (max, sum of exp, target logit) — the full logits are never gathered.
- GQA with ``tp > kv_heads``: ``wk``/``wv`` stay column-parallel (each rank holds ``kv*hd/tp``
  columns, i.e. part of a head); the K/V outputs are all-gathered over TP and each rank keeps the
  KV head its query heads use. The backward reduce-scatters the gradient, so the replicated KV
  heads get the sum of their users' gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from workers.engine.model import RMSNorm, Transformer
from workers.engine.validate import tp_refusal

_funcol = torch.ops._c10d_functional


def _all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    return _funcol.wait_tensor(_funcol.all_reduce(x.contiguous(), "sum", group))


def _all_gather(x: torch.Tensor, dim: int, size: int, group: str) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``."""
    out = _funcol.wait_tensor(_funcol.all_gather_into_tensor(x.movedim(dim, 0).contiguous(), size, group))
    return out.movedim(0, dim).contiguous()  # contiguous: a pipeline stage sends its output as it is


def _reduce_scatter(x: torch.Tensor, dim: int, size: int, group: str) -> torch.Tensor:
    """The sum over ranks of ``x``, this rank keeping its ``1/size`` along ``dim``."""
    out = _funcol.wait_tensor(_funcol.reduce_scatter_tensor(x.movedim(dim, 0).contiguous(), "sum", size, group))
    return out.movedim(0, dim).contiguous()


class _ToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: str) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _all_reduce(grad, ctx.group), None


class _FromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: str) -> torch.Tensor:  # type: ignore[override]
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None


class _GatherSeq(torch.autograd.Function):
    """SP to TP: all-gather along ``dim`` forward, reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, size: int, group: str) -> torch.Tensor:  # type: ignore[override]
        ctx.args = (dim, size, group)
        return _all_gather(x, dim, size, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _reduce_scatter(grad, *ctx.args), None, None, None


class _ScatterSeq(torch.autograd.Function):
    """TP to SP: reduce-scatter along ``dim`` forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, size: int, group: str) -> torch.Tensor:  # type: ignore[override]
        ctx.args = (dim, size, group)
        return _reduce_scatter(x, dim, size, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _all_gather(grad, *ctx.args), None, None, None


class TPGroup:
    """This rank's TP group as the split modules use it: ``enter`` an attention/MLP/head input (all
    ranks need all of it), ``leave`` with a row-parallel partial sum."""

    def __init__(self, mesh: DeviceMesh, sp: bool) -> None:
        self.name = mesh.get_group().group_name
        self.size = mesh.size()
        self.rank = mesh.get_local_rank()
        self.sp = sp

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return _GatherSeq.apply(x, 1, self.size, self.name) if self.sp else _ToTP.apply(x, self.name)

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        return _ScatterSeq.apply(y, 1, self.size, self.name) if self.sp else _FromTP.apply(y, self.name)


class ColumnParallelLinear(nn.Linear):
    """``Shard(0)`` weight: this rank's output features from the whole (entered) input."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to_local())


class RowParallelLinear(nn.Linear):
    """``Shard(1)`` weight: a partial sum from this rank's input features, summed over TP."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.leave(F.linear(x, self.weight.to_local()))


class ParallelHead(nn.Linear):
    """The output projection, column-parallel over the vocabulary: this rank's logits slice."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.tp.enter(x), self.weight.to_local())


class VocabParallelEmbedding(nn.Embedding):
    """``Shard(0)`` over the vocabulary: this rank looks up the tokens it holds, zeros for the
    others, and the rows are summed over TP."""

    tp: TPGroup

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        w = self.weight.to_local()
        local = tokens - self.tp.rank * w.shape[0]
        outside = (local < 0) | (local >= w.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), w).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.leave(rows)


class SequenceParallelRMSNorm(RMSNorm):
    """A norm over this rank's ``S/tp`` tokens (SP); its weight's gradient is summed over TP."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = _ToTP.apply(self.weight.to_local(), self.tp.name)
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)


def _split(module: nn.Module, cls: type[nn.Module], tp: TPGroup, mesh: DeviceMesh, placement: Placement) -> None:
    """Make ``module`` a ``cls`` whose weight is a DTensor with ``placement`` (on the meta device
    before ``to_empty``: no values move)."""
    w = module.weight
    module.register_parameter("weight", nn.Parameter(distribute_tensor(w, mesh, [placement], src_data_rank=None),
                                                     requires_grad=w.requires_grad))
    module.__class__ = cls
    module.tp = tp


def _enter_input(tp: TPGroup) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
    def hook(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (tp.enter(args[0]), *args[1:])

    return hook


def _kv_gather_hook(tp: TPGroup, heads: int, kv_heads: int, head_dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``tp > kv_heads``: gather the K/V columns over TP and keep the KV head this rank's queries use."""
    kv_index = (tp.rank * (heads // tp.size)) // (heads // kv_heads)

    def hook(x: torch.Tensor) -> torch.Tensor:
        full = _GatherSeq.apply(x, x.ndim - 1, tp.size, tp.name)
        return full[..., kv_index * head_dim:(kv_index + 1) * head_dim]

    return hook


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Split ``model`` (a whole model or one pipeline stage) over ``tp_mesh`` in place."""
    cfg = model.cfg
    if tp_mesh.size() == 1:
        return
    reason = tp_refusal(cfg, tp_mesh.size())
    if reason:
        raise ValueError(reason)
    tp = TPGroup(tp_mesh, sp)
    if model.tok_embeddings is not None:
        _split(model.tok_embeddings, VocabParallelEmbedding, tp, tp_mesh, Shard(0))
    if model.norm is not None and sp:
        _split(model.norm, SequenceParallelRMSNorm, tp, tp_mesh, Replicate())
    if model.output is not None:
        _split(model.output, ParallelHead, tp, tp_mesh, Shard(0))
    for block in model.layers.values():
        attn, ffn = block.attention, block.feed_forward
        for lin in (attn.wq, attn.wk, attn.wv, ffn.w1, ffn.w3):
            _split(lin, ColumnParallelLinear, tp, tp_mesh, Shard(0))
        for lin in (attn.wo, ffn.w2):
            _split(lin, RowParallelLinear, tp, tp_mesh, Shard(1))
        attn.register_forward_pre_hook(_enter_input(tp))
        ffn.register_forward_pre_hook(_enter_input(tp))
        if sp:
            _split(block.attention_norm, SequenceParallelRMSNorm, tp, tp_mesh, Replicate())
            _split(block.ffn_norm, SequenceParallelRMSNorm, tp, tp_mesh, Replicate())
        if cfg.kv_heads < tp.size:
            attn.kv_hook = _kv_gather_hook(tp, cfg.heads, cfg.kv_heads, cfg.head_dim)


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start: int,  # type: ignore[override]
                group: dist.ProcessGroup):
        logits = logits.float()
        vl = logits.shape[-1]
        m = logits.detach().amax(dim=-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - m.unsqueeze(-1)
        exp = shifted.exp()
        sumexp = exp.sum(-1)
        local_t = target - vocab_start
        mask = (local_t >= 0) & (local_t < vl)
        idx = local_t.clamp(0, vl - 1)
        tlogit = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * mask
        both = torch.stack([sumexp, tlogit])
        dist.all_reduce(both, group=group)
        sumexp, tlogit = both[0], both[1]
        loss = sumexp.log() - tlogit
        ctx.save_for_backward(exp / sumexp.unsqueeze(-1), idx, mask)
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        softmax, idx, mask = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, idx.unsqueeze(-1), -mask.to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group: dist.ProcessGroup | None) -> torch.Tensor:
    """Mean token cross-entropy from this rank's vocabulary slice ``logits [..., V/tp]``."""
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_target = target.reshape(-1)
    if group is None or dist.get_world_size(group) == 1:
        return torch.nn.functional.cross_entropy(flat_logits.float(), flat_target)
    return _VocabParallelCE.apply(flat_logits, flat_target, vocab_start, group).mean()


def tp_modules(model: nn.Module) -> list[str]:
    """Names of the sub-modules holding DTensor parameters (for docs/tests)."""
    return [n for n, m in model.named_modules()
            if any(isinstance(p, DTensor) for p in m.parameters(recurse=False))]
