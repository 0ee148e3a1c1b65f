"""Checkpoint cadence from Young's interval, bounded by the job's settings.

Young (1974): the checkpoint interval that minimises expected lost work is
``T_c = sqrt(2 * T_f * T_s)`` with ``T_f`` the mean time between failures and ``T_s`` the time one
save takes. Both are *observed* here: ``T_s`` from the saves so far, ``T_f`` from the failures seen
in this job (with a prior from the job's settings, so a job without failures does not checkpoint
arbitrarily rarely). The interval in steps is ``T_c / step_time`` clamped to ``[min_steps, max_steps]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def young_interval_s(mtbf_s: float, save_s: float) -> float:
    """Young's optimal checkpoint interval in seconds."""
    if mtbf_s <= 0 or save_s < 0:
        raise ValueError(f"need mtbf_s > 0 and save_s >= 0, got {mtbf_s}, {save_s}")
    return math.sqrt(2.0 * mtbf_s * save_s)


@dataclass
class CheckpointCadence:
    """Decides when to save. ``min_steps``/``max_steps`` are the job's bounds (in steps)."""

    min_steps: int = 1
    max_steps: int = 100
    prior_mtbf_s: float = 3600.0
    default_save_s: float = 1.0
    elapsed_s: float = 0.0
    failures: int = 0
    _save_times: list[float] = field(default_factory=list)
    _step_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.min_steps < 1 or self.max_steps < self.min_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")

    def observe_step(self, seconds: float) -> None:
        self.elapsed_s += max(0.0, seconds)
        self._step_times = ([*self._step_times, seconds])[-50:]

    def observe_save(self, seconds: float) -> None:
        self._save_times = ([*self._save_times, seconds])[-10:]

    def observe_failure(self) -> None:
        self.failures += 1

    @property
    def mtbf_s(self) -> float:
        """Observed mean time between failures, smoothed by one prior failure-free period."""
        return (self.prior_mtbf_s + self.elapsed_s) / (1 + self.failures)

    @property
    def save_s(self) -> float:
        return _median(self._save_times) if self._save_times else self.default_save_s

    def interval_s(self) -> float:
        return young_interval_s(self.mtbf_s, self.save_s)

    def interval_steps(self) -> int:
        step_s = _median(self._step_times) if self._step_times else 0.0
        if step_s <= 0:
            return self.max_steps
        raw = round(self.interval_s() / step_s)
        return max(self.min_steps, min(self.max_steps, raw))

    def due(self, steps_since_save: int) -> bool:
        return steps_since_save >= self.interval_steps()

    def to_dict(self) -> dict[str, float | int]:
        return {
            "mtbf_s": round(self.mtbf_s, 3),
            "save_s": round(self.save_s, 4),
            "interval_s": round(self.interval_s(), 3),
            "interval_steps": self.interval_steps(),
            "min_steps": self.min_steps,
            "max_steps": self.max_steps,
        }


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
