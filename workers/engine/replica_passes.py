"""A replica group's share of a step, run in passes of its layout (``workers.engine.replica_ft``'s
arithmetic; which rows: ``replica_rows``).

:func:`forward_backward` runs a group's rows in passes (one ``RankTrainer.forward_backward`` each:
the group's own TP, PP schedule, CP, DP reduction and ZeRO-1 / FSDP2 reduction), each pass's
gradient weighted by ``rows / global_batch`` and summed, so the groups' cross-group ``SUM`` is the
gradient of the mean over the global batch; :func:`fill_grads` gives every rank the same gradient
tensors as the same rank of the other groups (the flat buffers of the cross-group reduction line
up); :func:`warm_up` is a new rank's thrown-away first pass.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from workers.engine.parallel.data import local


def forward_backward(trainer: Any, sampler: Any, step: int, rows: list[int], global_batch: int) -> float:
    """Gradients of ``sum_p loss_p * rows_p / global_batch`` over rows ``rows`` of step ``step``'s
    global batch, run in passes ``p`` of the group's layout (``replica_rows.pass_rows``: one
    ``RankTrainer.forward_backward`` each, with the group's own TP/PP/CP/DP collectives and its ZeRO
    or FSDP reduction), in ``.grad`` (:func:`fill_grads`: zeros where nothing was computed); returns
    that partial loss."""
    from workers.engine.replica_rows import pass_rows

    for p in trainer.params:
        p.grad = None
    size = pass_rows(trainer.layout)
    batch = sampler.batch(step) if rows else None
    kept: list[torch.Tensor | None] | None = None
    part = 0.0
    for i in range(0, len(rows), size):
        assert batch is not None
        rows_p = batch[rows[i:i + size]]
        w = rows_p.shape[0] / global_batch
        part += trainer.forward_backward(rows_p) * w  # the pass's mean loss and gradient (the group's)
        with torch.no_grad():
            for j, p in enumerate(trainer.params):
                if p.grad is None:
                    continue
                g = local(p.grad)
                g.mul_(w)
                if kept is not None and kept[j] is not None:
                    g.add_(kept[j])
        kept = [local(p.grad) if p.grad is not None else None for p in trainer.params]
    fill_grads(trainer)
    return part


def holds_grad(trainer: Any) -> list[bool]:
    """Which of this rank's parameters hold a gradient after a pass: all, but with ZeRO-1 only the
    ones whose optimizer state this rank owns. The same for the same rank of every group (the same
    layout), so the cross-group reduction's flat buffers line up."""
    zero1 = getattr(trainer, "zero1", None)
    if zero1 is None or zero1.size == 1:
        return [True] * len(trainer.params)
    owned = set(zero1.owned())
    return [i in owned for i in range(len(trainer.params))]


def fill_grads(trainer: Any) -> None:
    """Zeros for the gradients this rank holds (:func:`holds_grad`) that no pass computed (a group
    with no rows in the step: healing, or a share of none), ``None`` for the others."""
    for p, held in zip(trainer.params, holds_grad(trainer), strict=True):
        if not held:
            p.grad = None
        elif p.grad is None:
            p.grad = torch.zeros_like(p)


def warm_up(trainer: Any, sampler: Any, global_batch: int) -> float:
    """One forward and backward pass over step 0's first pass of rows, thrown away (parameters, RNG and the
    optimizer untouched, gradients cleared), on every rank of a group together (the pass runs the
    group's TP collectives), before the group's torchft manager exists. A new rank's first pass
    (allocator, autograd, the first TP collectives) took about twice a steady one here, and a
    replacement's first pass is part of its first step with a share (the one after its heal), which
    the survivors wait for. Before
    the manager: a manager heartbeats to the lighthouse at once, and a group that heartbeats but has
    not asked for a quorum holds every changed quorum (a redo's too) up to the join timeout.
    Then one optimizer step at learning rate 0 on zero gradients (the parameters do not move), whose
    state is dropped after it (the first real step starts AdamW afresh, or the healing replaces the
    state): a rank's first optimizer step computed DTensor's sharding decisions for every ``_foreach``
    op (0.3 s of CPU for tp=2 tiny here), in the step a replacement heals in. Seconds spent."""
    t0, rng = time.perf_counter(), torch.get_rng_state()
    from workers.engine.replica_rows import pass_rows

    forward_backward(trainer, sampler, 0, list(range(pass_rows(trainer.layout))), global_batch)
    opt = trainer.optimizer
    lrs = [g["lr"] for g in opt.param_groups]
    with torch.no_grad():
        for p in trainer.params:
            if p.grad is not None:
                p.grad.zero_()
        for g in opt.param_groups:
            g["lr"] = 0.0
        opt.step()
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
    opt.state.clear()
    for p in trainer.params:
        p.grad = None
    torch.set_rng_state(rng)
    return time.perf_counter() - t0
