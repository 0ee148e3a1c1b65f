"""The attempt machine's state: its phases, the transitions it reports, why a gang ends (``Switch``),
one pass from tear-down to the next gang's first step (``Cycle``) and one gang's run (``Run``).

Shared by the attempt machine (``attempt_machine``) and its replica-group phases (``replica_attempt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from workers.runtime.cluster.gang import Gang
from workers.runtime.cluster.placement_groups import Reservation
from workers.runtime.cluster.watchdog import Failure
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.stragglers import LinkScorer, StragglerScorer
from workers.states import AttemptState


class JobFailed(RuntimeError):
    pass


class Phase(StrEnum):
    PLAN = "PLAN"  # tear down the gang that ended, choose the next plan
    WAIT = "WAIT"  # too few GPUs free: wait for some (cancel and preempt end the wait)
    PLACE = "PLACE"  # reserve the plan's GPUs (a timeout tries a smaller plan)
    START = "START"  # start the gang and restore the newest checkpoint
    TRAIN = "TRAIN"  # one step per call (and checkpoints, resizes, stragglers, grows between steps)
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"


ENDS: dict[Phase, AttemptState] = {
    Phase.FINISHED: AttemptState.SUCCEEDED,
    Phase.FAILED: AttemptState.FAILED,
    Phase.CANCELLED: AttemptState.CANCELLED,
    Phase.PREEMPTED: AttemptState.PREEMPTED,
}


@dataclass(frozen=True)
class Transition:
    source: Phase
    target: Phase
    reason: str = ""


@dataclass
class Switch:
    """Why the current gang ends before the job does."""

    kind: str  # failure | straggler | grow | resize | drain | finished | cancelled | preempted
    failure: Failure | None = None
    change: planner_bridge.ClusterChange | None = None
    replan: Any = None  # decided already (straggler, grow, resize): the planner's Replan
    detect_s: float = 0.0
    plan_s: float = 0.0  # planner time already spent deciding the switch

    @property
    def cause(self) -> str:
        return self.failure.kind if self.failure else self.kind


@dataclass
class Cycle:
    """Timings of one pass from tear-down to the first step of the next gang."""

    t_down: float
    t_plan: float = 0.0
    teardown_s: float = 0.0
    give_up: float = 0.0  # waiting for GPUs ends in failure after this (monotonic)
    waiting: bool = False
    place_give_up: float | None = None
    t_place: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    plan: Any = None
    replan: Any = None
    reservation: Reservation | None = None


@dataclass
class Run:
    """One gang's training run."""

    gang: Gang
    scorer: StragglerScorer
    step: int
    links: LinkScorer | None = None  # slow or lossy links, from heartbeat round trips
    walls: list[float] = field(default_factory=list)
    since_save: int = 0
    recovery: dict[str, Any] | None = None  # the switch being timed, until its first step
    last_groups: set[int] = field(default_factory=set)  # replica groups: those the last attempt ran on
