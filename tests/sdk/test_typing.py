"""The SDK's public surface type-checks under ``mypy --strict`` (``py.typed`` ships with it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_mypy_strict_on_the_sdk() -> None:
    assert (ROOT / "orthoplex" / "py.typed").is_file()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "orthoplex"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout


@pytest.mark.unit
def test_the_package_ships_its_marker() -> None:
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "orthoplex*" in conf["packages"]["find"]["include"]
    assert conf["package-data"]["orthoplex"] == ["py.typed"]
