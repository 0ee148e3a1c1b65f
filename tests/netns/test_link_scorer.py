"""LinkScorer (pure): a slow or lossy link shows as long heartbeat round trips on one node only."""

from __future__ import annotations

import random

import pytest

from workers.runtime.policy.stragglers import LinkScorer, StragglerScorer

pytestmark = [pytest.mark.unit]

NODES = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}


def _rtts(rng: random.Random, slow: str | None, slow_s: float = 1.5) -> dict[int, float]:
    return {r: (slow_s if n == slow else 0.02) + rng.uniform(0, 0.25) for r, n in NODES.items()}


def test_a_slow_link_is_flagged_as_a_link_straggler_within_one_window() -> None:
    rng = random.Random(1)
    sc = LinkScorer(NODES, window=5)
    found = []
    for step in range(10):
        found += sc.observe(step, _rtts(rng, "c" if step >= 5 else None))
    assert [(f.node, f.cause, f.ranks) for f in found] == [("c", "link", (4, 5))]
    assert found[0].score < 1 / 3 and found[0].to_dict()["cause"] == "link"


def test_poll_noise_and_one_slow_round_trip_trigger_nothing() -> None:
    rng = random.Random(2)
    sc = LinkScorer(NODES, window=5)
    found = []
    for step in range(30):
        rtts = _rtts(rng, None)
        if step == 7:
            rtts[2] = 2.0  # one retransmitted heartbeat
        found += sc.observe(step, rtts)
    assert found == []
    assert sc.observe(99, {0: 5.0, 1: 5.0}) == []  # one node alone: nothing to compare with


def test_a_slow_gpu_is_a_compute_straggler_and_not_a_link_one() -> None:
    rng = random.Random(3)
    links = LinkScorer(NODES, window=5)
    busy = StragglerScorer(NODES, {r: 0 for r in NODES}, window=5)
    by_cause = []
    for step in range(12):
        b = {r: (0.2 if n == "b" and step >= 3 else 0.1) * rng.uniform(0.98, 1.02) for r, n in NODES.items()}
        by_cause += [f.cause for f in busy.observe(step, b)]
        by_cause += [f.cause for f in links.observe(step, _rtts(rng, None))]
    assert by_cause and set(by_cause) == {"compute"}


def test_a_healed_partition_and_a_few_lossy_retransmits_steps_apart_are_not_persistent() -> None:
    """The flake of the spec-fault cluster job: on a fast job only disturbed steps bear heartbeats
    (they are sent after ``heartbeat_s`` of a running step). A 2 s partition stalls one step and a
    lossy link delays heartbeats in later ones; fast steps between come back with no round trip.
    When only heartbeat-bearing steps counted, steps 4, 7 and 11 made one window, all three slow: a
    link straggler at 0.1x, re-planned around. Every step counts now: one slow step per window."""
    sc = LinkScorer(NODES, window=3)
    slow = {0: 0.25, 1: 0.25, 2: 2.5, 3: 2.5, 4: 0.25, 5: 0.25}  # node b held up
    found = []
    for step in range(1, 13):
        found += sc.observe(step, slow if step in (4, 7, 11) else {})  # stall, retransmit, retransmit
    assert found == []
    assert sc.windows_closed == 4


def test_a_link_slow_on_every_step_is_flagged_within_two_windows_of_steps() -> None:
    sc = LinkScorer(NODES, window=3)
    slow = {0: 0.25, 1: 0.25, 2: 2.5, 3: 2.5, 4: 0.25, 5: 0.25}
    found: list = []
    for step in range(1, 9):
        found += sc.observe(step, slow if step >= 3 else {})  # capped from step 3 on
        if found:
            break
    assert [(f.node, f.cause, f.last_step) for f in found] == [("b", "link", 6)]
    assert found[0].score == pytest.approx(0.1)


def test_round_trips_timed_at_return_a_2_mbit_link_is_flagged_and_millisecond_jitter_is_not() -> None:
    """Timed at their return (``watchdog.gather``), healthy links read milliseconds: any jitter is 3x
    another node's, so the absolute floor (0.1 s) decides. The TP soak job's capped node read
    0.17-0.23 s against 4-6 ms."""
    rng = random.Random(5)
    sc = LinkScorer(NODES, window=3)
    found = []
    for step in range(1, 7):  # healthy: 2-60 ms, a node 10x another at times
        found += sc.observe(step, {r: rng.uniform(0.002, 0.06) for r in NODES})
    assert found == []
    for step in range(7, 10):  # node b capped
        found += sc.observe(step, {r: rng.uniform(0.17, 0.23) if n == "b" else rng.uniform(0.004, 0.006)
                                   for r, n in NODES.items()})
    assert [(f.node, f.cause, f.last_step) for f in found] == [("b", "link", 9)]
