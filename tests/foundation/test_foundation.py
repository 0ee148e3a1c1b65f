"""The foundation: settings, structured logging, the CLI entry point."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from service.cli.main import app
from service.log import configure_logging, get_logger
from service.settings import Settings, get_settings

pytestmark = pytest.mark.unit


def test_settings_defaults_need_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORTHOPLEX_DATABASE_URL", raising=False)
    s = Settings()
    assert s.database_url.startswith("sqlite:///")
    assert s.ray_address is None
    assert s.log_format in ("console", "json")


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTHOPLEX_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("ORTHOPLEX_RAY_ADDRESS", "127.0.0.1:6380")
    monkeypatch.setenv("ORTHOPLEX_LOG_LEVEL", "debug")
    s = Settings()
    assert s.database_url == "postgresql+psycopg://u@h/db"
    assert s.ray_address == "127.0.0.1:6380"
    assert s.log_level == "DEBUG"


def test_settings_reject_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTHOPLEX_PORT", "70000")
    with pytest.raises(ValueError, match="port"):
        Settings()


def test_json_logging_carries_bound_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTHOPLEX_LOG_FORMAT", "json")
    get_settings.cache_clear()
    buf = io.StringIO()
    try:
        configure_logging(stream=buf)
        get_logger("orthoplex.test", job_id=7).bind(rank=3).info("step done", extra={"step": 12})
    finally:
        get_settings.cache_clear()
        configure_logging(fmt="console")
    line = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert line["msg"] == "step done"
    assert line["job_id"] == 7 and line["rank"] == 3 and line["step"] == 12
    assert line["level"] == "info" and line["logger"] == "orthoplex.test"


def test_console_logging_is_one_line() -> None:
    buf = io.StringIO()
    configure_logging(fmt="console", level="INFO", stream=buf)
    logging.getLogger("orthoplex.x").info("hello", extra={"k": "v"})
    out = buf.getvalue().strip()
    assert "hello" in out and "k=v" in out and "\n" not in out


def test_cli_help_lists_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name in names:
        assert name in result.output


def test_cli_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("orthoplex ")


def test_cli_bad_option_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "--no-such-option"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "No such option" in proc.stderr
