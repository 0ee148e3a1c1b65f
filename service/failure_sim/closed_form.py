"""The standard first-order model of effective training time and the optimal checkpoint intervals.

ETTR ≈ 1 − (R + C·M/τ + L)/M with restart time R, blocking save C, interval τ, mean time to failure
M and expected work lost per failure L (τ/2 when a failure rolls back to the last save). Young
(1974): τ* = √(2·C·M); Daly (2006): τ* = √(2·C·(M + R)).
"""

from __future__ import annotations

import math

from workers.runtime.policy.checkpoint_cadence import young_interval_s


def ettr(restart_s: float, save_s: float, interval_s: float, mttf_s: float, lost_s: float | None = None) -> float:
    """1 − (R + C·M/τ + L)/M, floored at 0; ``lost_s`` defaults to τ/2."""
    if mttf_s <= 0 or interval_s <= 0:
        raise ValueError(f"need mttf_s > 0 and interval_s > 0, got {mttf_s}, {interval_s}")
    if not math.isfinite(mttf_s):
        return 1.0 - save_s / (interval_s + save_s)
    lost = interval_s / 2.0 if lost_s is None else lost_s
    return max(0.0, 1.0 - (restart_s + save_s * mttf_s / interval_s + lost) / mttf_s)


def young(save_s: float, mttf_s: float) -> float:
    """Young's interval, from the same function the runtime's checkpoint cadence uses."""
    return young_interval_s(mttf_s, save_s)


def daly(save_s: float, mttf_s: float, restart_s: float) -> float:
    """Daly's first-order refinement: √(2·C·(M + R))."""
    return math.sqrt(2.0 * save_s * (mttf_s + restart_s))
