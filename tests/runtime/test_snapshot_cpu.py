"""bench/snapshot_cpu.py's accounting (pure): CPU seconds by process kind between start and stop,
processes born in between counted from zero, and the per-step on - off summary."""

from __future__ import annotations

import pytest

from bench.snapshot_cpu import CpuByKind, markdown, process_kind, summarize


@pytest.mark.unit
def test_process_kind_names_ray_and_orthoplex_processes() -> None:
    assert process_kind("ray::SnapshotHolder.put") == "SnapshotHolder"
    assert process_kind("ray::RankWorker.step") == "RankWorker"
    assert process_kind("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x") == "raylet"
    assert process_kind("bash -c sleep 1") == "other"


@pytest.mark.unit
def test_cpu_by_kind_adds_deltas_and_counts_new_processes_from_zero() -> None:
    readings = iter([
        {"1": ("ray::RankWorker", 10.0), "2": ("raylet", 5.0)},  # start
        {"1": ("ray::RankWorker", 12.5), "2": ("raylet", 5.5), "3": ("ray::SnapshotHolder", 0.4)},
        {"1": ("ray::RankWorker", 13.0), "3": ("ray::SnapshotHolder", 1.0)},  # 2 exited
    ])
    meter = CpuByKind(read=lambda: next(readings))
    meter._last = meter.read()  # start without the sampling thread
    meter.tick()
    meter.tick()
    assert meter.seconds == pytest.approx({"RankWorker": 3.0, "raylet": 0.5, "SnapshotHolder": 1.0})


@pytest.mark.unit
def test_summary_is_cpu_per_step_on_minus_off() -> None:
    runs = [{"snapshots": False, "steps": 40, "median_step_s": 1.0, "wall_s": 80.0,
             "cpu_s": {"RankWorker": 120.0, "raylet": 2.0}},
            {"snapshots": True, "steps": 40, "median_step_s": 1.1, "wall_s": 88.0,
             "cpu_s": {"RankWorker": 124.0, "raylet": 4.0, "SnapshotHolder": 4.0}}]
    s = summarize(runs)
    assert s["extra_cpu_s_per_step"] == pytest.approx({"RankWorker": 0.1, "raylet": 0.05, "SnapshotHolder": 0.1})
    assert s["extra_cpu_s_per_step_total"] == pytest.approx(0.25)
    assert s["median_step_on_over_off"] == pytest.approx(1.1)
    assert "0.250 CPU s per step" in markdown(runs)
