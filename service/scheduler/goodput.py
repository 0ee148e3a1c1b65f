"""Goodput curves: a job's predicted throughput as a function of its GPU count.

The planner predicts tokens/s for the GPU counts a job could run on; the scheduler compares the
*marginal* gain of one more step of GPUs across jobs. Different models produce incomparable
tokens/s, so gains are normalised by the job's per-GPU throughput at its minimum size: a gain of
1.0 per GPU means "this GPU adds as much as each GPU does at the minimum" (linear scaling), 0.5 means
it adds half of that. Without a curve a job scales linearly (gain 1.0 for every GPU).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from service.scheduler.types import JobView


class Curve:
    """Sizes a job may take and its normalised throughput at each size."""

    __slots__ = ("_pts_n", "_pts_v", "_scale", "max", "min", "sizes")

    def __init__(self, job: JobView) -> None:
        self.min: int = job.min_gpus
        self.max: int = job.max_gpus if job.max_gpus is not None else job.min_gpus
        curve: Mapping[int, float] | None = job.throughput
        if curve:
            pts = sorted((int(n), float(v)) for n, v in curve.items() if n > 0)
            self._pts_n = [0] + [n for n, _ in pts]
            self._pts_v = [0.0] + [v for _, v in pts]
            inside = {n for n, _ in pts if self.min <= n <= self.max}
            self.sizes: list[int] | None = sorted(inside | {self.min, self.max})
        else:
            self._pts_n = []
            self._pts_v = []
            self.sizes = None
        base = self._raw(self.min) / self.min
        self._scale = 1.0 / base if base > 0 else 1.0

    def _raw(self, n: int) -> float:
        if not self._pts_n:
            return float(n)
        xs, ys = self._pts_n, self._pts_v
        if n >= xs[-1]:
            return ys[-1]  # no prediction beyond the last point: assume no further gain
        i = bisect.bisect_right(xs, n)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    def value(self, n: int) -> float:
        """Normalised throughput at ``n`` GPUs (``n`` per-GPU units under linear scaling)."""
        return self._raw(n) * self._scale if n > 0 else 0.0

    def next_size(self, n: int) -> int | None:
        """The smallest allowed size above ``n`` (``None`` at the maximum)."""
        if n >= self.max:
            return None
        if self.sizes is None:
            return max(n + 1, self.min)
        i = bisect.bisect_right(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def prev_size(self, n: int) -> int | None:
        """The largest allowed size below ``n`` and not below the minimum (``None`` at the minimum)."""
        if n <= self.min:
            return None
        if self.sizes is None:
            return min(n - 1, self.max)
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i - 1] if i > 0 else None

    def fit(self, n: int) -> int:
        """The largest allowed size <= ``n`` (at least the minimum)."""
        n = min(n, self.max)
        if n <= self.min:
            return self.min
        if self.sizes is None:
            return n
        return self.sizes[bisect.bisect_right(self.sizes, n) - 1]

    def gain(self, n: int) -> tuple[int, float] | None:
        """Growing from ``n``: (GPUs added, normalised gain per added GPU), or ``None`` at the max."""
        nxt = self.next_size(n)
        if nxt is None:
            return None
        return nxt - n, (self.value(nxt) - self.value(n)) / (nxt - n)

    def loss(self, n: int) -> tuple[int, float] | None:
        """Shrinking from ``n``: (GPUs released, normalised loss per released GPU), or ``None``."""
        prv = self.prev_size(n)
        if prv is None:
            return None
        return n - prv, (self.value(n) - self.value(prv)) / (n - prv)
