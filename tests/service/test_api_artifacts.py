"""A job's artifacts over REST and the CLI: the owner lists and downloads its checkpoints, HF export
and TensorBoard files; another tenant gets 404s; path traversal, absolute paths, symlinks out of
the job's directory and files outside the artifact folders give no content."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant
from workers.data_area import checkpoint_root

pytestmark = pytest.mark.unit


@pytest.fixture
def setup(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict, dict, int, int, Path]]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage),
                     ApiSettings(metrics_cache_s=0, fit_check=False))
    with TestClient(app) as c:
        _, a = make_tenant(c, "art-a", submit_per_minute=1000)
        _, b = make_tenant(c, "art-b", submit_per_minute=1000)
        ja = c.post("/v1/jobs", json=job_body("a-job"), headers=a).json()["id"]
        jb = c.post("/v1/jobs", json=job_body("b-job"), headers=b).json()["id"]
        for jid, tag in ((ja, b"A"), (jb, b"B")):
            d = checkpoint_root(storage) / str(jid)
            (d / "checkpoints" / "step_00000004").mkdir(parents=True)
            (d / "checkpoints" / "step_00000004" / "__0_0.distcp").write_bytes(tag * 100)
            (d / "export").mkdir()
            (d / "export" / "config.json").write_bytes(b'{"model_type": "llama", "owner": "' + tag + b'"}')
            (d / "export" / "model.safetensors").write_bytes(tag * 10)
            (d / "tensorboard").mkdir()
            (d / "tensorboard" / "events.out.tfevents.1.host").write_bytes(tag * 3)
            (d / "supervisor-secret.json").write_bytes(b"not an artifact")
        outside = tmp_path / "outside.txt"
        outside.write_text("outside the job")
        da = checkpoint_root(storage) / str(ja)
        os.symlink(outside, da / "export" / "link-out.txt")
        os.symlink(checkpoint_root(storage) / str(jb) / "export", da / "tensorboard" / "b-export")
        yield c, a, b, ja, jb, tmp_path


def test_the_owner_lists_and_downloads(setup) -> None:
    c, a, _, ja, _, _ = setup
    r = c.get(f"/v1/jobs/{ja}/artifacts", headers=a)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["checkpoints"] == ["checkpoints/step_00000004"]
    assert body["export"] == "export" and body["tensorboard"] == "tensorboard"
    paths = {i["path"]: (i["kind"], i["bytes"]) for i in body["items"]}
    assert paths == {"checkpoints/step_00000004/__0_0.distcp": ("checkpoint", 100),
                     "export/config.json": ("export", 37), "export/model.safetensors": ("export", 10),
                     "tensorboard/events.out.tfevents.1.host": ("tensorboard", 3)}
    r = c.get(f"/v1/jobs/{ja}/artifacts/export/config.json", headers=a)
    assert r.status_code == 200 and b'"owner": "A"' in r.content


def test_another_tenant_gets_404s(setup) -> None:
    c, a, b, ja, jb, _ = setup
    assert c.get(f"/v1/jobs/{ja}/artifacts", headers=b).status_code == 404
    assert c.get(f"/v1/jobs/{ja}/artifacts/export/config.json", headers=b).status_code == 404
    assert c.get(f"/v1/jobs/{jb}/artifacts/export/config.json", headers=a).status_code == 404
    assert c.get(f"/v1/jobs/{ja}/artifacts").status_code == 401


@pytest.mark.parametrize("path", [
    "%2E%2E/{jb}/export/config.json", "export/%2E%2E/%2E%2E/{jb}/export/config.json", "..%2F{jb}%2Fexport%2Fconfig.json",
    "%2Fetc%2Fpasswd", "export/link-out.txt", "tensorboard/b-export/config.json", "supervisor-secret.json",
    "export", "export/missing.json", "shared:x/y", "~/x",
])
def test_traversal_gives_no_content(setup, path: str) -> None:
    c, a, _, ja, jb, _ = setup
    r = c.get(f"/v1/jobs/{ja}/artifacts/" + path.format(jb=jb), headers=a)
    # 404 for every path the route sees; 422 for characters outside its declared pattern (":", "~")
    assert r.status_code == (422 if path in ("shared:x/y", "~/x") else 404), (path, r.status_code)
    assert b"outside the job" not in r.content and b'"owner": "B"' not in r.content
    assert b"not an artifact" not in r.content


def test_cli_lists_and_downloads_the_export(setup, sqlite_url: str, tmp_path: Path) -> None:
    """The CLI (its SDK client) against a real server on the same database and storage."""
    from service.cli import client as cli_client
    from tests.service.live import LiveServer

    _, a, _, ja, jb, _ = setup
    server = LiveServer(sqlite_url, ADMIN_TOKEN, env={"ORTHOPLEX_STORAGE_PATH": str(tmp_path / "storage")})
    server.start()
    try:
        def run(*args: str) -> Any:
            token = a["Authorization"].removeprefix("Bearer ")
            return CliRunner().invoke(app, [*args, "--url", server.url, "--token", token])

        app = typer.Typer()
        cli_client.register(app)
        r = run("artifacts", str(ja))
        assert r.exit_code == 0, r.output
        assert "checkpoints/step_00000004" in r.output and "export/model.safetensors" in r.output
        out = tmp_path / "model"
        r = run("artifacts", str(ja), "--get", "export", "--out", str(out))
        assert r.exit_code == 0, r.output
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
        assert b'"owner": "A"' in (out / "config.json").read_bytes()
        r = run("artifacts", str(ja), "--get", "nothing")
        assert r.exit_code == 2 and "--get nothing" in r.output
        r = run("artifacts", str(jb))  # another tenant's job
        assert r.exit_code == 1 and "404" in r.output
    finally:
        server.stop()
