"""The recovery benchmark's common stall window (bench/recovery_replicas.py ``stall_window``, pure)."""

from __future__ import annotations

import pytest

from bench.recovery_replicas import stall_window


@pytest.mark.unit
def test_stall_window_is_the_survivors_gap_across_the_kill_not_the_start() -> None:
    # steps 0..9 one per second, but a 9 s start (0 -> 1) and a 4 s stall across the kill at 5.5
    ts = [0.0, 9.0, 10.0, 11.0, 12.0, 13.0, 17.0, 18.0, 19.0, 20.0]
    out = stall_window({"0": [[s, t] for s, t in enumerate(ts)]}, kill_ts=13.5, full_ts=18.0)
    assert out["stall_s"] == 4.0 and out["stall_ends_step"] == 6
    assert out["steady_step_s"] == 1.0  # the start's gaps and the window's gaps left out


@pytest.mark.unit
def test_stall_window_runs_to_the_end_when_never_back_and_takes_the_worst_survivor() -> None:
    a = [[s, float(s)] for s in range(8)]
    b = [[s, float(s) + (3.0 if s >= 7 else 0.0)] for s in range(8)]  # its last gap 3 s after the kill
    out = stall_window({"0": a, "1": b}, kill_ts=5.5, full_ts=None)
    assert out["stall_s"] == 4.0 and out["stall_ends_step"] == 7
