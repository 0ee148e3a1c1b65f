"""The CI-sized chaos soak over network namespaces (the 10-minute one is ``orthoplex bench netchaos``):
90 s of random partitions, partial partitions, bandwidth caps, packet loss and delays on the job's nodes
every 10-20 s; the job finishes, no step is lost or run twice beyond the resumes, the loss matches
the single-process run within 1 %, and nothing is left behind."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.soak]


@pytest.mark.timeout(1500)
def test_job_survives_90_s_of_random_network_faults() -> None:
    from bench.netchaos import soak
    from tests.fixtures.netns_cluster import _require_netns

    _require_netns()
    r = soak(90.0, (10.0, 20.0), seed=7)
    print({k: r.get(k) for k in ("faults", "events", "recovery_s", "steps", "steps_redone")})
    assert r["faults"], "no fault fired"
    assert r["ok"], r["problems"]
