"""Pipeline parallelism with ``torch.distributed.pipelining`` (GPipe, 1F1B, interleaved 1F1B).

Stages hold whole layers. With ``pp`` ranks and ``vpp`` virtual stages per rank there are
``pp*vpp`` stages; rank ``r`` holds stages ``r, r+pp, r+2*pp, ...`` (looped placement, as
Megatron's interleaved schedule wants). Stage 0 also holds the embedding, the last stage the final
norm and the output head. Each stage module is the full :class:`Transformer` with the other layers
deleted, so parameter names stay global (``layers.5.attention.wq.weight``) and checkpoints do not
depend on the split.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)

from planner.layout import Layout
from workers.engine.model import Transformer


def stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    return [pp_rank + k * layout.pp for k in range(layout.vpp)]


def split_stage(full: Transformer, stage: int, num_stages: int) -> Transformer:
    """A copy of ``full`` holding only ``stage``'s layers (and embedding / head at the ends)."""
    per = full.cfg.layers // num_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    mod = copy.deepcopy(full) if num_stages > 1 else full
    for name in list(mod.layers.keys()):
        if name not in keep:
            del mod.layers[name]
    if stage != 0:
        mod.tok_embeddings = None
    if stage != num_stages - 1:
        mod.norm = None
        mod.output = None
    return mod


class InFlightCounter:
    """Counts micro-batches forwarded but not yet backwarded on a stage module (1F1B memory bound)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.current = 0
        self.peak = 0
        self.handle = module.register_forward_hook(self._on_forward)

    def _on_forward(self, _mod: torch.nn.Module, _args: object, out: torch.Tensor) -> None:
        if not torch.is_grad_enabled() or not out.requires_grad:
            return
        self.current += 1
        self.peak = max(self.peak, self.current)
        out.register_hook(self._on_backward)

    def _on_backward(self, grad: torch.Tensor) -> None:
        self.current -= 1

    def reset(self) -> None:
        """Start counting a new step (the first step's shape-inference forward never gets a backward)."""
        self.current = 0
        self.peak = 0

    def remove(self) -> None:
        self.handle.remove()


def build_schedule(layout: Layout, stages: list[Transformer], stage_indices: list[int],
                   pp_group: dist.ProcessGroup, device: torch.device, num_micro_batches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                   ) -> tuple[_PipelineSchedule, list[PipelineStage]]:
    num_stages = layout.pp * layout.vpp
    pstages = [PipelineStage(mod, idx, num_stages, device, group=pp_group)
               for mod, idx in zip(stages, stage_indices, strict=True)]
    if layout.schedule == "interleaved":
        sched: _PipelineSchedule = ScheduleInterleaved1F1B(pstages, num_micro_batches, loss_fn=loss_fn)
    elif layout.schedule == "gpipe":
        sched = ScheduleGPipe(pstages[0], num_micro_batches, loss_fn=loss_fn)
    else:
        sched = Schedule1F1B(pstages[0], num_micro_batches, loss_fn=loss_fn)
    return sched, pstages


def schedule_actions(layout: Layout, num_micro_batches: int) -> dict[int, list[str]]:
    """The per-rank action lists of ``layout``'s schedule, e.g. ``{0: ["0F0", "0F1", "0B0", ...]}``.

    ``sF m`` = forward of micro-batch ``m`` on stage ``s``, ``B`` = backward; idle slots are left
    out. Built from the schedule classes themselves (no process group needed).
    """
    class _FakeStage:
        def __init__(self, idx: int, rank: int) -> None:
            self.stage_index = idx
            self.num_stages = layout.pp * layout.vpp
            self.group_size = layout.pp
            self.group_rank = rank
            self.is_first = idx == 0
            self.is_last = idx == self.num_stages - 1

    out: dict[int, list[str]] = {}
    if layout.schedule == "interleaved":
        fake = [_FakeStage(i, 0) for i in stage_ids(layout, 0)]
        sched = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
        sched.pp_group_size = layout.pp
        sched.n_local_stages = layout.vpp
        sched._n_microbatches = num_micro_batches
        sched.number_of_rounds = max(1, num_micro_batches // layout.pp)
        sched.microbatches_per_round = num_micro_batches // sched.number_of_rounds
        sched._stages = fake  # type: ignore[assignment]
        for r in range(layout.pp):
            sched.rank = r
            out[r] = [str(a) for a in sched._calculate_single_rank_operations(r) if a is not None]
        return out
    # 1F1B / GPipe: the order Schedule1F1B/ScheduleGPipe._step_microbatches runs (torch's own
    # ``_get_pipeline_order`` IR for 1F1B mislabels the last stage's micro-batches)
    for r in range(layout.pp):
        n = num_micro_batches
        if layout.schedule == "gpipe":
            acts = [f"{r}F{i}" for i in range(n)] + [f"{r}B{i}" for i in range(n)]
        else:
            warm = min(n, layout.pp - r)
            acts = [f"{r}F{i}" for i in range(warm)]
            f, b = warm, 0
            while b < n:
                acts.append(f"{r}B{b}")
                b += 1
                if f < n:
                    acts.append(f"{r}F{f}")
                    f += 1
        out[r] = acts
    return out


def format_schedule(layout: Layout, num_micro_batches: int) -> str:
    """Printable per-rank action lists."""
    lines = [f"schedule={layout.schedule} pp={layout.pp} vpp={layout.vpp} micro_batches={num_micro_batches}"]
    for r, acts in schedule_actions(layout, num_micro_batches).items():
        lines.append(f"rank {r}: " + " ".join(acts))
    return "\n".join(lines)
