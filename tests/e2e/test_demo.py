"""README's first command, `orthoplex demo`, end to end (smaller than the default), with ``--keep``.

The demo process starts its own local Ray cluster and service (SQLite), two tenants submit over REST,
a node is killed, every job must succeed. With ``--keep`` the service and cluster stay up after the
summary: the printed URL and tenant token work (the tenant sees its own job only), and Ctrl-C
(SIGINT) stops everything: the demo exits 0, the API stops answering and no process of the demo's
Ray cluster is left.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.controller.helpers import REPO

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
def test_demo_recovers_then_keep_serves_until_ctrl_c(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    env.pop("ORTHOPLEX_DATABASE_URL", None)
    args = [sys.executable, "-m", "service.cli", "demo", "--gpus-per-node", "2", "--steps", "16",
            "--kill-at-step", "6", "--keep", "--workdir", str(tmp_path)]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def read_until(marker: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                assert proc.poll() is None, "demo exited early:\n" + "".join(seen[-60:])
                continue
            seen.append(line)
            if marker in line:
                return "".join(seen)
        raise AssertionError(f"no {marker!r} within {timeout_s:.0f}s:\n" + "".join(seen[-60:]))

    try:
        out = read_until("Ctrl-C stops everything", 800)
        assert "demo finished: every job succeeded" in out, out[-3000:]
        assert "killing node" in out and "recovered in" in out, out[-3000:]
        assert "Raylet is terminated" not in out  # Ray's driver error feed stays out of the demo's output
        url = re.search(r"API:\s+(http://127\.0\.0\.1:\d+)", out).group(1)  # type: ignore[union-attr]
        token = re.search(r"tenant 'product' token: (\S+)", out).group(1)  # type: ignore[union-attr]
        gcs = re.search(r"Ray address:\s+(\S+)", out).group(1)  # type: ignore[union-attr]

        # --keep: the service still answers, with the printed tenant token, and shows only that tenant's job
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
            jobs = c.get("/v1/jobs").json()["items"]
            assert [(j["name"].split("-")[0], j["state"]) for j in jobs] == [("product", "SUCCEEDED")], jobs
        assert _processes_mentioning(gcs), "the demo's Ray cluster is not up under --keep"

        # Ctrl-C stops the service and the cluster
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, "".join(seen[-40:])
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/healthz", timeout=3)
        deadline = time.monotonic() + 30
        while _processes_mentioning(gcs) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_mentioning(gcs), _processes_mentioning(gcs)
        assert (tmp_path / "loss.png").stat().st_size > 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
