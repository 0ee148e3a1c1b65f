"""``watchdog.gather`` on the shared Ray cluster: heartbeat round trips are timed at their return.

The link scorer tells a slow link from heartbeat round trips (0.1 s floor). Timed at the gather's
next 0.25 s poll, as they once were, a 1 ms and a 200 ms round trip both read 0.25-0.50 s, and a
node capped at 2 Mbit/s under TP traffic was never flagged (the TP slow-link soak job)."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.cluster


def test_heartbeat_round_trips_are_timed_at_their_return_and_one_still_out_counts_as_long(ray_cluster: Any) -> None:
    import ray

    from workers.runtime.cluster.watchdog import gather

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Rank:
        def __init__(self, heartbeat_s: float) -> None:
            self.heartbeat_s = heartbeat_s

        def step(self, seconds: float) -> float:
            time.sleep(seconds)
            return seconds

        def heartbeat(self) -> dict[str, Any]:
            time.sleep(self.heartbeat_s)
            return {}

    # answers at once, answers after 0.3 s (a queued link), answers after the step has ended
    ranks = [Rank.remote(0.0), Rank.remote(0.3), Rank.remote(5.0)]
    try:
        ray.get([r.step.remote(0.0) for r in ranks])  # started: no process start inside a round trip
        refs = {i: r.step.remote(1.5) for i, r in enumerate(ranks)}
        res = gather(refs, deadline_s=60.0, workers=ranks, heartbeat_s=0.2, heartbeat_timeout_s=30.0)
    finally:
        for r in ranks:
            ray.kill(r)
    assert res.ok, res
    assert res.hb_rtt[1] >= 0.3, res.hb_rtt  # the sleep is a lower bound
    # a poll-timed round trip reads at least one poll (0.25 s); a trivial actor call takes milliseconds
    assert res.hb_rtt[0] < 0.2 and res.hb_rtt[0] < res.hb_rtt[1] / 1.5, res.hb_rtt
    # sent at 0.2-0.45 s, still out when the step ended at 1.5 s: at least the time it was out
    assert res.hb_rtt[2] >= 1.0, res.hb_rtt
