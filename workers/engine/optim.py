"""AdamW with linear warm-up + cosine decay, and gradient clipping by the global norm.

The learning rate is a pure function of the step (no scheduler state to checkpoint), so a resumed
run continues the same curve.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from workers.engine.config import TrainConfig
from workers.engine.groups import ParallelGroups


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(named: list[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Decay matrices, not norms (same split in every layout and in the reference)."""
    decay = [p for n, p in named if p.ndim >= 2]
    no_decay = [p for n, p in named if p.ndim < 2]
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_adamw(named: list[tuple[str, nn.Parameter]], cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(named, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=1e-8, foreach=True)


def _sharded_dims(g: torch.Tensor) -> tuple[bool, bool]:
    """(sharded over TP, sharded over the ZeRO shard group) for a gradient.

    With replica groups (HSDP) the ``dp_replicate`` mesh dimension is ``Replicate`` and not counted:
    the shard group is ``dp_shard_cp``, and summing over all of ``dp_cp`` would count each element
    once per replica group.

    A mesh dimension shards the gradient unless its placement is ``Replicate`` (``Partial`` is
    resolved before this runs). Not ``placement.is_shard()``: FSDP2 over a TP-sharded dimension 0
    places ``_StridedShard`` on the dp_cp dimension, which is no ``Shard`` (``is_shard()`` is False
    in torch 2.13), and missing it left those squares unsummed over dp_cp -- a norm too small under
    TP x zero=3, so clipping scaled by the wrong coefficient once it was active.
    """
    if not isinstance(g, DTensor):
        return False, False
    names = g.device_mesh.mesh_dim_names or ()
    tp = dpcp = False
    for i, pl in enumerate(g.placements):
        if pl.is_partial():
            raise ValueError(f"gradient placement {g.placements} still has a pending Partial")
        if not pl.is_replicate() and g.device_mesh.size(i) > 1:
            if i < len(names) and names[i].split("@")[0] == "tp":
                tp = True
            else:
                dpcp = True
    return tp, dpcp


def _sum(t: torch.Tensor, group: dist.ProcessGroup) -> None:
    if dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)


@torch.no_grad()
def global_grad_norm(params: list[nn.Parameter], groups: ParallelGroups, owned_over_dp: bool = False) -> float:
    """L2 norm of the whole model's gradient, counting every element exactly once.

    Squares are bucketed by how a gradient is sharded (replicated, over TP, over dp_cp, both) and
    each bucket is summed over exactly the groups it is sharded over, then over the PP stages.
    ``owned_over_dp`` (zero=1): each gradient lives on its owner only, so all are sharded over the
    ZeRO shard group. That group is ``dp_shard_cp`` (= ``dp_cp`` without replica groups): replica
    groups hold identical copies, so their squares are never summed across replicas.
    """
    sq = torch.zeros(4, dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        tp, dpcp = _sharded_dims(g)
        dpcp = dpcp or owned_over_dp
        loc = g._local_tensor if isinstance(g, DTensor) else g
        sq[int(tp) + 2 * int(dpcp)] += loc.detach().double().pow(2).sum().cpu()
    dev = torch.device("cuda", torch.cuda.current_device()) if groups.backend == "nccl" else torch.device("cpu")
    sq = sq.to(dev)
    tp_part = torch.stack([sq[1], sq[3]])
    _sum(tp_part, groups.tp)
    dp_part = torch.stack([sq[2], tp_part[1]])
    _sum(dp_part, groups.dp_shard_cp)
    total = (sq[0] + tp_part[0] + dp_part[0] + dp_part[1]).reshape(1)
    _sum(total, groups.pp)
    return float(total.sqrt().item())


@torch.no_grad()
def clip_grads(params: list[nn.Parameter], norm: float, max_norm: float) -> None:
    """Scale gradients like ``torch.nn.utils.clip_grad_norm_`` given the global ``norm``."""
    if max_norm <= 0:
        return
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                (p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad).mul_(coef)
