"""Recovery as a policy: a failure in, a typed decision out, no Ray.

:meth:`RecoveryPolicy.decide` takes a classified :class:`~workers.runtime.cluster.watchdog.Failure`
and a :class:`FailureView` of the attempt and returns one :class:`FailureDecision`:

- :class:`Replan` -- tear the gang down and re-plan over the nodes left, without ``exclude`` (a lost
  node, a node cut off by a partition, a suspect node); restore from ``source``. For replica groups
  this is the fallback when the replica path runs out (``drop``: every group left; the job goes on
  as one gang, :meth:`RecoveryPolicy.fall_back`);
- :class:`Restart` -- start the gang again on the same nodes (a rank died or raised, or hung, on a
  live node: nothing is kept out); restore from ``source``;
- :class:`DropGroups` -- replica groups: drop ``groups`` (replacements start) while the others step on;
- :class:`Retry` -- replica groups: nothing is dropped, the live groups redo the step;
- :class:`Fail` -- end the job (``reason``).

Every decision also says how the policy read the failure: the failure as read (a partition turns a
raise or a hang into ``node_lost`` for the nodes it leaves out), the nodes to keep out of plans from
now on, a suspect node and the nodes cut off. The :class:`~workers.runtime.supervision.attempt_machine.AttemptMachine`
only carries decisions out (events, tear-downs, the re-plan). The shape follows Ray Train v2:
``FailurePolicy.make_decision`` returns a ``FailureDecision``, ``ScalingPolicy`` a ``ResizeDecision``.

The policy owns the failure budget (``max_recoveries``), node exclusion (lost and cut-off nodes,
suspects after ``node_death_limit`` deaths: :class:`NodeDeaths`), the rule that the same start
failure twice ends the job, which replica groups a failure takes, and where a restore reads from
(:meth:`RecoveryPolicy.restore_choice`). Its names are the goodput simulator's
(:mod:`planner.recovery_names`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.recovery_names import (
    REPLAN_MEMORY,
    REPLAN_STORAGE,
    REPLICA_GROUP,
    RUNTIME_POLICIES,
    SOURCES,
)
from workers.runtime.cluster.reachability import Verdict
from workers.runtime.cluster.watchdog import Failure
from workers.runtime.contract.events import RestoreSource
from workers.runtime.recovery import memory_snapshots as memsnap
from workers.runtime.recovery.replica_groups import ReplicaSet, raised_to_drop


class NodeDeaths:
    """Tells a bad node from bad luck: a node on which rank processes died ``limit`` times while the
    node itself stayed up (its raylet answering: ``rank_failed``, not ``node_lost``), each time on that
    node alone, is suspect -- a failing GPU, driver or memory that the node's health checks do not see.
    Deaths spread over several nodes at once (a layout that runs out of memory everywhere, a bug) and
    errors that ranks *raised* count against no node. ``limit`` 0 turns this off."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.deaths: dict[str, int] = {}

    def record(self, failure: Failure) -> str | None:
        """Count ``failure``; the node to keep out of plans from now on, if it became suspect."""
        if failure.kind != "rank_failed" or not failure.died or len(failure.nodes) != 1:
            return None
        node = failure.nodes[0]
        self.deaths[node] = self.deaths.get(node, 0) + 1
        return node if self.limit and self.deaths[node] == self.limit else None


@dataclass(frozen=True)
class Suspect:
    """A live node on which rank processes died ``deaths`` times: kept out of this job's plans."""

    node: str
    deaths: int


@dataclass(frozen=True)
class GroupStep:
    """Replica groups: the gather a failure ended. ``owners``: (group, rank in group) per rank of the
    combined view; ``unresponsive``: ranks that stopped answering heartbeats; ``raised``: ranks whose
    call raised; ``committed``: the groups that committed the step anyway."""

    replicas: ReplicaSet
    owners: Sequence[tuple[int, int]]
    unresponsive: Sequence[int] = ()
    raised: Sequence[int] = ()
    committed: frozenset[int] = frozenset()


@dataclass(frozen=True)
class FailureView:
    """What the policy reads about the attempt besides the failure.

    ``during``: what failed -- ``step``, ``save`` (a checkpoint) or ``start`` (actors, rendezvous,
    restore); ``rank_nodes``: the node of each rank of the gang that failed; ``partition``: what a
    peer probe of those nodes found (None: none ran); ``groups``: replica groups only."""

    during: str = "step"
    rank_nodes: tuple[str, ...] = ()
    partition: Verdict | None = None
    groups: GroupStep | None = None


@dataclass(frozen=True, kw_only=True)
class FailureDecision:
    """How the policy read a failure (the same on every decision)."""

    failure: Failure  # as read: a partition turns a raise or a hang into node_lost for the nodes it leaves out
    exclude: tuple[str, ...] = ()  # nodes kept out of plans from now on (lost, cut off, suspect)
    suspect: Suspect | None = None  # rank processes kept dying on this live node
    cut_off: tuple[str, ...] = ()  # left out for a partition: fence first; no snapshot held there is used


@dataclass(frozen=True, kw_only=True)
class Replan(FailureDecision):
    """Tear the gang down, re-plan over the nodes left (``exclude`` told to the planner as lost)."""

    source: RestoreSource
    drop: tuple[int, ...] = ()  # replica groups: the groups torn down first (the fallback: all of them)


@dataclass(frozen=True, kw_only=True)
class Restart(FailureDecision):
    """Start the gang again on the same nodes: nothing is kept out, the planner sees no change."""

    source: RestoreSource


@dataclass(frozen=True, kw_only=True)
class DropGroups(FailureDecision):
    """Replica groups: drop ``groups`` (replacements start) while the other groups keep stepping."""

    groups: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Retry(FailureDecision):
    """Replica groups: drop nothing; the live groups redo the step (torchft voted it down)."""


@dataclass(frozen=True, kw_only=True)
class Fail(FailureDecision):
    """End the job; ``drop``: the replica groups lost with it (recorded as dropped first)."""

    reason: str
    drop: tuple[int, ...] = ()


Decision = Replan | Restart | DropGroups | Retry | Fail


def policy_name(settings: Any) -> str:
    """The policy a job's runtime settings ask for: ``replica_groups >= 2`` is ``replica_group``,
    ``snapshots`` is ``replan_memory``, anything else ``replan_storage``."""
    if int(settings.replicas.groups) >= 2:
        return REPLICA_GROUP
    return REPLAN_MEMORY if settings.snapshots.enabled else REPLAN_STORAGE


@dataclass
class RecoveryPolicy:
    """One attempt's recovery policy (stateful, as Ray's ``FailurePolicy``: it counts failures)."""

    name: str = REPLAN_STORAGE
    max_recoveries: int = 10
    node_death_limit: int = 2
    # what a replica job becomes when the replica path runs out (a re-plan; from memory with snapshots)
    fallback: str = REPLAN_STORAGE
    failures: int = 0  # failures decided so far
    deaths: NodeDeaths = field(init=False)
    cut_off: set[str] = field(default_factory=set)  # nodes left out for a peer partition
    start_failures: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, reason) -> starts failed

    def __post_init__(self) -> None:
        if self.name not in RUNTIME_POLICIES:
            raise ValueError(f"policy: the runtime carries out {', '.join(RUNTIME_POLICIES)}, not {self.name!r}")
        self.deaths = NodeDeaths(self.node_death_limit)

    @classmethod
    def for_settings(cls, settings: Any) -> RecoveryPolicy:
        """The policy of a job's ``RuntimeSettings``."""
        return cls(policy_name(settings), int(settings.max_recoveries), int(settings.node_death_limit),
                   fallback=REPLAN_MEMORY if settings.snapshots.enabled else REPLAN_STORAGE)

    @property
    def source(self) -> RestoreSource:
        """Where a restore after a failure reads from (storage when no complete snapshot survived)."""
        return "memory" if SOURCES[self.name] == "memory" else "storage"

    @property
    def keeps_groups(self) -> bool:
        """Replica groups: a failure drops groups instead of re-planning the job."""
        return self.name == REPLICA_GROUP

    # ---------------------------------------------------------------- the decision
    def wants_probe(self, failure: Failure, rank_nodes: Sequence[str]) -> bool:
        """Whether a peer probe may explain ``failure``: ranks raised or hung (none died, no node lost)
        on a gang over two nodes or more."""
        return failure.kind in ("rank_failed", "hang") and not failure.died and len(set(rank_nodes)) >= 2

    def decide(self, failure: Failure, view: FailureView) -> Decision:
        """The decision for ``failure`` (counted against the budget)."""
        read, cut = self._partitioned(failure, view)
        exclude: tuple[str, ...] = ()
        suspect = None
        if read.kind == "node_lost":
            exclude = tuple(read.nodes)
        elif read.kind != "hang":
            node = self.deaths.record(read)
            if node is not None:  # re-planned as if the node were lost
                suspect = Suspect(node, self.deaths.deaths[node])
                exclude = (node,)
        self.cut_off.update(cut)
        self.failures += 1
        how: dict[str, Any] = {"failure": read, "exclude": exclude, "suspect": suspect, "cut_off": cut}
        if self.keeps_groups:
            return self._for_groups(read, view, how)
        if self.failures > self.max_recoveries:
            return Fail(reason=f"more than {self.max_recoveries} failures", **how)
        if view.during == "start":
            key = (failure.kind, failure.reason)  # as classified: a partition found later does not hide a repeat
            self.start_failures[key] = self.start_failures.get(key, 0) + 1
            if failure.kind != "node_lost" and self.start_failures[key] >= 2:
                return Fail(reason=f"the same start failure twice, giving up: {failure.reason}", **how)
        if exclude:
            return Replan(source=self.source, **how)
        return Restart(source=self.source, **how)

    def _fall_back(self, drop: tuple[int, ...], how: dict[str, Any]) -> Replan:
        """The replica path ran out: drop every group and re-plan; from now on the job is one gang,
        re-planned on failures (from memory when the job takes snapshots, else storage)."""
        self.name = self.fallback
        return Replan(source=self.source, drop=drop, **how)

    def _for_groups(self, read: Failure, view: FailureView, how: dict[str, Any]) -> Decision:
        """Replica groups: the groups ``read`` took (on a lost node, whose processes died, or that stopped
        answering), else the groups whose ranks raised twice in a row (``raised_to_drop``). When the
        loss cannot be absorbed -- every group lost, a step that hung with every group alive, a failed
        checkpoint of the group that writes it -- the job falls back to a re-plan over the GPUs left
        (:class:`Replan` with ``drop``: every group), never fails for it (the budget still counts). A
        checkpoint is not retried by another group: its write of the same step collides with the
        half-written one (seen: a missing shard file at the commit)."""
        if view.during == "save":
            if self.failures > self.max_recoveries:
                return Fail(reason=f"more than {self.max_recoveries} failures", **how)
            groups = tuple(sorted(view.groups.replicas.groups)) if view.groups is not None else ()
            return self._fall_back(groups, how)
        gs = view.groups
        if gs is None:
            raise ValueError("replica groups: a failure during a step needs the groups' view")
        reps, owners = gs.replicas, gs.owners
        lost = reps.hit(read, list(owners), list(gs.unresponsive))
        raised = {owners[r][0] for r in gs.raised if r < len(owners)} if read.kind == "rank_failed" else set()
        # "my peer died" is not "I am broken": a survivor's raises while the redo waits for torchft to
        # leave the dead group out are not held against it (replica_groups.raised_to_drop)
        blamed = raised_to_drop(reps, raised - set(lost), set(gs.committed), list(lost))
        groups = tuple(lost or blamed)
        if self.failures > self.max_recoveries:
            return Fail(reason=f"more than {self.max_recoveries} failures", **how)
        if not groups and read.kind == "hang":  # nothing to drop, nothing to redo with: one gang again
            return self._fall_back(tuple(sorted(reps.groups)), how)
        if groups and set(groups) >= set(reps.groups):  # the last group lost: re-plan onto the GPUs left
            return self._fall_back(tuple(sorted(set(groups) | set(reps.groups))), how)
        if not groups:
            return Retry(**how)
        return DropGroups(groups=groups, **how)

    def clean_gather(self, replicas: ReplicaSet, committed: set[int]) -> None:
        """Replica groups: a gather with no failure; the blame counters move on (a commit clears them)."""
        raised_to_drop(replicas, set(), committed, [])

    def _partitioned(self, failure: Failure, view: FailureView) -> tuple[Failure, tuple[str, ...]]:
        """``failure`` as read with the probe's verdict, and the nodes the partition leaves out: when
        some node pairs of the gang cannot connect while all answer the head, the nodes the verdict
        picks are declared lost, so the re-plan leaves them out instead of restarting on the same nodes."""
        verdict = view.partition
        if verdict is None or not verdict.exclude or not self.wants_probe(failure, view.rank_nodes):
            return failure, ()
        out = tuple(verdict.exclude)
        ranks = tuple(r for r, n in enumerate(view.rank_nodes) if n in out)
        return Failure("node_lost", f"{verdict.reason()} (after: {failure.reason})", out, ranks,
                       failure.detected_at), out

    # ---------------------------------------------------------------- where a restore reads from
    def restore_choice(self, held: Mapping[str, Sequence[dict[str, Any]]], *, not_before: int,
                       not_after: int) -> memsnap.Choice | None:
        """The in-memory snapshot to restore (``replan_memory``): the newest complete one over the
        holders' inventories that is no older than the newest checkpoint and no newer than the last
        step seen done, held on no node cut off by a partition (it may be cut from the new gang);
        ``None``: restore from storage."""
        if self.source != "memory" or self.keeps_groups:
            return None
        usable = {n: v for n, v in held.items() if n not in self.cut_off}
        return memsnap.choose(usable, not_before=not_before, not_after=not_after)
