"""``orthoplex train`` and ``orthoplex run`` number steps the same way in their metrics files.

One convention everywhere: a step is numbered by the steps completed once it is done (1..N), which
is also the step a checkpoint taken right after it carries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 3


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_train_and_run_metrics_files_number_steps_from_one(ray_cluster, tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from service.cli.runtime import register

    train_out, run_out = tmp_path / "train.jsonl", tmp_path / "run.jsonl"
    res = _cli("train", "--model", "tiny", "--steps", str(STEPS), "--global-batch", "2",
               "--checkpoint-dir", str(tmp_path / "train-ckpt"), "--save-every", str(STEPS),
               "--metrics-out", str(train_out), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:  # a typer app with a callback keeps sub-commands named
        pass

    run = CliRunner().invoke(app, [
        "run", "--address", ray_cluster.address, "--model", "tiny", "--steps", str(STEPS), "--global-batch", "2",
        "--layout-hint", "tp=1,pp=1,cp=1,dp=1", "--checkpoint-dir", str(tmp_path / "run-ckpt"),
        "--max-checkpoint-every", str(STEPS), "--metrics-out", str(run_out),
        "--events-out", str(tmp_path / "events.jsonl"), "--job-id", "t-steps"])
    assert run.exit_code == 0, run.output + repr(run.exception)
    train_steps = [r["step"] for r in _rows(train_out)]
    run_steps = [r["step"] for r in _rows(run_out)]
    assert train_steps == run_steps == list(range(1, STEPS + 1)), (train_steps, run_steps)
    # the run's step events and its final checkpoint use the same numbers
    events = _rows(tmp_path / "events.jsonl")
    assert [e["step"] for e in events if e["type"] == "step"] == run_steps
    assert max(e["step"] for e in events if e["type"] == "checkpoint") == STEPS
