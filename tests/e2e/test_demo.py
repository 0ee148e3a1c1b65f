"""README's first command, `orthoplex demo`, end to end (smaller than the default), with ``--keep``.

The demo process starts its own local Ray cluster and service (SQLite), two tenants submit over REST,
a node is killed, every job must succeed. With ``--keep`` the service and cluster stay up after the
summary: the printed URL and tenant token work (the tenant sees its own jobs only), and Ctrl-C
(SIGINT) stops everything: the demo exits 0, the API stops answering and no process of the demo's
Ray cluster is left.

The demo run is the session's one (``tests/fixtures/demo_stack.py``), which the browser tests drive
first (they sort before this file); this test stops it, so it must stay its last user.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.demo_stack import DemoStack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(f"{pid}: {cmd[:160]}")
    return out


@pytest.mark.timeout(900)
def test_demo_recovers_then_keep_serves_until_ctrl_c(demo: DemoStack) -> None:
    out = demo.output()
    assert "Ctrl-C stops everything" in out, out[-3000:]
    assert "demo finished: every job succeeded" in out, out[-3000:]
    assert "killing node" in out and "recovered in" in out, out[-3000:]
    # the replica-group phase: a group's node killed, the other kept stepping, a replacement joined
    assert "replica_dropped" in out and "replica_joined" in out, out[-3000:]
    assert "replica groups: one group lost, the other kept stepping" in out, out[-3000:]
    assert "Raylet is terminated" not in out  # Ray's driver error feed stays out of the demo's output
    url = re.search(r"API:\s+(http://127\.0\.0\.1:\d+)", out).group(1)  # type: ignore[union-attr]
    token = re.search(r"tenant 'product' token: (\S+)", out).group(1)  # type: ignore[union-attr]
    gcs = re.search(r"Ray address:\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    assert url == demo.api and token == demo.tenants["product"]["token"]

    # --keep: the service still answers, with the printed tenant token, and shows only that tenant's
    # jobs: the demo's (succeeded) and any the browser tests submitted as 'product'
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as c:
        assert c.get("/healthz").status_code == 200
        jobs = {j["id"]: j for j in c.get("/v1/jobs", params={"limit": 100}).json()["items"]}
    demo_jobs = demo.tenants["product"]["job_ids"]
    assert demo_jobs and all(jobs[i]["state"] == "SUCCEEDED" for i in demo_jobs), jobs
    other = set(demo.tenants) - {"product"}
    assert other and not any(i in jobs for t in other for i in demo.tenants[t]["job_ids"])
    assert _processes_mentioning(gcs), "the demo's Ray cluster is not up under --keep"

    # Ctrl-C stops the service and the cluster
    assert demo.stop() == 0, demo.output()[-3000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=3)
    deadline = time.monotonic() + 30
    while _processes_mentioning(gcs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_mentioning(gcs), _processes_mentioning(gcs)
    assert (demo.workdir / "loss.png").stat().st_size > 0
