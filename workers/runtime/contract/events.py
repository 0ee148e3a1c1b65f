"""The runtime's events: one typed dataclass per event type, and the supervisor's append-only log.

This module is the one home of the runtime → control-plane event contract (``docs/contracts.md``).
The supervisor emits instances of these classes; the wire form (what ``events(since)`` returns, the
JSONL sink, the ``events`` table's payload) is ``to_dict()``: ``{"seq", "ts", "type", "reason",
...fields}``. The control plane reads it back with :func:`event_from_dict`, which refuses an unknown
type, a missing field, an unknown field and a field of the wrong type, so both sides agree on one
shape and nobody guesses keys. Pure Python: the service imports it without Ray or torch.

The control plane *pulls* events with ``since(seq)``, so a supervisor keeps training while the
service is down and the service catches up later.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from workers.states import AttemptState

RECOVERY_PHASES: tuple[str, ...] = ("detect", "plan", "place", "start", "load", "first_step")

_ENVELOPE = ("seq", "ts", "type")

#: where a resumed gang's state came from (``resumed.source``)
RestoreSource = typing.Literal["memory", "storage"]


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every runtime event: ``reason`` (human text), ``seq`` and ``ts`` (set by the log)."""

    type: ClassVar[str] = ""
    reason: str = ""
    seq: int = 0
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``seq``, ``ts``, ``type``, ``reason`` and the event's own fields."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _ENVELOPE}
        return {"seq": self.seq, "ts": self.ts, "type": self.type, **body}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """The event ``data`` describes, checked against this class (``ValueError`` naming the field)."""
        kind = data.get("type", cls.type)
        if kind != cls.type:
            raise ValueError(f"event type {kind!r} is not {cls.type!r}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - {"type"})
        if unknown:
            raise ValueError(f"{cls.type} event: unknown field(s) {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"{cls.type} event: field {f.name!r} missing")
                continue
            value = data[f.name]
            if not _conforms(value, hints[f.name]):
                raise ValueError(f"{cls.type} event: field {f.name!r} = {value!r} is not {hints[f.name]}")
            kwargs[f.name] = float(value) if hints[f.name] is float else value
        return cls(**kwargs)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON-shaped ``value`` fits the type hint ``hint`` (the hints used below only)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list | tuple) and all(_conforms(v, item) for v in value)
    if origin is dict:
        key, val = typing.get_args(hint) or (Any, Any)
        return isinstance(value, dict) and all(_conforms(k, key) and _conforms(v, val) for k, v in value.items())
    return isinstance(value, hint)


EVENTS: dict[str, type[Event]] = {}


def _register(cls: type[Event]) -> type[Event]:
    if not cls.type or cls.type in EVENTS:
        raise TypeError(f"event class {cls.__name__} needs a unique type, has {cls.type!r}")
    EVENTS[cls.type] = cls
    return cls


def event_from_dict(data: dict[str, Any]) -> Event:
    """The typed event of a wire dict (``ValueError`` for an unknown type or a malformed body)."""
    kind = data.get("type")
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    return cls.from_dict(data)


# ---------------------------------------------------------------------------------- plan and place
@dataclass(frozen=True)
class PlanInForce:
    """The plan an attempt runs from now on (what the control plane stores on the attempt row)."""

    layout: dict[str, Any]
    short: str
    nodes: list[str]
    predicted_tokens_per_s: float
    num_gpus: int | None = None
    predicted_step_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@_register
@dataclass(frozen=True, kw_only=True)
class PlanChosen(Event):
    type: ClassVar[str] = "plan"
    layout: dict[str, Any]
    short: str
    num_gpus: int
    nodes: list[str]
    predicted_tokens_per_s: float
    predicted_step_time_s: float
    # a goodput-aware plan's (the job gave duration_days): expected ETTR and its recovery settings
    ettr: float | None = None
    recovery: dict[str, Any] | None = None

    def in_force(self) -> PlanInForce:
        return PlanInForce(self.layout, self.short, list(self.nodes), self.predicted_tokens_per_s,
                           self.num_gpus, self.predicted_step_time_s)


@_register
@dataclass(frozen=True, kw_only=True)
class Replanned(Event):
    """The planner's answer to a cluster change; ``decision == "keep"`` leaves the plan in force."""

    type: ClassVar[str] = "replan"
    decision: str
    old: dict[str, Any]
    new: dict[str, Any]
    old_short: str
    new_short: str
    old_tokens_per_s: float
    new_tokens_per_s: float
    switch_cost_s: float
    change: dict[str, Any]
    nodes: list[str]

    def in_force(self) -> PlanInForce | None:
        if self.decision == "keep":
            return None
        return PlanInForce(self.new, self.new_short, list(self.nodes), self.new_tokens_per_s)


@_register
@dataclass(frozen=True, kw_only=True)
class Placed(Event):
    """The gang's placement group is ready: its name and the GPUs it holds on each node. ``group``:
    a replica group's own placement (one group of the job's; the control plane keeps counting the
    job's grant, every group's GPUs), None for the whole gang's."""

    type: ClassVar[str] = "placed"
    gpus: int
    placement_group: str
    gpus_per_node: dict[str, int]
    bundle_nodes: list[str]
    seconds: float
    strategy: str
    group: int | None = None
    #: on the last group placed at an attempt's start: every group's GPUs per node (the job's
    #: placement, as :attr:`ReplicaDropped.job_placement`)
    job_placement: dict[str, int] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class PlacementTimeout(Event):
    type: ClassVar[str] = "placement_timeout"
    gpus: int


@_register
@dataclass(frozen=True, kw_only=True)
class RanksMapped(Event):
    type: ClassVar[str] = "ranks_mapped"
    layout: dict[str, Any]
    rank_to_bundle: list[int]
    rank_to_node: list[str]
    method: str
    spanning: dict[str, list[list[int]]]


@_register
@dataclass(frozen=True, kw_only=True)
class Started(Event):
    type: ClassVar[str] = "started"
    actors_s: float
    setup_s: float
    backend: str
    warm_ranks: int = 0  # ranks taken from the node's pool of pre-started actors (warm_pool)
    warm_rank_rss_mb: float | None = None  # host memory of an idle warm rank (median of those taken; None: none)


# ---------------------------------------------------------------------------------- training
@_register
@dataclass(frozen=True, kw_only=True)
class StepDone(Event):
    """One optimizer step done; ``step`` counts the steps completed (1-based, as a checkpoint does)."""

    type: ClassVar[str] = "step"
    step: int
    loss: float
    wall_s: float
    busy_max_s: float
    world_size: int
    tokens_per_s: float
    val_loss: float | None = None  # on the steps the job evaluates (eval_every, and the last)
    #: the longest any rank's step waited for its in-memory snapshot (copy to host memory, and the
    #: previous snapshot's push if still in flight); the push itself runs in the background. None
    #: when snapshots are off.
    snapshot_s: float | None = None
    #: on a step that took a snapshot: how long the *previous* snapshot's background push took, on
    #: the slowest rank (a push longer than the steps between two snapshots holds the next one up).
    #: None when the step took none, or it is the gang's first.
    snapshot_push_s: float | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    type: ClassVar[str] = "checkpoint"
    step: int
    path: str
    seconds: float
    bytes: int
    next_interval_steps: int
    cadence: dict[str, Any]


# ---------------------------------------------------------------------------------- failures
@_register
@dataclass(frozen=True, kw_only=True)
class NodeLost(Event):
    type: ClassVar[str] = "node_lost"
    nodes: list[str]
    ranks: list[int]
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class ReplicaDropped(Event):
    """Replica group ``group`` (runtime option ``replica_groups``) left the job in step ``step`` (1-based:
    the step being run). ``cause``: ``lost`` (a node died in it: the other groups redo that step
    without it), ``drain`` or ``shrink`` (dropped at a step boundary: nothing is redone)."""

    type: ClassVar[str] = "replica_dropped"
    group: int
    nodes: list[str]
    step: int
    groups_left: int
    cause: typing.Literal["lost", "drain", "shrink"] = "lost"
    #: the GPUs of every group the job wants after this event (live and starting): what the control
    #: plane counts as the job's allocation (a shrink lowers it; a loss or a drain, replaced, does not)
    job_gpus: int | None = None
    #: where the job's GPUs are after this event, per node: every live group's and every starting
    #: replacement's (the control plane's record of the job's placement; a lost group's replacement
    #: counts once it is placed)
    job_placement: dict[str, int] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class ReplicaJoined(Event):
    """A replacement replica group committed its first step after taking the state (parameters,
    optimizer, RNG, data position) from a live group over the network (``source: "peer"``; no
    storage read). ``seconds``: from the start of the replacement to that step; ``step`` (1-based)."""

    type: ClassVar[str] = "replica_joined"
    group: int
    source: typing.Literal["peer"] = "peer"
    seconds: float
    step: int
    from_group: int
    nodes: list[str]
    groups: int
    #: as :attr:`ReplicaDropped.job_gpus` (a grow's new group raises it)
    job_gpus: int | None = None
    #: as :attr:`ReplicaDropped.job_placement`
    job_placement: dict[str, int] | None = None


@_register
@dataclass(frozen=True, kw_only=True)
class Drained(Event):
    """The job moved off ``nodes`` (an operator's drain notice: ``POST /v1/cluster/nodes/{node}/drain``)
    at the step boundary after step ``step`` (1-based), with no step redone: ``how`` is ``replan`` (one
    gang: a memory snapshot of that step, re-planned without the nodes, restored from ``source``) or
    ``replica_groups`` (the nodes' groups dropped while the others kept stepping; ``groups``; their
    replacements heal from a live peer: ``replica_joined``). ``seconds``: from the notice to off the
    nodes; ``deadline_s``: the notice's deadline."""

    type: ClassVar[str] = "drained"
    nodes: list[str]
    step: int
    how: typing.Literal["replan", "replica_groups"]
    source: RestoreSource | typing.Literal["peer"]
    groups: list[int] = dataclasses.field(default_factory=list)
    seconds: float
    deadline_s: float


@_register
@dataclass(frozen=True, kw_only=True)
class RankFailed(Event):
    type: ClassVar[str] = "rank_failed"
    ranks: list[int]
    nodes: list[str]
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class Hang(Event):
    type: ClassVar[str] = "hang"
    ranks: list[int]
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class StragglerFound(Event):
    type: ClassVar[str] = "straggler"
    step: int
    node: str
    score: float
    window: int
    steps: list[int]
    ranks: list[int]
    cause: str = "compute"  # "compute" (busy time) or "link" (heartbeat round trips: a slow or lossy link)


@_register
@dataclass(frozen=True, kw_only=True)
class NodeExcluded(Event):
    type: ClassVar[str] = "node_excluded"
    node: str
    deaths: int
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class PeerUnreachable(Event):
    """Some node pairs of the gang cannot connect while every node answers the head (a partition from
    some peers only): ``nodes`` are left out (declared lost next), ``pairs`` the cut pairs."""

    type: ClassVar[str] = "peer_unreachable"
    nodes: list[str]
    pairs: list[list[str]]
    probe_s: float
    step: int


# ---------------------------------------------------------------------------------- resize / wait
@_register
@dataclass(frozen=True, kw_only=True)
class ResizeRequested(Event):
    type: ClassVar[str] = "resize_requested"
    gpus: int
    world_size: int


@_register
@dataclass(frozen=True, kw_only=True)
class ResizeRefused(Event):
    type: ClassVar[str] = "resize_refused"
    gpus: int
    world_size: int
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class WaitingForGpus(Event):
    type: ClassVar[str] = "waiting_for_gpus"
    step: int
    max_gpus: int | None
    min_gpus: int


# ---------------------------------------------------------------------------------- recovery
@_register
@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    type: ClassVar[str] = "resumed"
    from_step: int
    cause: str
    layout: dict[str, Any]
    short: str
    world_size: int
    steps_redone: int
    source: RestoreSource = "storage"  # where the state came from: snapshots in peers' memory, or storage


@_register
@dataclass(frozen=True, kw_only=True)
class Recovered(Event):
    """How long a switch took, per phase (:data:`RECOVERY_PHASES`), and in total."""

    type: ClassVar[str] = "recovery"
    cause: str
    phases: dict[str, float]
    total_s: float
    teardown_s: float

    @classmethod
    def of(cls, phases: dict[str, float], cause: str, teardown_s: float, reason: str = "") -> Recovered:
        """From every phase's seconds (all of :data:`RECOVERY_PHASES` required); sums them."""
        missing = [p for p in RECOVERY_PHASES if p not in phases]
        if missing:
            raise ValueError(f"recovery phases missing: {', '.join(missing)}")
        clean = {p: round(float(phases[p]), 4) for p in RECOVERY_PHASES}
        total = round(sum(clean.values()), 4)
        return cls(reason=reason or f"recovered from {cause} in {total:.2f}s", cause=cause, phases=clean,
                   total_s=total, teardown_s=round(float(teardown_s), 4))


@_register
@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    """Emitted by the fault-injection wrapper of the cluster port (tests, demo, benchmarks) only."""

    type: ClassVar[str] = "fault_injected"
    step: int
    node: str
    ranks: list[int]
    kind: str
    at_step: int
    factor: float
    amplitude: float
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # the kind's own parameters (fault_spec.PARAMS)


# ---------------------------------------------------------------------------------- endings
@dataclass(frozen=True, kw_only=True)
class Ending(Event):
    """An event that ends the attempt; ``outcome`` is the attempt's final state."""

    outcome: ClassVar[AttemptState]


@_register
@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    type: ClassVar[str] = "finished"
    outcome: ClassVar[AttemptState] = AttemptState.SUCCEEDED
    final_step: int  # steps completed (the job's ``steps``)
    final_loss: float | None
    failures: int
    recoveries: int


@_register
@dataclass(frozen=True, kw_only=True)
class Failed(Event):
    type: ClassVar[str] = "failed"
    outcome: ClassVar[AttemptState] = AttemptState.FAILED
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class Cancelled(Event):
    type: ClassVar[str] = "cancelled"
    outcome: ClassVar[AttemptState] = AttemptState.CANCELLED
    step: int


@_register
@dataclass(frozen=True, kw_only=True)
class Preempted(Event):
    type: ClassVar[str] = "preempted"
    outcome: ClassVar[AttemptState] = AttemptState.PREEMPTED
    checkpoint_step: int


#: event classes by role, for the control plane (``service.controller.events_pull``)
FAILURES: tuple[type[Event], ...] = (NodeLost, RankFailed, Hang)
#: an admitted attempt is under way
PROGRESS: tuple[type[Event], ...] = (StepDone, Resumed, Started, Placed, RanksMapped)
#: training goes on after a recovery (a new attempt has no ``resumed``: its first step)
RESUMING: tuple[type[Event], ...] = (StepDone, Resumed)
ENDINGS: tuple[type[Event], ...] = (Finished, Failed, Cancelled, Preempted)
EVENT_TYPES: frozenset[str] = frozenset(EVENTS)


class EventLog:
    """Append-only, thread-safe list of events with monotonically increasing ``seq`` (from 1)."""

    def __init__(self, sink: str | Path | None = None, *, clock: Any = time.time) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._clock = clock
        self._sink = Path(sink) if sink else None
        if self._sink is not None:
            self._sink.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: Event) -> Event:
        """Record one event (stamped with ``seq`` and ``ts``); only registered event classes, and only
        when its wire form reads back as the same event (so the control plane can never be handed
        what it would refuse: a wrong field type fails here, in the runtime, at once)."""
        if EVENTS.get(event.type) is not type(event):
            raise TypeError(f"not a registered event: {type(event).__name__}")
        with self._lock:
            stamped = dataclasses.replace(event, seq=len(self._events) + 1, ts=round(self._clock(), 6))
            wire = stamped.to_dict()
            type(event).from_dict(wire)  # ValueError naming the field that does not fit its type
            self._events.append(wire)
            if self._sink is not None:
                with self._sink.open("a") as f:
                    f.write(json.dumps(wire, default=str) + "\n")
        return stamped

    def since(self, seq: int = 0) -> list[dict[str, Any]]:
        """Events with ``seq > seq`` in wire form (copies), oldest first."""
        with self._lock:
            return [dict(e) for e in self._events[max(0, int(seq)) :]]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return len(self._events)
