"""The job's throughput on the nodes it has, from the real planner, cached per cluster shape.

The job is planned once on the cluster (``planner.plan``, allowed down to 31/32 of the GPUs so a
cluster size without a good factorization still gets a plan; GPUs it leaves unused are idle spares).
After ``lost`` of its nodes are gone, ``planner.replan`` on the job's nodes minus those gives the new
layout and tokens/s (keep, shrink DP or re-plan, whichever delivers most over the planner's horizon).
The cluster is homogeneous, so the shape is the number of nodes lost; it is rounded *up* to a power of
two (a conservative throughput) so a long run needs only a handful of planner calls.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "llama3-405b"
#: Llama 3 405B pre-training: 8K sequences, 16M tokens per step, TP 8, CP 1 (Llama 3 paper, §3.3.2).
DEFAULT_SEQ_LEN = 8192
DEFAULT_GLOBAL_BATCH = 2048
DEFAULT_GPU = "H100"

_CACHE: dict[tuple[str, int], tuple[float, bool, int]] = {}
_PLANS: dict[str, Any] = {}


def job_spec(gpus: int, gpus_per_node: int, model: str = DEFAULT_MODEL) -> dict[str, Any]:
    """The planner spec of the simulated job on ``gpus`` GPUs."""
    return {
        "model": {"name": model, "seq_len": DEFAULT_SEQ_LEN},
        "cluster": {"gpu_type": DEFAULT_GPU, "num_gpus": gpus, "gpus_per_node": gpus_per_node,
                    "min_gpus": max(gpus_per_node, (gpus - gpus // 32) // gpus_per_node * gpus_per_node)},
        "parallel": {"global_batch": DEFAULT_GLOBAL_BATCH, "tp": min(8, gpus_per_node), "cp": 1},
        "precision": "bf16",
    }


def shape_bucket(lost: int) -> int:
    """``lost`` rounded up to a power of two (0 stays 0)."""
    return 0 if lost <= 0 else 1 << (lost - 1).bit_length()


@dataclass
class JobThroughput:
    """The planned job and its throughput after losing nodes."""

    gpus: int
    gpus_per_node: int
    model: str = DEFAULT_MODEL
    fixed_layout: str | None = None  # run this layout (e.g. a goodput-aware plan's) instead of the planner's best
    groups: int | None = None  # replica groups (default: every DP replica of the layout)
    planner_s: float = 0.0
    planner_calls: int = 0
    _plan: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import planner
        from planner.flops import total_params
        from planner.spec import parse_spec

        spec = job_spec(self.gpus, self.gpus_per_node, self.model)
        key = json.dumps(spec, sort_keys=True) + (self.fixed_layout or "")
        if key not in _PLANS:
            t0 = time.perf_counter()
            if self.fixed_layout:
                free = {**spec, "parallel": {"global_batch": DEFAULT_GLOBAL_BATCH}}
                try:
                    got = planner.evaluate(free, self.fixed_layout)
                except ValueError as exc:
                    raise ValueError(f"layout: {exc}") from None
                if not isinstance(got, planner.Plan):
                    raise ValueError(f"layout: {self.fixed_layout} does not run on {self.gpus} GPUs: {got.reason}")
                plans = (got,)
            else:
                plans = planner.plan(spec, top_k=1).plans
            self.planner_s += time.perf_counter() - t0
            self.planner_calls += 1
            if not plans:
                raise ValueError(f"gpus: the planner finds no layout for {self.model} on {self.gpus} GPUs")
            _PLANS[key] = plans[0]
        self._plan = _PLANS[key]
        self.params = total_params(parse_spec(spec).model)
        # the job's own nodes: re-planning happens on them (idle cluster nodes are the spare pool)
        self._job_spec = job_spec(self._plan.num_gpus, self.gpus_per_node, self.model)
        self._key = json.dumps(self._job_spec, sort_keys=True)

    @property
    def job_gpus(self) -> int:
        return int(self._plan.num_gpus)

    @property
    def job_nodes(self) -> int:
        return self.job_gpus // self.gpus_per_node

    @property
    def tokens_per_s(self) -> float:
        return float(self._plan.estimate.tokens_per_s)

    @property
    def step_s(self) -> float:
        return float(self._plan.estimate.step_time_s)

    @property
    def layout(self) -> str:
        return str(self._plan.layout.short())

    @property
    def model_parallel(self) -> int:
        lay = self._plan.layout
        return int(lay.tp * lay.pp * lay.cp)

    def after_loss(self, lost: int) -> tuple[float, bool, int]:
        """(tokens/s, model-parallel shape changed, GPUs used) with ``lost`` of the job's nodes gone."""
        if lost <= 0:
            return self.tokens_per_s, False, self.job_gpus
        bucket = min(shape_bucket(lost), self.job_nodes)
        if bucket >= self.job_nodes:
            return 0.0, True, 0
        hit = _CACHE.get((self._key, bucket))
        if hit is None:
            import planner

            t0 = time.perf_counter()
            try:
                rp = planner.replan(self._plan, None, {"lost_nodes": list(range(bucket))}, self._job_spec)
                lay, old = rp.plan.layout, self._plan.layout
                changed = (lay.tp, lay.pp, lay.cp, lay.vpp) != (old.tp, old.pp, old.cp, old.vpp)
                hit = (float(rp.new_tokens_per_s), changed, int(rp.plan.num_gpus))
            except ValueError:  # nothing fits on what remains
                hit = (0.0, True, 0)
            self.planner_s += time.perf_counter() - t0
            self.planner_calls += 1
            _CACHE[(self._key, bucket)] = hit
        return hit

    def group_shape(self) -> tuple[int, int, int]:
        """(replica groups, groups lost per node failure, nodes per group) of the plan's DP replicas."""
        mp, g = self.model_parallel, self.gpus_per_node
        if self.groups:  # a group is DP/groups replicas: a node failure takes out one, or several when smaller
            gpus_per_group = self.job_gpus // self.groups
            if gpus_per_group >= g:
                return self.groups, 1, math.ceil(gpus_per_group / g)
            return self.groups, g // gpus_per_group, 1
        groups = self.job_gpus // mp
        if mp >= g:
            return groups, 1, math.ceil(mp / g)
        return groups, g // mp, 1
