"""Fault injection for tests, the demo and the benchmarks: kill a node, kill a rank's process, hang a
rank, slow a node.

:class:`FaultInjector` wraps the supervisor's cluster port (``workers.runtime.cluster.port``): it
fires the due faults when a step is gathered and re-arms node properties on every new gang, so the
supervisor's own loop has no fault code. Never active in a normal run: a job spec may only carry
``"faults"`` when the supervisor was started with ``enable_fault_injection=True``
(``launch.start_supervisor(..., enable_fault_injection=True)``, used by tests, the benchmark and
``orthoplex run --kill-node-at-step``); otherwise the supervisor refuses the spec. The control plane
never sets the flag.

A fault fires once, before the given (global) step is launched. Targets are given by rank: the
fault hits the rank ``rank`` of the layout in force then (``-1`` is the last rank), or the node that
hosts it. ``slow_node`` makes every rank on that node do ``factor`` times its compute (it burns CPU
for ``factor - 1`` times the step's busy time); ``jitter_node`` adds a random 0..2*``amplitude``
extra (mean ``amplitude``), i.e. the few-percent noise that must trigger nothing. Both follow the
node across re-plans (they are properties of the node, not of an actor). ``drop_snapshots`` kills
the job's snapshot holders (both in-memory copies of every shard are gone: the next restore reads
storage). ``kill_replacement`` (replica groups) kills the node of the next replica group started once
step ``at_step`` was launched (a replacement), in the middle of its first step: after it healed from a
peer and ran its backward pass, before the cross-group reduction, i.e. before its ``replica_joined``.
The ``net_*`` kinds (partition, delay, rate cap, loss, heal of a node's link) run through
:mod:`workers.testbed.network_fault_injector` and need a namespaced cluster: on any other the injector, and so
the supervisor, is refused when made. The kinds, their parameters and their validation live in
:mod:`workers.runtime.contract.fault_spec`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from workers.runtime.cluster.gang import Gang
from workers.runtime.cluster.placement_groups import NodeCapacity, Reservation
from workers.runtime.cluster.port import ClusterPort, RankCall
from workers.runtime.cluster.watchdog import Failure, GatherResult
from workers.runtime.contract import events as ev
from workers.runtime.contract.fault_spec import FAULT_KINDS, NET_SPEC_KINDS, ON_START, Fault, parse_faults
from workers.runtime.recovery.memory_snapshots import Choice

__all__ = ["FAULT_KINDS", "NET_SPEC_KINDS", "Fault", "FaultInjectionDisabled", "FaultInjector", "FaultPlan",
           "parse_faults"]


class FaultInjectionDisabled(PermissionError):
    """A spec asked for faults but the supervisor was not started with the test hook enabled."""


class FaultPlan:
    """The faults still to fire; each fires once."""

    def __init__(self, faults: Iterable[Fault], *, enabled: bool) -> None:
        self._pending = list(faults)
        if self._pending and not enabled:
            raise FaultInjectionDisabled(
                "the job spec carries faults but fault injection is not enabled for this supervisor"
            )
        self.fired: list[Fault] = []

    def due(self, step: int, *, on_start: bool = False) -> list[Fault]:
        """The faults due at ``step``: those fired before a step is launched, or (``on_start``) those
        fired when a gang starts."""
        now = [f for f in self._pending if f.at_step <= step and (f.kind in ON_START) == on_start]
        self._pending = [f for f in self._pending if f not in now]
        self.fired.extend(now)
        return now

    @property
    def pending(self) -> list[Fault]:
        return list(self._pending)


class InjectablePort(ClusterPort, Protocol):
    def inject(self, gang: Gang, ranks: Sequence[int], kind: str, value: float = 0.0, *,
               wait: bool = False) -> None:
        """Arm ``kind`` (``slow``, ``jitter``, ``hang``, ``exit``, ``kill_node``) on ``ranks``."""
        ...

    def drop_snapshots(self) -> None:
        """Lose every in-memory snapshot copy (both copies of every shard)."""
        ...


class FaultInjector:
    """A cluster port that fires ``plan``'s faults into the port it wraps, before the step they name.

    Node slowness and jitter are properties of the node: re-armed on every gang started there."""

    def __init__(self, inner: InjectablePort, plan: FaultPlan, log: ev.EventLog, *, settle_s: float = 0.2) -> None:
        self.inner = inner
        self.plan = plan
        self.log = log
        self.settle_s = settle_s  # after kill_node: let the node die before the step is launched onto it
        self.node_faults: dict[str, tuple[str, float]] = {}  # node -> ("slow"|"jitter", value)
        self.last_step: int | None = None  # the last step launched (``kill_replacement`` counts from it)
        net_kinds = [f.kind for f in plan.pending if f.network]
        self.net = None
        if net_kinds:
            from workers.testbed.network_fault_injector import SpecNetFaults

            self.net = SpecNetFaults.discover(net_kinds)

    def nodes(self, *, exclude: Iterable[str] = (), held: Mapping[str, int] | None = None) -> list[NodeCapacity]:
        return self.inner.nodes(exclude=exclude, held=held)

    def reserve(self, gpus: int, *, nodes: Sequence[str], name: str,
                per_node: Mapping[str, int] | None = None) -> Reservation | None:
        return self.inner.reserve(gpus, nodes=nodes, name=name, per_node=per_node)

    def release(self, reservation: Reservation) -> None:
        self.inner.release(reservation)

    def start_gang(self, plan: Any, reservation: Reservation, *, on_created: Callable[[Gang], None]) -> Gang:
        gang = self.inner.start_gang(plan, reservation, on_created=on_created)
        for node, (kind, value) in self.node_faults.items():
            self.inner.inject(gang, gang.rank_map.ranks_on(node), kind, value)
        if self.last_step is not None and getattr(plan, "replica_group", None) is not None:
            for f in self.plan.due(self.last_step, on_start=True):  # kill_replacement: in its first step
                rank = f.target_rank(gang.world_size)
                self.inner.inject(gang, [rank], "kill_node", wait=True)
                self.log.emit(ev.FaultInjected(reason=f"test hook: {f.kind} (replica group "
                                               f"{getattr(plan, 'replica_group', '?')}, in its first step)",
                                               step=self.last_step, node=gang.rank_nodes[rank], ranks=[rank],
                                               kind=f.kind, at_step=f.at_step, factor=f.factor,
                                               amplitude=f.amplitude))
        return gang

    def gather(self, gang: Gang, call: RankCall, *, deadline_s: float, step: int | None = None,
               kwargs: dict[str, Any] | None = None) -> GatherResult:
        if call == "step" and step is not None:
            self.last_step = step
            self._fire(gang, step)
        return self.inner.gather(gang, call, deadline_s=deadline_s, step=step, kwargs=kwargs)

    def classify(self, result: GatherResult, gang: Gang, what: str) -> Failure:
        return self.inner.classify(result, gang, what)

    def teardown(self, gang: Gang | None, *, graceful: bool = False) -> float:
        return self.inner.teardown(gang, graceful=graceful)

    def snapshots(self) -> dict[str, list[dict[str, Any]]]:
        return self.inner.snapshots()

    def restore(self, gang: Gang, choice: Choice | None, *, deadline_s: float) -> GatherResult:
        return self.inner.restore(gang, choice, deadline_s=deadline_s)

    def forget_replicas(self, groups: Sequence[int]) -> None:
        self.inner.forget_replicas(groups)

    def refill_pool(self) -> int:
        return self.inner.refill_pool()

    def close(self) -> None:
        try:
            if self.net is not None:
                self.net.close()  # every link healed: the cluster outlives the job
        finally:
            self.inner.close()

    def _fire(self, gang: Gang, step: int) -> None:
        for f in self.plan.due(step):
            rank = f.target_rank(gang.world_size)
            node = gang.rank_nodes[rank]
            targets: list[int] = [rank]
            if f.kind == "kill_node":
                self.inner.inject(gang, [rank], "kill_node")
            elif f.kind == "kill_rank":
                self.inner.inject(gang, [rank], "exit")
            elif f.kind == "hang_rank":
                self.inner.inject(gang, [rank], "hang", wait=True)
            elif f.kind == "drop_snapshots":
                targets = []
                self.inner.drop_snapshots()
            elif f.network:
                assert self.net is not None
                targets = gang.rank_map.ranks_on(node)
                peers = [gang.rank_nodes[p] for p in f.peer_ranks(gang.world_size)]
                self.net.fire(f, node, peers, on_heal=lambda name, kind, s=step, n=node, t=targets: self.log.emit(
                    ev.FaultInjected(reason=f"test hook: {kind or 'every fault'} of {name}'s link healed after "
                                     f"its duration", step=s, node=n, ranks=t, kind="net_heal", at_step=s,
                                     factor=1.0, amplitude=0.0, params={"what": kind})))
            else:
                kind, value = ("slow", f.factor) if f.kind == "slow_node" else ("jitter", f.amplitude)
                self.node_faults[node] = (kind, value)
                targets = gang.rank_map.ranks_on(node)
                self.inner.inject(gang, targets, kind, value, wait=True)
            self.log.emit(ev.FaultInjected(reason=f"test hook: {f.kind} before step {step}", step=step, node=node,
                                           ranks=targets, kind=f.kind, at_step=f.at_step, factor=f.factor,
                                           amplitude=f.amplitude, params=f.params()))
            # a replica group's rank dies in the middle of the step launched next (after its backward
            # pass): nothing is launched onto a dead node, so there is nothing to let settle
            replica = getattr(gang.plan, "replica_group", None) is not None
            if f.kind == "kill_node" and self.settle_s > 0 and not replica:
                time.sleep(self.settle_s)
