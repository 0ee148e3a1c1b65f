"""Fault injection for tests and demos: kill a node, kill a rank's process, hang a rank, slow a node.

Never active in a normal run: a job spec may only carry ``"faults"`` when the supervisor was
started with ``enable_fault_injection=True`` (``launch.start_supervisor(..., enable_fault_injection=
True)``, used by tests, the benchmark and ``orthoplex run --kill-node-at-step``); otherwise the
supervisor refuses the spec. The control plane never sets the flag.

A fault fires once, before the given (global) step is launched. Targets are given by rank: the
fault hits the rank ``rank`` of the layout in force then (``-1`` is the last rank), or the node that
hosts it. ``slow_node`` makes every rank on that node do ``factor`` times its compute (it burns CPU
for ``factor - 1`` times the step's busy time); ``jitter_node`` adds a random 0..2*``amplitude``
extra (mean ``amplitude``), i.e. the few-percent noise that must trigger nothing. Both follow the
node across re-plans (they are properties of the node, not of an actor).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FAULT_KINDS: tuple[str, ...] = ("kill_node", "kill_rank", "hang_rank", "slow_node", "jitter_node")


class FaultInjectionDisabled(PermissionError):
    """A spec asked for faults but the supervisor was not started with the test hook enabled."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at_step: int
    rank: int = -1
    factor: float = 1.0
    amplitude: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        if self.at_step < 0:
            raise ValueError("fault at_step must be >= 0")
        if self.kind == "slow_node" and self.factor < 1.0:
            raise ValueError("slow_node factor must be >= 1")
        if self.kind == "jitter_node" and not 0.0 <= self.amplitude < 1.0:
            raise ValueError("jitter_node amplitude must be in [0, 1)")

    def target_rank(self, world_size: int) -> int:
        r = self.rank if self.rank >= 0 else world_size + self.rank
        if not 0 <= r < world_size:
            raise ValueError(f"fault targets rank {self.rank}, world has {world_size}")
        return r

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "at_step": self.at_step, "rank": self.rank, "factor": self.factor,
                "amplitude": self.amplitude}


def parse_faults(items: Iterable[dict[str, object]] | None) -> list[Fault]:
    out = []
    for item in items or ():
        data = dict(item)
        out.append(Fault(**data))  # type: ignore[arg-type]
    return sorted(out, key=lambda f: f.at_step)


class FaultPlan:
    """The faults still to fire; each fires once."""

    def __init__(self, faults: Iterable[Fault], *, enabled: bool) -> None:
        self._pending = list(faults)
        if self._pending and not enabled:
            raise FaultInjectionDisabled(
                "the job spec carries faults but fault injection is not enabled for this supervisor"
            )
        self.fired: list[Fault] = []

    def due(self, step: int) -> list[Fault]:
        now = [f for f in self._pending if f.at_step <= step]
        self._pending = [f for f in self._pending if f.at_step > step]
        self.fired.extend(now)
        return now

    @property
    def pending(self) -> list[Fault]:
        return list(self._pending)


def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (a slow rank computes, it does not sleep)."""
    import time

    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 1.0001
    while time.thread_time() < end:
        for _ in range(2000):
            x = x * 1.0000001 + 1e-9
