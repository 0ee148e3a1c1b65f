"""The demo starts its service on a port chosen just before; a port taken in between (Ray starts many
processes) makes the service exit at once, and the demo starts it again on another port."""

from __future__ import annotations

import socket
import types
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.cluster


def test_service_is_started_again_when_its_port_was_taken(ray_cluster, tmp_path: Path, monkeypatch) -> None:
    from service.demo import runner

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    chosen = iter([taken])
    real = runner.free_port
    monkeypatch.setattr(runner, "free_port", lambda: next(chosen, None) or real())
    demo = runner.Demo(runner.DemoConfig(workdir=tmp_path))
    demo.cluster = types.SimpleNamespace(address=ray_cluster.address, token_file=ray_cluster.token_file)
    try:
        demo._start_service()
        assert demo.port != taken
        assert httpx.get(f"{demo.base}/readyz", timeout=10).status_code == 200
        log = (tmp_path / "service.log").read_text()
        assert "address already in use" in log and str(taken) in log
    finally:
        demo.cluster = None  # the session's cluster is not the demo's to shut down
        demo.stop()
        squatter.close()
