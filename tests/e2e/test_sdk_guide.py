"""``docs/sdk.md`` as a notebook user runs it: every ``python`` block, in order, in one Python
process, as written, against ``orthoplex serve --local-cluster 1x2`` (a real controller and Ray
cluster) on SQLite; the tenant's token and the service's address come from the environment, as
the guide says. The job trains to SUCCEEDED, its metrics are read and its HF export downloaded,
a second job is followed to its end, the errors are the typed ones, and the service log holds
no error."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.api.process import free_port

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "sdk.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def _python_blocks() -> list[str]:
    return [body for kind, _, body in BLOCK.findall(GUIDE.read_text()) if kind == "python"]


@pytest.mark.unit
def test_guide_blocks_are_python_that_compiles() -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 6, "the guide lost its steps"
    for body in blocks:
        compile(body, str(GUIDE), "exec")
    text = GUIDE.read_text()
    for name in ("Invalid", "Unauthorized", "NotFound", "Conflict", "RateLimited", "ServiceUnavailable"):
        assert f"`{name}" in text, name


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_sdk_guide_runs_as_written(tmp_path: Path) -> None:
    from orthoplex import Client

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTHOPLEX_")}
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO),
               ORTHOPLEX_ADMIN_TOKEN=secrets.token_urlsafe(24))
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--local-cluster", "1x2",
                                  "--port", str(port)], cwd=tmp_path, env=env, stdout=out, stderr=out,
                                 start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert serve.poll() is None, log.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        with Client(url, env["ORTHOPLEX_ADMIN_TOKEN"]) as admin:
            tenant = admin.admin.create_tenant("guide", gpu_quota=2)
            token = admin.admin.create_token(tenant.id, "guide").token
        work = tmp_path / "work"
        work.mkdir()
        script = work / "guide.py"
        script.write_text("\n".join(_python_blocks()))
        proc = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=780,
                              env={**env, "ORTHOPLEX_API_URL": url, "ORTHOPLEX_API_TOKEN": token})
    finally:
        serve.send_signal(2)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    served = log.read_text()
    where = f"--- stdout\n{proc.stdout[-5000:]}\n--- stderr\n{proc.stderr[-5000:]}\n--- serve.log\n{served[-5000:]}"
    assert proc.returncode == 0, where
    out = proc.stdout
    assert re.search(r"Job\(id=\d+, name='sdk-first', state=PENDING", out), where
    assert re.search(r"SUCCEEDED: loss [\d.]+ -> [\d.]+ over 12 steps", out), where
    assert "config.json" in out and "model.safetensors" in out, where
    assert (work / "sdk-first-export" / "config.json").is_file(), where
    assert re.search(r"job \d+ ended: SUCCEEDED", out), where
    assert "422 max_gpus: must be >= min_gpus" in out and "404 job not found" in out, where
    assert "12/12" in out, where  # the progress bar's last frame
    assert (work / "notes-back.txt").read_text() == (work / "notes.txt").read_text(), where
    assert "sdk-team" in out, where
    errors = [line for line in served.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not errors, where
