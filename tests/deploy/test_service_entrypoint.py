"""The image's service command, ``deploy/image/orthoplex-service``, against a real Ray head on
loopback (what the Deployment and compose.yaml run): started before the head, it waits for it
and says so; then it joins the cluster as a Ray node with no CPUs
and no GPUs, ``orthoplex serve`` then drives the cluster from it (``/readyz`` ready, the admin's
cluster view shows the head and this empty node), and the raylet it started holds none of the
service's secrets (the Ray token stays: token auth is on, as in the RayCluster)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.manifests import DEPLOY, ROOT
from workers.runtime.cluster import procfs

pytestmark = pytest.mark.cluster

ADMIN = "deploy-entrypoint-admin-4f1c"
RAY_TOKEN = "deploy-entrypoint-ray-token-7d2e9b41c0a5"
DB_PASSWORD = "deploy-entrypoint-pw-91ab"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_sessions(sids: set[int]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
        for pid in procfs.in_sessions(sids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(procfs.alive(p) for p in procfs.in_sessions(sids)):
            time.sleep(0.2)
    left = [p for p in procfs.in_sessions(sids) if procfs.alive(p)]
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def ray_head() -> Iterator[tuple[str, dict[str, str], Callable[[], None]]]:
    """A Ray head (1 CPU, no GPUs) with token auth on, as the RayCluster has it: its address, its
    environment, and the call that starts it (``ray start`` in a session of its own)."""
    temp = Path(tempfile.mkdtemp(prefix="oxdep", dir="/tmp"))
    port = _free_port()
    # the pod's environment: its own token only (the session's Ray cluster, if one runs in this
    # process, left its token file in RAY_AUTH_TOKEN_PATH)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_", "ORTHOPLEX_RAY_"))}
    env = {**inherited, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": RAY_TOKEN, "PYTHONPATH": str(ROOT)}
    ray_bin = str(Path(sys.executable).with_name("ray"))
    sids: set[int] = set()

    def start() -> None:
        head = subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
                                 "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                                 "--disable-usage-stats", f"--temp-dir={temp}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        sids.add(head.pid)
        out, _ = head.communicate(timeout=180)
        assert head.returncode == 0, out[-2000:]

    try:
        yield f"127.0.0.1:{port}", env, start
    finally:
        _kill_sessions(sids)
        shutil.rmtree(temp, ignore_errors=True)


def test_the_service_joins_ray_as_an_empty_node(
        ray_head: tuple[str, dict[str, str], Callable[[], None]], tmp_path: Path) -> None:
    address, env, start_head = ray_head
    port = _free_port()
    bindir = str(Path(sys.executable).parent)
    env = {**env, "PATH": f"{bindir}:{env.get('PATH', '')}", "ORTHOPLEX_RAY_ADDRESS": address,
           "ORTHOPLEX_DATABASE_URL": f"sqlite:///{tmp_path / 'orthoplex.db'}",
           "ORTHOPLEX_STORAGE_PATH": str(tmp_path / "storage"), "ORTHOPLEX_HOST": "127.0.0.1",
           "ORTHOPLEX_PORT": str(port), "ORTHOPLEX_ADMIN_TOKEN": ADMIN, "PGPASSWORD": DB_PASSWORD,
           "ORTHOPLEX_GPUS_PER_NODE": "2"}
    log = (tmp_path / "service.log").open("w")
    svc = subprocess.Popen([str(DEPLOY / "image" / "orthoplex-service")], env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # started before the head (a RayCluster still coming up): it waits, and says so
        deadline = time.monotonic() + 60
        while "waiting for the Ray head" not in (tmp_path / "service.log").read_text():
            assert svc.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()
            time.sleep(0.5)
        start_head()
        url = f"http://127.0.0.1:{port}"
        ready = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and svc.poll() is None:
            try:
                ready = httpx.get(f"{url}/readyz", timeout=5)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        assert ready is not None and ready.status_code == 200, (tmp_path / "service.log").read_text()[-3000:]
        assert ready.json()["checks"] == {"database": "ok", "ray": "ok"}
        view = httpx.get(f"{url}/v1/cluster", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
        assert view["available"] is True, view
        nodes = [n for n in view["nodes"] if n["alive"]]
        assert len(nodes) == 2 and sum(n["is_head"] for n in nodes) == 1, nodes
        joined = next(n for n in nodes if not n["is_head"])
        assert (joined["cpus_total"], joined["gpus_total"]) == (0, 0), joined
        # the raylet the script started (in the service's session) holds none of the service's secrets
        raylets = [p for p in procfs.in_sessions({svc.pid})
                   if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].endswith(b"raylet")]
        assert raylets, "no raylet in the service's session"
        for pid in raylets:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            names = {e.split(b"=", 1)[0].decode() for e in environ if b"=" in e}
            assert "ORTHOPLEX_RAY_ADDRESS" in names and "RAY_AUTH_TOKEN" in names  # token auth still works
            assert not names & {"ORTHOPLEX_ADMIN_TOKEN", "ORTHOPLEX_DATABASE_URL", "PGPASSWORD"}, names
            assert not any(ADMIN.encode() in e or DB_PASSWORD.encode() in e for e in environ)
    finally:
        _kill_sessions({svc.pid})
        log.close()
