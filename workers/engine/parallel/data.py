"""Data parallelism: gradient all-reduce (zero=0), sharded optimizer state (zero=1), FSDP2 (zero=3).

Parameters are replicated over DP *and* CP (CP ranks hold the same weights and see different
tokens), so all three share one reduction group, the flattened ``dp_cp`` mesh dimension. The
loss on every rank is a mean over its own tokens and every rank has the same number of tokens,
so averaging over ``dp_cp`` gives exactly the single-process mean.

- zero=0: one flat all-reduce (AVG) of all local gradients per step.
- zero=1: each ``dp_cp`` rank owns a size-balanced subset of the parameters: every gradient is
  averaged onto its owner only (one flat ``reduce`` per owner, the traffic of a reduce-scatter;
  the other ranks drop theirs), the owner keeps AdamW state for and steps only its parameters, and
  broadcasts them to the others (one flat broadcast per owner, the traffic of an all-gather).
  Optimizer memory drops by ``dp*cp``; the parameter split is whole tensors (as torch's
  ``ZeroRedundancyOptimizer``), which keeps DCP checkpoints keyed by parameter name so they
  reshard to any other layout.
- zero=3: FSDP2 ``fully_shard`` per transformer block and per stage root on the ``dp_cp`` mesh
  (composes with the TP DTensors, as in TorchTitan); FSDP2 reduce-scatters and averages.

Replica groups (``dp_replicate > 1``, HSDP): ZeRO shards over ``dp_shard_cp`` (one replica group)
instead of ``dp_cp``. zero=3 hands FSDP2 the 2-D ``(dp_replicate, dp_shard_cp)`` mesh (FSDP2's
HSDP: reduce-scatter in the shard dimension, all-reduce of the shard across replicas); zero=1
averages each gradient onto its owner inside the replica group, then all-reduces it between the
owners of the same parameters in the other groups, and every group steps its own full copy.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from workers.engine.groups import ParallelGroups


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (aliasing its storage), or the tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


def fix_partial_grads(params: list[nn.Parameter]) -> None:
    """Make every DTensor gradient carry its parameter's placements (resolves pending ``Partial``)."""
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(p.device_mesh, p.placements)


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One flat copy of ``tensors`` (for a single collective over all of them)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy ``flat`` (as :func:`flatten` laid it out) back into ``tensors``."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def allreduce_grads(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
    """Average the local gradients over ``group`` with one flat all-reduce."""
    if dist.get_world_size(group) == 1:
        return
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return
    flat = flatten(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= dist.get_world_size(group)
    unflatten_into(flat, grads)


def partition_params(names: list[str], params: list[nn.Parameter], parts: int) -> list[int]:
    """Owner index (0..parts-1) of each parameter: greedy by size, deterministic."""
    load = [0] * parts
    owner = [0] * len(params)
    order = sorted(range(len(params)), key=lambda i: (-local(params[i]).numel(), names[i]))
    for i in order:
        j = min(range(parts), key=lambda k: (load[k], k))
        owner[i] = j
        load[j] += local(params[i]).numel()
    return owner


class ZeroOneShards:
    """Which rank of the ZeRO shard group (``dp_cp``, or ``dp_shard_cp`` with replica groups) owns
    each parameter's optimizer state, and the post-step broadcast."""

    def __init__(self, names: list[str], params: list[nn.Parameter], groups: ParallelGroups) -> None:
        self.groups = groups
        self.group = groups.dp_shard_cp
        self.replicas = groups.dp_replicate  # owners of the same parameters in the other replica groups
        self.size = dist.get_world_size(self.group)
        self.index = dist.get_rank(self.group)
        self.ranks = dist.get_process_group_ranks(self.group)
        self.params = params
        self.owner = partition_params(names, params, self.size)
        if self.size > 1 and len(set(self.owner)) < self.size:
            raise ValueError(f"zero=1: {len(params)} parameter tensors cannot be spread over dp_shard*cp = "
                             f"{self.size} ranks")

    def owned(self) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == self.index]

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Average every gradient onto its owner; the other ranks drop theirs (``grad = None``).
        With replica groups the owners then average over the replicas (one flat all-reduce)."""
        if self.size == 1:
            if self.replicas is not None:
                allreduce_grads(self.params, self.replicas)
            return
        for j in range(self.size):
            idx = [i for i, o in enumerate(self.owner) if o == j and self.params[i].grad is not None]
            if not idx:
                continue
            grads = [local(self.params[i].grad) for i in idx]
            flat = flatten(grads)
            dist.reduce(flat, dst=self.ranks[j], op=dist.ReduceOp.SUM, group=self.group)
            if j == self.index:
                if self.replicas is not None:
                    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.replicas)
                    flat /= dist.get_world_size(self.replicas)
                flat /= self.size
                unflatten_into(flat, grads)
            else:
                for i in idx:
                    self.params[i].grad = None

    @torch.no_grad()
    def broadcast_params(self) -> None:
        if self.size == 1:
            return
        for j in range(self.size):
            mine = [local(self.params[i]) for i, o in enumerate(self.owner) if o == j]
            flat = flatten(mine)
            dist.broadcast(flat, src=self.ranks[j], group=self.group)
            if j != self.index:
                unflatten_into(flat, mine)


def apply_fsdp(module: nn.Module, groups: ParallelGroups, pp_enabled: bool) -> None:
    """FSDP2 over ``dp_cp`` (or HSDP over ``(dp_replicate, dp_shard_cp)``): each transformer block,
    then the stage root (TorchTitan's order)."""
    from torch.distributed.fsdp import fully_shard

    mesh = groups.fsdp_mesh
    # with PP, keep parameters gathered between micro-batches (TorchTitan's default)
    reshard = not pp_enabled
    for block in module.layers.values():  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
