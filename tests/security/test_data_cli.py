"""``orthoplex data upload|list|download|rm`` against a real ``orthoplex serve`` process on SQLite
with its own storage path: a file goes in, is listed, comes back byte for byte and is removed; a
path outside the area exits 1 naming the field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from service.cli import client as client_cli
from tests.service.conftest import ADMIN, ADMIN_TOKEN
from tests.service.live import LiveServer

pytestmark = pytest.mark.unit


def test_data_commands(sqlite_url: str, tmp_path: Path) -> None:
    server = LiveServer(sqlite_url, ADMIN_TOKEN, env={"ORTHOPLEX_STORAGE_PATH": str(tmp_path / "storage")},
                        log_path=tmp_path / "server.log")
    server.start()
    try:
        tid = httpx.post(f"{server.url}/v1/tenants", headers=ADMIN, json={"name": "cli-data"}).json()["id"]
        token = httpx.post(f"{server.url}/v1/tenants/{tid}/tokens", headers=ADMIN, json={}).json()["token"]
        app = typer.Typer()
        client_cli.register(app)

        def run(*args: str) -> object:
            return CliRunner().invoke(app, [*args, "--url", server.url, "--token", token])

        src = tmp_path / "corpus.txt"
        src.write_bytes(os.urandom(3 << 20))
        r = run("data", "upload", str(src), "texts/corpus.txt")
        assert r.exit_code == 0 and "uploaded texts/corpus.txt (3145728 bytes)" in r.output, r.output
        r = run("data", "list")
        assert r.exit_code == 0 and "texts/corpus.txt" in r.output, r.output
        out = tmp_path / "back.txt"
        r = run("data", "download", "texts/corpus.txt", str(out))
        assert r.exit_code == 0 and out.read_bytes() == src.read_bytes(), r.output
        r = run("data", "upload", str(src), "../escape.txt")
        assert r.exit_code == 2 and "dest: must stay inside your data area" in r.output, r.output
        r = run("data", "upload", str(src), "/etc/escape.txt")
        assert r.exit_code == 2 and "dest:" in r.output, r.output
        r = run("data", "upload", str(src), "texts/again.txt", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout) == {"path": "texts/again.txt", "bytes": 3 << 20}, r.output
        r = run("data", "rm", "texts/again.txt", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout) == {"removed": "texts/again.txt"}, r.output
        r = run("data", "rm", "texts/corpus.txt")
        assert r.exit_code == 0, r.output
        r = run("data", "rm", "texts/corpus.txt")
        assert r.exit_code == 1 and "404" in r.output
    finally:
        server.stop()
