"""Job and attempt states: the one home of their names and of the sets built from them.

Pure Python (no torch, no Ray), so the database models, the scheduler, the controller, the runtime,
the CLI and the demo all import it. ``StrEnum`` members compare equal to their plain-string values,
so rows read from the database and dicts from the runtime need no conversion.

Job lifecycle (``TRANSITIONS`` below holds the legal edges; ``service.db.transitions`` enforces them)::

    PENDING -> ADMITTED -> RUNNING <-> RECOVERING -> SUCCEEDED | FAILED | CANCELLED
                              RUNNING -> PREEMPTED -> PENDING      (checkpoint, release, requeue)

A job's PREEMPTED is *not* terminal (the job is requeued); an attempt's PREEMPTED is (that
attempt is over).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


#: Ended for good: no transition leaves these.
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: Admitted and not ended: the job's allocation is in use and stays in use.
ACTIVE = frozenset({JobState.ADMITTED, JobState.RUNNING, JobState.RECOVERING})
#: Waiting for GPUs.
QUEUED = frozenset({JobState.PENDING})
#: Checkpointing after a preemption: its GPUs are still held but are being released.
RELEASING = frozenset({JobState.PREEMPTED})
#: Holding GPUs (in use or being released): what the scheduler's snapshot counts as allocated.
HOLDING = ACTIVE | RELEASING
#: Not ended.
NON_TERMINAL = frozenset(JobState) - TERMINAL

#: The legal edges of a job's lifecycle: from a state, the states a transition may go to.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.ADMITTED, JobState.CANCELLED}),
    JobState.ADMITTED: frozenset({JobState.RUNNING, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {JobState.RECOVERING, JobState.PREEMPTED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RECOVERING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
    JobState.PREEMPTED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class AttemptState(StrEnum):
    """One attempt (one JobSupervisor actor) of a job."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"


#: An attempt in one of these is over (a preempted attempt is over; its job is requeued).
ATTEMPT_TERMINAL = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED, AttemptState.PREEMPTED, AttemptState.LOST}
)
