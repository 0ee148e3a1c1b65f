"""Goodput curves never stall the controller loop: they are computed off the loop, a round waits
for new ones at most ``wait_s``, and one curve's planning stops at its own time budget."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from service.controller.curves import CurveBook, goodput_curve

pytestmark = pytest.mark.unit


def _job(i: int) -> SimpleNamespace:
    return SimpleNamespace(id=i, min_gpus=1, max_gpus=4, spec={"model": "tiny", "global_batch": 4})


def test_a_slow_planner_does_not_block_the_round() -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow(job: SimpleNamespace) -> dict[int, float]:
        calls.append(job.id)
        release.wait(30)
        return {1: 1.0, 4: 3.0}

    book = CurveBook(slow, wait_s=0.05)
    curves: dict[int, dict[int, float] | None] = {}
    jobs = [_job(i) for i in range(100)]
    t0 = time.monotonic()
    book.update(jobs, curves)  # returns after its wait budget, not after 100 slow curves
    assert time.monotonic() - t0 < 10
    assert curves == {}  # nothing ready yet: the jobs scale linearly meanwhile
    release.set()
    deadline = time.monotonic() + 30
    while len(curves) < 100 and time.monotonic() < deadline:
        book.update(jobs, curves)
    assert len(curves) == 100 and curves[7] == {1: 1.0, 4: 3.0}
    assert sorted(calls) == list(range(100))  # each curve computed once
    book.update(jobs[:10], curves)  # ended jobs are forgotten
    assert sorted(curves) == list(range(10))
    book.close()


def test_one_curve_stops_at_its_budget() -> None:
    full = goodput_curve({"model": "tiny", "global_batch": 4}, 1, 64, gpu_type="CPU", gpus_per_node=4)
    cut = goodput_curve({"model": "tiny", "global_batch": 4}, 1, 64, gpu_type="CPU", gpus_per_node=4, budget_s=0.0)
    assert full is not None and len(full) > 1
    assert cut is not None and len(cut) == 1  # the first size only, then the budget was spent
