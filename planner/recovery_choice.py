"""What a job's ``recovery`` block comes to on a plan: the one rule for ``auto`` (pure Python).

:func:`choose` takes the plan the job runs (a :class:`~planner.result.Plan` or its dict), the job
spec's ``recovery`` block (as stored: only the fields the user set) and the planner spec of the plan
(to price memory), and returns a :class:`RecoveryChoice`: the concrete policy, the replica groups,
the snapshot cadence, the warm ranks per node and, in words, why.

``auto``, in this order:

1. the plan carries a ``recovery`` object (the planner's goodput-aware choice: ``policy``,
   ``groups``, ``snapshot_every``, ``checkpoint_every_steps``, ``warm_spares``, ``reason``): it is
   used as it is, after validation;
2. otherwise the memory rule: **replica groups when the plan's data parallelism can hold two or
   more full replicas in memory**, re-plan from memory otherwise. ``groups`` is the largest divisor
   ``G >= 2`` of the plan's ``dp`` for which the plan with ``dp_replicate = G`` (each group a full
   copy of model and optimizer state, ZeRO sharded over ``dp / G`` inside it) still fits per-GPU
   memory as the planner prices it (``planner.memory``). With ``zero = 0`` every DP rank already
   holds a full replica, so ``G = dp``.

Fields the user set explicitly (``snapshots.enabled``, ``snapshots.every``, ``warm_ranks``,
``groups``) win over both. ``restart`` restores from storage: no snapshots. The names are the job
spec's (``planner.recovery_names``: ``auto``, ``replica_groups``, ``replan``,
``restart``); a plan's object may use the simulator's names (``replan_memory``, ...).

:func:`for_grant` fits a choice to the GPUs an attempt was granted: a replica job gets whole
groups; room for fewer than two groups re-plans from memory instead.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planner.layout import Layout
from planner.memory import memory_limit_gb, memory_total_gb
from planner.recovery_names import (
    AUTO,
    CHOSEN_POLICIES,
    JOB_POLICIES,
    REPLAN,
    REPLICA_GROUPS,
    RESTART,
    job_policy,
    runtime_policy,
)
from planner.result import Plan
from planner.spec import PlanSpec, parse_spec

#: snapshots are on unless a job turns them off; one after every N-th step (docs/runtime.md)
DEFAULT_SNAPSHOTS = True
DEFAULT_SNAPSHOT_EVERY = 1
#: warm (pre-started, torch imported) rank actors kept idle per node: ``auto`` unless the job names a
#: number (:func:`auto_warm_ranks`: as many as the job runs ranks on one node, so every rank of a lost
#: node, and of the nodes the re-plan puts them on, starts warm)
AUTO_WARM_RANKS = "auto"
DEFAULT_WARM_RANKS = AUTO_WARM_RANKS
#: the most warm ranks per node a job may ask for (and ``auto`` gives)
MAX_WARM_RANKS = 8


def auto_warm_ranks(ranks_per_node: Iterable[int], gpus_per_node: int | None = None) -> int:
    """``auto``'s warm ranks per node: the most ranks the job runs on one node (``ranks_per_node``:
    its ranks on each node it uses), at least 1 and at most :data:`MAX_WARM_RANKS`. A re-plan after
    a node is lost starts a new gang: every rank on every node it uses is a new process, so a node's
    worth of warm ranks is what keeps them all off a cold start. ``gpus_per_node``: used when the
    ranks' nodes are not known (the node's GPUs, or 1 with neither)."""
    most = max((int(n) for n in ranks_per_node), default=0)
    if most <= 0:
        most = int(gpus_per_node or 1)
    return max(1, min(MAX_WARM_RANKS, most))


def resolve_warm_ranks(warm: int | str | None, ranks_per_node: Iterable[int], gpus_per_node: int | None = None) -> int:
    """A job's warm ranks per node: the number it names, or ``auto`` (``None``: unset) by :func:`auto_warm_ranks`."""
    if warm is None or warm == AUTO_WARM_RANKS:
        return auto_warm_ranks(ranks_per_node, gpus_per_node)
    if not _whole(warm) or not 0 <= int(warm) <= MAX_WARM_RANKS:
        raise ChoiceError("recovery.warm_ranks", f"must be {AUTO_WARM_RANKS} or a whole number 0..{MAX_WARM_RANKS}, "
                                                 f"got {warm!r}")
    return int(warm)


def plan_ranks_per_node(plan: Plan) -> list[int]:
    """How many of ``plan``'s ranks each node runs (its rank grid's; empty without one)."""
    return list(Counter(slot.node for slot in plan.rank_grid).values())


class ChoiceError(ValueError):
    """A recovery block that cannot hold on the plan; ``field`` is where in the job spec."""

    def __init__(self, field: str, msg: str) -> None:
        super().__init__(f"{field}: {msg}")
        self.field = field
        self.msg = msg


@dataclass(frozen=True)
class RecoveryChoice:
    """The concrete recovery of a job on a plan."""

    policy: str  # replica_groups | replan | restart
    groups: int  # replica groups (0 unless replica_groups)
    group_gpus: int  # GPUs per replica group (the plan's GPUs when not replica_groups)
    snapshots: bool
    snapshot_every: int
    warm_ranks: int  # per node
    reason: str
    source: str  # "rule" (the memory rule), "plan" (the plan's recovery object) or "spec" (the user named it)
    group_layout: dict[str, Any] | None = None  # one group's layout (replica_groups)
    checkpoint_every_steps: int | None = None  # the plan's checkpoint cadence, if it chose one
    warm_spares: int | None = None  # the plan's spare nodes, if it chose them

    @property
    def runtime_policy(self) -> str:
        """The runtime's/simulator's name (``replan`` with snapshots: ``replan_memory``)."""
        return runtime_policy(self.policy, self.snapshots)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["runtime_policy"] = self.runtime_policy
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecoveryChoice:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_block(recovery: Mapping[str, Any] | None) -> tuple[str, int | None, bool | None, int | None, int | None]:
    """(policy, groups, snapshots.enabled, snapshots.every, warm_ranks) of a stored block; None: unset."""
    r = dict(recovery or {})
    unknown = sorted(set(r) - {"policy", "groups", "snapshots", "warm_ranks"})
    if unknown:
        raise ChoiceError(f"recovery.{unknown[0]}", "not a field of the recovery block")
    policy = r.get("policy", AUTO)
    if policy not in JOB_POLICIES:
        raise ChoiceError("recovery.policy", f"unknown policy {policy!r}; choose from {', '.join(JOB_POLICIES)}")
    snaps = dict(r.get("snapshots") or {})
    enabled, every = snaps.get("enabled"), snaps.get("every")
    groups, warm = r.get("groups"), r.get("warm_ranks")
    if groups is not None and (not _whole(groups) or groups < 2):
        raise ChoiceError("recovery.groups", f"must be a whole number >= 2, got {groups!r}")
    if groups is not None and policy != REPLICA_GROUPS:
        raise ChoiceError("recovery.groups", "applies only with policy replica_groups")
    if every is not None and (not _whole(every) or every < 1):
        raise ChoiceError("recovery.snapshots.every", f"must be a whole number of steps >= 1, got {every!r}")
    if enabled is not None and not isinstance(enabled, bool):
        raise ChoiceError("recovery.snapshots.enabled", f"must be true or false, got {enabled!r}")
    if policy == RESTART and enabled:
        raise ChoiceError("recovery.snapshots.enabled", "restart restores from storage; snapshots need policy "
                                                        "auto, replan or replica_groups")
    if warm == AUTO_WARM_RANKS:
        warm = None
    if warm is not None and (not _whole(warm) or not 0 <= warm <= MAX_WARM_RANKS):
        raise ChoiceError("recovery.warm_ranks", f"must be {AUTO_WARM_RANKS} or a whole number 0..{MAX_WARM_RANKS}, "
                                                 f"got {warm!r}")
    return policy, groups, enabled, every, warm


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _plan(plan: Plan | Mapping[str, Any]) -> tuple[Plan, Mapping[str, Any] | None]:
    """The plan and its ``recovery`` object (a dict's only: ``Plan`` has no such field yet)."""
    if isinstance(plan, Plan):
        obj = getattr(plan, "recovery", None)
    else:
        obj = plan.get("recovery")
        plan = Plan.from_dict({k: v for k, v in plan.items() if k != "recovery"})
    if obj is not None and not isinstance(obj, Mapping) and hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    return plan, obj


def group_layout(lay: Layout, groups: int) -> Layout:
    """One replica group of ``lay`` split into ``groups`` (``dp / groups`` DP ranks each)."""
    return dataclasses.replace(lay, dp=lay.dp // groups, dp_replicate=1,
                               num_micro_batches=lay.num_micro_batches)


def _node_aligned(plan: Plan, groups: int) -> bool:
    """Whether no node of ``plan`` holds ranks of two of ``groups`` replica groups (a node lost takes
    one group); False without a rank grid."""
    lay = plan.layout
    shard = lay.dp // groups
    seen: dict[int | str, int] = {}
    for slot in plan.rank_grid:
        g = lay.coords(slot.rank).dp // shard
        if seen.setdefault(slot.node, g) != g:
            return False
    return bool(plan.rank_grid)


def replica_room(plan: Plan, spec: PlanSpec | Mapping[str, Any] | None) -> tuple[int, str]:
    """The memory rule: how many replica groups ``G >= 2`` (a divisor of the plan's ``dp``) each
    holding a full replica fit per-GPU memory, and why; ``(0, why not)`` when two do not. Of the
    counts that fit, the largest whose groups share no node (a node lost takes one group), else the
    largest."""
    lay = plan.layout
    if lay.dp < 2:
        return 0, f"dp={lay.dp}: one copy of the model state, no second replica to heal from"
    counts = sorted((d for d in range(2, lay.dp + 1) if lay.dp % d == 0), reverse=True)
    if lay.zero == 0:
        fits = counts
        why = f"zero=0: each of the dp={lay.dp} data-parallel ranks holds a full replica"
    elif spec is None:
        return 0, f"zero={lay.zero}: no planner spec to price replicas in memory"
    else:
        pspec = spec if isinstance(spec, PlanSpec) else parse_spec(spec)
        limit = memory_limit_gb(pspec)
        mem = {g: memory_total_gb(pspec, dataclasses.replace(lay, dp_replicate=g)) for g in counts}
        fits = [g for g in counts if mem[g] <= limit]
        if not fits:
            return 0, (f"zero={lay.zero}, dp={lay.dp}: two full replicas need {mem[2]:.1f} GiB per GPU, "
                       f"{limit:.1f} usable")
        why = (f"zero={lay.zero}, dp={lay.dp}: {fits[0]} full replicas fit ({mem[fits[0]]:.1f} GiB per GPU of "
               f"{limit:.1f} usable, {memory_total_gb(pspec, lay):.1f} sharded over all of dp)")
    aligned = [g for g in fits if _node_aligned(plan, g)]
    if aligned and aligned[0] != fits[0]:
        return aligned[0], f"{why}; {aligned[0]} groups, so that a node lost takes one group"
    return fits[0], why


def _from_plan_object(obj: Mapping[str, Any], lay: Layout) -> tuple[str, int, int | None, int | None, int | None, str]:
    """(policy, groups, snapshot_every (0: off), checkpoint_every_steps, warm_spares, reason) of a plan's
    ``recovery`` object; ``ChoiceError`` naming what is wrong with it."""
    if not isinstance(obj, Mapping):
        raise ChoiceError("plan.recovery", "must be an object")
    try:
        policy = job_policy(str(obj.get("policy")))
    except ValueError as e:
        raise ChoiceError("plan.recovery.policy", str(e)) from None
    if policy not in CHOSEN_POLICIES:
        raise ChoiceError("plan.recovery.policy", f"must be concrete, one of {', '.join(CHOSEN_POLICIES)}")
    groups = obj.get("groups", 0) or 0
    if not _whole(groups) or groups < 0:
        raise ChoiceError("plan.recovery.groups", f"must be a whole number >= 0, got {groups!r}")
    if policy == REPLICA_GROUPS and (groups < 2 or lay.dp % groups):
        raise ChoiceError("plan.recovery.groups", f"replica_groups needs >= 2 groups dividing dp={lay.dp}, "
                                                  f"got {groups}")
    every = obj.get("snapshot_every")
    if every is not None and (not _whole(every) or every < 0):
        raise ChoiceError("plan.recovery.snapshot_every", f"must be a whole number >= 0, got {every!r}")
    ckpt = obj.get("checkpoint_every_steps")
    if ckpt is not None and (not _whole(ckpt) or ckpt < 1):
        raise ChoiceError("plan.recovery.checkpoint_every_steps", f"must be a whole number >= 1, got {ckpt!r}")
    spares = obj.get("warm_spares")
    if spares is not None and (not _whole(spares) or spares < 0):
        raise ChoiceError("plan.recovery.warm_spares", f"must be a whole number >= 0, got {spares!r}")
    reason = str(obj.get("reason") or "the planner's goodput-aware choice")
    return policy, groups if policy == REPLICA_GROUPS else 0, every, ckpt, spares, reason


def choose(plan: Plan | Mapping[str, Any], recovery: Mapping[str, Any] | None = None,
           spec: PlanSpec | Mapping[str, Any] | None = None) -> RecoveryChoice:
    """The recovery of a job whose spec's ``recovery`` block is ``recovery`` on ``plan`` (see the
    module docstring); ``spec``: the planner spec of the plan, to price replicas in memory.
    :class:`ChoiceError` naming the field when the block cannot hold on this plan."""
    policy, groups, enabled, every, warm = check_block(recovery)
    p, obj = _plan(plan)
    lay = p.layout
    ckpt = spares = None
    plan_every: int | None = None
    if policy == AUTO and obj is not None:
        policy, g, plan_every, ckpt, spares, reason = _from_plan_object(obj, lay)
        source, groups = "plan", g
    elif policy == AUTO:
        g, why = replica_room(p, spec)
        source = "rule"
        if g:
            policy, groups, reason = REPLICA_GROUPS, g, f"replica groups: {why}"
        else:
            policy, reason = REPLAN, f"re-plan from memory: {why}"
    elif policy == REPLICA_GROUPS:
        source = "spec"
        room, why = replica_room(p, spec)
        if groups is None:
            if not room:
                raise ChoiceError("recovery.policy", f"replica_groups does not fit this plan ({lay.short()}): {why}")
            groups, reason = room, f"replica groups (named in the spec): {why}"
        else:
            if lay.dp % groups:
                raise ChoiceError("recovery.groups", f"the plan's dp={lay.dp} is not a multiple of {groups} "
                                                     f"groups ({lay.short()})")
            if room < groups:
                raise ChoiceError("recovery.groups", f"{groups} full replicas do not fit this plan "
                                                     f"({lay.short()}): {why}")
            reason = f"{groups} replica groups, named in the spec"
    else:
        source = "spec"
        reason = ("re-plan, named in the spec" if policy == REPLAN
                  else "restart from storage, named in the spec (no snapshots)")
    if policy == RESTART:
        snaps, cadence = False, every or DEFAULT_SNAPSHOT_EVERY
    else:
        snaps = enabled if enabled is not None else (plan_every != 0 if plan_every is not None else DEFAULT_SNAPSHOTS)
        cadence = every or plan_every or DEFAULT_SNAPSHOT_EVERY
    if policy == REPLAN and not snaps:
        reason = reason.replace("re-plan from memory", "re-plan from storage (snapshots off)")
    glay = group_layout(lay, groups) if policy == REPLICA_GROUPS else None
    gpn = None
    if spec is not None:
        gpn = (spec if isinstance(spec, PlanSpec) else parse_spec(spec)).cluster.gpus_per_node
    warm = resolve_warm_ranks(warm, plan_ranks_per_node(p), min(gpn, p.num_gpus) if gpn else None)
    return RecoveryChoice(
        policy=policy, groups=(groups or 0) if policy == REPLICA_GROUPS else 0,
        group_gpus=glay.world_size if glay is not None else p.num_gpus,
        snapshots=bool(snaps), snapshot_every=int(cadence),
        warm_ranks=warm, reason=reason, source=source,
        group_layout=glay.to_dict() if glay is not None else None, checkpoint_every_steps=ckpt, warm_spares=spares)


def unplanned(recovery: Mapping[str, Any] | None = None) -> RecoveryChoice:
    """The choice when no plan is known (the control plane could not plan): ``auto`` re-plans from
    memory, a named policy stands (``replica_groups`` needs a plan: ``ChoiceError``)."""
    policy, _groups, enabled, every, warm = check_block(recovery)
    if policy == REPLICA_GROUPS:
        raise ChoiceError("recovery.policy", "replica_groups needs a plan to size its groups")
    snaps = False if policy == RESTART else (DEFAULT_SNAPSHOTS if enabled is None else enabled)
    why = {AUTO: "re-plan from memory: no plan known to the control plane",
           REPLAN: "re-plan, named in the spec", RESTART: "restart from storage, named in the spec (no snapshots)"}
    return RecoveryChoice(policy=REPLAN if policy == AUTO else policy, groups=0, group_gpus=0, snapshots=snaps,
                          snapshot_every=every or DEFAULT_SNAPSHOT_EVERY,
                          warm_ranks=resolve_warm_ranks(warm, ()), reason=why[policy],
                          source="rule" if policy == AUTO else "spec")


def for_grant(choice: RecoveryChoice, gpus: int) -> RecoveryChoice:
    """``choice`` on ``gpus`` granted GPUs: a replica job runs the whole groups that fit; room for
    fewer than two re-plans from memory (snapshots as chosen)."""
    if choice.policy != REPLICA_GROUPS or choice.group_gpus < 1:
        return choice
    fit = gpus // choice.group_gpus
    if fit >= 2:
        if fit == choice.groups:
            return choice
        return dataclasses.replace(choice, groups=fit, reason=f"{choice.reason}; {fit} groups on the {gpus} GPUs granted")
    return dataclasses.replace(
        choice, policy=REPLAN, groups=0, group_layout=None, group_gpus=gpus,
        reason=f"re-plan from memory: {gpus} GPUs granted hold {fit} replica group(s) of {choice.group_gpus} "
               f"({choice.reason})")
