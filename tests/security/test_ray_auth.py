"""Ray is not an open door (issue 43): the cluster ``orthoplex cluster up`` starts takes Ray token auth,
none of its sockets answers a client without the token, the token stays out of every output, and
``orthoplex serve`` refuses a cluster that answers without one.

Real parts only: ``ray start`` processes (one cluster at a time: a token cluster, then, for the
refusal, an open head), real ``ray.init`` clients in subprocesses, the real ``orthoplex serve``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from service.api.process import free_port
from service.cli.runtime import register
from workers.runtime.cluster import procfs
from workers.runtime.cluster.rank_env import minimal_env
from workers.runtime.cluster.ray_auth import probe_open, read_token, token_env
from workers.testbed.cluster_up import cluster_pids
from workers.testbed.socket_probe import listening, probe, reach_host

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _routable_ip() -> str:
    """The address another machine would use for this one (what Ray advertises)."""
    from ray._private.services import get_node_ip_address

    return str(get_node_ip_address())


def _client(code: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=REPO)


def _env_without_ray_auth() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}


# ---------------------------------------------------------------------------------------- serve
class Serve:
    """``orthoplex serve --no-controller`` in a subprocess (SQLite), its output in a file."""

    def __init__(self, tmp: Path, address: str, *args: str, extra: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = tmp / f"serve-{self.port}.log"
        base = {k: v for k, v in _env_without_ray_auth().items() if k != "ORTHOPLEX_ALLOW_INSECURE_RAY"}
        env = {**base, "ORTHOPLEX_DATABASE_URL": f"sqlite:///{tmp / 'serve.db'}",
               "ORTHOPLEX_RAY_ADDRESS": address, "ORTHOPLEX_STORAGE_PATH": str(tmp / "storage"),
               "ORTHOPLEX_HOST": "127.0.0.1", "ORTHOPLEX_PORT": str(self.port), "ORTHOPLEX_LOG_FORMAT": "json",
               **(extra or {})}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *args], cwd=REPO, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def readyz(self, timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.output()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                    return dict(json.loads(resp.read()))
            except urllib.error.HTTPError as exc:
                return dict(json.loads(exc.read()))
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise AssertionError(f"serve did not answer: {self.output()[-2000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def open_head(tmp_path: Path) -> Iterator[str]:
    """A head started the way Ray allows and Orthoplex never does: RAY_AUTH_MODE=disabled. Its test
    comes first in this module, so it is stopped before the token cluster starts (one at a time)."""
    port = free_port()
    temp = Path(f"/tmp/orthoplex-open-{os.getpid()}-{port}")
    env = {**minimal_env(_env_without_ray_auth()), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
                             "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false", f"--temp-dir={temp}",
                             "--disable-usage-stats"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=300)
    try:
        assert proc.returncode == 0, out[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        pids = procfs.in_sessions({proc.pid})
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
            time.sleep(2)


@pytest.mark.timeout(600)
def test_serve_refuses_an_open_cluster_and_starts_with_the_opt_out(open_head: str, tmp_path: Path) -> None:
    assert probe_open(open_head) is True  # the probe tells an open cluster from an authenticating one

    refused = Serve(tmp_path, open_head, "--no-controller")
    try:
        assert refused.proc.wait(120) == 2
    finally:
        refused.stop()
    msg = refused.output()
    assert "answers without a token" in msg and "ORTHOPLEX_RAY_TOKEN_FILE" in msg and "--allow-insecure-ray" in msg

    for args, extra in ((("--no-controller", "--allow-insecure-ray"), {}),
                        (("--no-controller",), {"ORTHOPLEX_ALLOW_INSECURE_RAY": "1"})):
        svc = Serve(tmp_path, open_head, *args, extra=extra)
        try:
            ready = svc.readyz()
        finally:
            svc.stop()
        assert any("ORTHOPLEX_ALLOW_INSECURE_RAY" in w for w in ready["warnings"]), ready
        assert "ORTHOPLEX_ALLOW_INSECURE_RAY is set" in svc.output()  # logged at start


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("cluster")
    app = _app()
    res = CliRunner().invoke(app, ["cluster", "up", "--nodes", "1", "--gpus-per-node", "1", "--cpus-per-node", "1",
                                   "--data-dir", str(data)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    rec = json.loads((data / "cluster.json").read_text())
    try:
        yield {"rec": rec, "data": data, "up_output": res.output}
    finally:
        down = CliRunner().invoke(app, ["cluster", "down", "--data-dir", str(data)])
        assert down.exit_code == 0, down.output


@pytest.mark.timeout(900)
def test_cluster_up_takes_token_auth_and_no_socket_answers_without_it(token_cluster: dict[str, Any]) -> None:
    rec, data = token_cluster["rec"], token_cluster["data"]
    token_file = Path(rec["token_file"])
    token = read_token(token_file)

    # the token: fresh, 0600, beside the record; `cluster up` printed only its path
    assert token_file.parent == data and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(token) == 64 and token not in token_cluster["up_output"]
    assert token not in (data / "cluster.json").read_text()
    shown = CliRunner().invoke(_app(), ["cluster", "token", "--data-dir", str(data)])
    assert shown.exit_code == 0 and shown.output.strip() == token

    # ray.init to the GCS: no token, a wrong one -> refused; the cluster's token -> works
    code = (f"import ray; ray.init(address='{rec['address']}', log_to_driver=False); "
            "print('GPUS', int(ray.cluster_resources().get('GPU', 0))); ray.shutdown()")
    bare = _env_without_ray_auth()
    for env in ({**bare, "RAY_AUTH_MODE": "disabled"}, {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}):
        out = _client(code, env)
        assert out.returncode != 0 and "GPUS" not in out.stdout, out.stdout[-500:]
        assert "token" in out.stderr.lower(), out.stderr[-1500:]
    ok = _client(code, dict(token_env(token_file, dict(bare))))
    assert ok.returncode == 0 and "GPUS 1" in ok.stdout, ok.stderr[-2000:]
    assert probe_open(rec["address"]) is False

    # every listening socket of the cluster's processes: the loopback ones and those another machine
    # reaches (wildcard ones via the routable address) refuse a client without the token -- the GCS,
    # the raylets, the object managers, the workers, the Ray client server, the runtime-env agents
    pids = cluster_pids(rec)
    socks = listening(pids)
    ip = _routable_ip()
    assert any(s.port == int(rec["address"].rsplit(":", 1)[1]) for s in socks), socks
    verdicts = {(s.pid, s.host, s.port): probe(reach_host(s, ip), s.port) for s in socks}
    assert all(v == "refused" for v in verdicts.values()), verdicts
    client_server = [s for s in socks if s.port == 10001 or "client.server" in _cmdline(s.pid)]
    assert client_server, "the Ray client server is a listener of the cluster"

    # a job submission, to every HTTP listener of the cluster, without the token: refused, never run
    marker = data / "pwned"
    body = json.dumps({"entrypoint": f"touch {marker}"}).encode()
    for s in socks:
        status = _http_post(reach_host(s, ip), s.port, "/api/jobs/", body)
        assert status in (None, 401, 403), (s, status)
    time.sleep(1)
    assert not marker.exists()

    # the token is in no log line of the cluster, no command line and no environment of its processes
    logs = Path(rec["temp_dir"]) / "session_latest" / "logs"
    for f in logs.rglob("*"):
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f
    for pid in pids:
        for part in ("cmdline", "environ"):
            try:
                raw = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            assert token.encode() not in raw, (pid, part)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _http_post(host: str, port: int, path: str, body: bytes) -> int | None:
    """The HTTP status of a POST without credentials, or None when the socket does not speak HTTP/1.1."""
    url = f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return None  # not HTTP/1.1 (a gRPC server), or nothing answered


@pytest.mark.timeout(600)
def test_serve_connects_to_the_token_cluster_with_its_recorded_token(token_cluster: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    """The service finds the token of `cluster up`'s cluster beside its record (ORTHOPLEX_STORAGE_PATH
    under the same data dir) and starts; the token is in none of its output."""
    rec, data = token_cluster["rec"], token_cluster["data"]
    svc = Serve(tmp_path, rec["address"], "--no-controller",
                extra={"ORTHOPLEX_STORAGE_PATH": str(data / "storage")})
    try:
        ready = svc.readyz()
        assert ready["warnings"] == [], ready
    finally:
        svc.stop()
    out = svc.output()
    assert '"auth": "token"' in out, out[-2000:]
    assert read_token(Path(rec["token_file"])) not in out


