"""``orthoplex cluster up --netns`` / ``cluster down``: Ray across namespaces, nothing left behind,
also after ``up`` was killed half way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from service.cli.runtime import register
from tests.netns.probes import wait_until
from workers.testbed.netns_cluster import leftovers

pytestmark = [pytest.mark.cluster]


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    from tests.fixtures.netns_cluster import _require_netns

    _require_netns()


@pytest.mark.timeout(900)
def test_cluster_up_netns_runs_ray_across_namespaces_and_down_removes_everything(tmp_path: Path) -> None:
    app = _app()
    res = CliRunner().invoke(app, ["cluster", "up", "--netns", "--nodes", "2", "--gpus-per-node", "1",
                                   "--cpus-per-node", "1", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    rec = json.loads((tmp_path / "cluster.json").read_text())
    try:
        assert rec["mode"] == "netns" and len(rec["netns"]) == 3 and rec["address"].startswith("10.250.")
        probe = ("import os, ray; ray.init(address=os.environ['ADDR'], log_to_driver=False)\n"
                 "@ray.remote(num_gpus=1, num_cpus=0)\ndef ip(): return ray.util.get_node_ip_address()\n"
                 "print(sorted(set(ray.get([ip.remote() for _ in range(4)]))))\nray.shutdown()")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled", "ADDR": rec["address"]})
        node_ips = sorted(n["ip"] for n in rec["nodes"] if n["gpus"])
        assert out.stdout.strip().splitlines()[-1] == str(node_ips), out.stderr[-3000:]
        assert json.loads(res.output.splitlines()[0])["ips"]["n1"] == node_ips[0]
    finally:
        res = CliRunner().invoke(app, ["cluster", "down", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0 and "stopped" in res.output, res.output
    assert not (tmp_path / "cluster.json").exists()
    assert leftovers(rec) == {"processes": [], "namespaces": [], "links": []}


@pytest.mark.timeout(900)
def test_down_cleans_up_after_up_was_killed_half_way(tmp_path: Path) -> None:
    state = tmp_path / "cluster.json"
    up = subprocess.Popen([sys.executable, "-m", "service.cli", "cluster", "up", "--netns", "--nodes", "2",
                           "--gpus-per-node", "1", "--cpus-per-node", "1", "--data-dir", str(tmp_path)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # kill it once the head's Ray is starting (namespaces and links made, processes running)
        wait_until(lambda: state.exists() and json.loads(state.read_text()).get("sessions"), 300,
                   "cluster up to start its first ray process")
        time.sleep(3)
    finally:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(30)
    rec = json.loads(state.read_text())
    assert rec["netns"] and rec["links"]
    res = CliRunner().invoke(_app(), ["cluster", "down", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert leftovers(rec) == {"processes": [], "namespaces": [], "links": []}
    assert not state.exists()
