"""Checkpoints on ``s3://`` storage, against a real S3 protocol server on loopback (moto's server).

- A writer killed between its shard writes and the commit marker leaves a prefix without a marker:
  no restore picks it, the next commit removes it; a retention killed after deleting a marker
  leaves files no listing shows. Keep-N holds: only the newest N committed prefixes remain.
- ``orthoplex train --checkpoint-dir s3://...``: a run stopped after step 2 under ``pp=2`` resumes
  under ``dp=2,zero=1`` from the object store and continues the uninterrupted single-process curve;
  its TensorBoard files and its HF export (``--export-hf s3://...``) land in the bucket.
- A bucket that does not exist is refused before any process starts (exit 2, naming the flag).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from workers import object_store

REPO = Path(__file__).resolve().parents[2]

# one process saves steps, and SIGKILLs itself at the named fault point of the save of `kill_step`
_WRITER = """
import os, signal, sys, torch
from workers.engine.checkpoint import ModelOptimizerState, save_checkpoint
root, steps, kill_step, kill_at = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(model.parameters())
for step in steps:
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    def fault(point, step=step):
        if step == kill_step and point == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    save_checkpoint(root, step, ModelOptimizerState(model, opt, extra={"step": step}), keep=2, _fault=fault)
"""


def _write(root: str, steps: list[int], kill_step: int = -1, kill_at: str = "") -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _WRITER, root, ",".join(map(str, steps)), str(kill_step), kill_at],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    return proc.returncode


def _committed_steps(root: str) -> list[int]:
    from workers.engine.checkpoint import list_checkpoints

    return [r.step for r in list_checkpoints(root)]


@pytest.mark.s3
def test_a_crash_between_shard_writes_and_the_commit_marker_leaves_nothing_a_restore_picks(s3_bucket: str) -> None:
    from workers.engine.checkpoint import find_latest_verified

    root = f"{s3_bucket}/job/checkpoints"
    # steps 1, 2 commit; the save of step 3 dies after every shard and DCP's .metadata were written
    assert _write(root, [1, 2, 3], kill_step=3, kill_at="manifest:before") == -9
    objects = object_store.find(root)
    torn = sorted({k.split("/")[0] for k in objects if k.startswith("step-00000003.")})
    assert len(torn) == 1 and {f"{torn[0]}/__0_0.distcp", f"{torn[0]}/.metadata"} <= set(objects)
    assert f"{torn[0]}/manifest.json" not in objects  # written, but never committed
    rec, skipped = find_latest_verified(root)
    assert rec is not None and rec.step == 2 and _committed_steps(root) == [1, 2]
    assert [(p.rsplit("/", 1)[-1], "no commit marker" in why) for p, why in skipped] == [(torn[0], True)]

    # the next save (steps 3 again, then 4) commits; its commit removes the torn prefix; keep 2
    # retention dies after deleting the marker of step 3 (its files still there): invisible at once
    assert _write(root, [3, 4], kill_step=4, kill_at="retention:renamed") == -9
    assert _committed_steps(root) == [3, 4]  # step 3's (then step 2's) marker went first
    rec, skipped = find_latest_verified(root)
    assert rec is not None and rec.step == 4
    assert not any(k.startswith(torn[0]) for k in object_store.find(root))

    # a clean save (in this process) cleans up everything: the newest two committed prefixes, their
    # files, `latest`
    import torch

    from workers.engine.checkpoint import ModelOptimizerState, save_checkpoint

    model = torch.nn.Linear(8, 8)
    save_checkpoint(root, 5, ModelOptimizerState(model, torch.optim.AdamW(model.parameters())), keep=2)
    objects = object_store.find(root)
    prefixes = sorted({k.split("/")[0] for k in objects if k.startswith("step-")})
    assert [p.split(".")[0] for p in prefixes] == ["step-00000004", "step-00000005"]
    assert all(f"{p}/manifest.json" in objects for p in prefixes)
    assert object_store.read_bytes(f"{root}/latest").decode().strip() == prefixes[-1]
    assert set(objects) - {f"{p}/{n}" for p in prefixes for n in ("manifest.json", "__0_0.distcp", ".metadata")} \
        == {"latest"}


def _app() -> typer.Typer:
    from service.cli import hf, train

    app = typer.Typer()
    train.register(app)
    hf.register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer from flattening "train" into the root
        pass

    return app


def _train(*args: str):
    return CliRunner().invoke(_app(), ["train", *args])


@pytest.mark.s3
@pytest.mark.engine
@pytest.mark.timeout(900)
def test_train_checkpoints_to_s3_and_resumes_under_another_layout(s3_bucket: str, tmp_path: Path) -> None:
    common = ["--model", "tiny", "--global-batch", "4", "--steps", "4", "--seed", "3"]
    ck = f"{s3_bucket}/runs/a"
    a = _train(*common, "--layout", "pp=2", "--checkpoint-dir", ck, "--stop-at-step", "2",
               "--metrics-out", str(tmp_path / "a.jsonl"))
    assert a.exit_code == 0, a.output
    names = object_store.find(ck)
    assert any(n.startswith("step-00000002.ckpt-") and n.endswith("/manifest.json") for n in names), names
    b = _train(*common, "--layout", "dp=2,zero=1", "--checkpoint-dir", ck, "--resume",
               "--metrics-out", str(tmp_path / "b.jsonl"), "--export-hf", f"{s3_bucket}/runs/a-hf")
    assert b.exit_code == 0, b.output
    c = _train(*common, "--metrics-out", str(tmp_path / "c.jsonl"))  # single process, no interruption
    assert c.exit_code == 0, c.output
    rows = {k: [json.loads(line) for line in (tmp_path / f"{k}.jsonl").read_text().splitlines()] for k in "abc"}
    assert [r["step"] for r in rows["a"]] == [1, 2]
    assert [r["step"] for r in rows["b"]] == [3, 4]
    for got, want in zip(rows["a"] + rows["b"], rows["c"], strict=True):
        assert got["step"] == want["step"]
        assert abs(got["loss"] - want["loss"]) / want["loss"] < 1e-4, (got, want)
    # what b resumed from: the pp=2 checkpoint of step 2; TensorBoard's files went to the bucket too
    from workers.engine.checkpoint import find_latest_verified

    rec, _ = find_latest_verified(ck)
    assert rec is not None and rec.step == 2 and rec.manifest.layout["pp"] == 2
    from workers.engine.tracking import read_scalars

    board = read_scalars(f"{ck}/tensorboard")  # b's event file (a's too): steps 1-4 of the loss
    assert sorted(s for s, _ in board["train/loss"]) == [1, 2, 3, 4], board.get("train/loss")
    # the HF export of the end went to the bucket, streamed from each writer's local file
    export = object_store.find(f"{s3_bucket}/runs/a-hf")
    assert {"config.json", "model.safetensors.index.json"} <= set(export), export
    assert any(n.endswith(".safetensors") and size > 0 for n, size in export.items()), export


@pytest.mark.s3
def test_train_refuses_a_bucket_that_does_not_exist(s3_server) -> None:
    res = _train("--model", "tiny", "--steps", "1", "--checkpoint-dir", "s3://no-such-bucket-here/x")
    assert res.exit_code == 2, res.output
    assert "--checkpoint-dir s3://no-such-bucket-here/x" in res.output and "does not exist" in res.output
    res = _train("--model", "tiny", "--steps", "1", "--checkpoint-dir", "s3:///x")
    assert res.exit_code == 2 and "names no bucket" in res.output, res.output
    res = CliRunner().invoke(_app(), ["export", "--checkpoint-dir", "s3://no-such-bucket-here/x", "--out", "o"])
    assert res.exit_code == 2 and "--checkpoint-dir s3://no-such-bucket-here/x" in res.output, res.output
