"""A service job with an imported HF model on the session cluster (the Ray runtime path): the REST
spec (``model: {"hf"}``, ``tokenizer``, jsonl + text data, ``eval_every``, ``export``, ``tracking``)
goes through the controller's translation (``workers.runtime.contract.attempt_spec``) to a supervisor;
the job writes the same tracking as ``orthoplex train`` -- TensorBoard files (loss, val_loss, lr,
grad norm, tokens/s, MFU) in its directory and an MLflow run (a local sqlite store) --, reports
``val_loss`` on its eval steps, and exports an HF directory ``transformers`` loads at the end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from tests.engine.hf_fixtures import hf_window_loss, make_hf_llama
from tests.engine.test_hf_data import _bpe
from workers.data_area import DataArea
from workers.engine.tracking import read_scalars

pytestmark = pytest.mark.cluster

STEPS = 4
SEQ = 32


@pytest.mark.timeout(600)
def test_hf_job_tracks_evaluates_and_exports_through_the_runtime(ray_cluster, tmp_path: Path) -> None:
    import ray

    from workers.runtime.contract.attempt_spec import Grant, attempt_spec
    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    area = tmp_path / "tenants" / "1" / "data"
    (area / "data").mkdir(parents=True)
    text = "\n\n".join(p.read_text() for p in sorted((Path(__file__).resolve().parents[2] / "workers" / "runtime")
                                                     .rglob("*.py")))
    (area / "data" / "a.txt").write_text(text[: len(text) // 2])
    (area / "data" / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                   for t in text[len(text) // 2:].split("\n\n")))
    (area / "held-out.txt").write_text(text[:20000])
    make_hf_llama(area / "llama", tied=False, layers=2, vocab_size=320)
    _bpe(area / "tokenizer.json", 320, [area / "data" / "a.txt"])
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    stored = {"name": "ft", "model": {"hf": "llama", "seq_len": SEQ}, "steps": STEPS, "global_batch": 4, "seed": 3,
              "data": {"kind": "text", "paths": ["data"]}, "tokenizer": "tokenizer.json", "eval_every": 2,
              "eval_data": {"kind": "text", "paths": ["held-out.txt"]}, "eval_batches": 1,
              "export": {"format": "hf"}, "layout_hint": {"tp": 2},
              "checkpoint": {"min_every_steps": 2, "max_every_steps": 2}}
    job_dir = tmp_path / "jobs" / "1"
    grant = Grant(job_id=1, job_dir=job_dir, gpus=2, min_gpus=2, gpu_type="CPU", mlflow_uri=mlflow_uri,
                  overrides={"runtime": h.FAST_RUNTIME})
    spec: dict[str, Any] = attempt_spec(stored, DataArea(root=area), grant)

    sup = start_supervisor("t-hfjob", 1, spec)
    seen: list[dict[str, Any]] = []

    def events() -> list[dict[str, Any]]:
        seen.extend(ray.get(sup.events.remote(seen[-1]["seq"] if seen else 0), timeout=60))
        return seen

    try:
        end = h.wait_for(lambda: next((e for e in events() if e["type"] in ("finished", "failed")), None), 480,
                         "the job's end")
        assert end["type"] == "finished", [e for e in seen if e["type"] in ("failed", "rank_failed")]
    finally:
        stop_supervisor("t-hfjob", 1)
    steps = [e for e in seen if e["type"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    vals = {e["step"]: e["val_loss"] for e in steps if e.get("val_loss") is not None}
    assert sorted(vals) == [2, 4] and all(v > 0 for v in vals.values())

    board = read_scalars(job_dir / "tensorboard")
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
        assert [st for st, _ in board[f"train/{name}"]] == [1, 2, 3, 4], name
    assert [st for st, _ in board["train/val_loss"]] == [2, 4]
    for e, (_, v) in zip(steps, board["train/loss"], strict=True):
        assert abs(v - e["loss"]) <= 1e-5 * e["loss"]
    assert all(0 < m < 1 for _, m in board["train/mfu"])

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("orthoplex").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "job-1"
    assert "CPU" in run.data.params["mfu_peak"]
    history = {m: [(x.step, x.value) for x in client.get_metric_history(run.info.run_id, m)]
               for m in ("loss", "val_loss", "mfu")}
    assert [st for st, _ in history["val_loss"]] == [2, 4] and [st for st, _ in history["mfu"]] == [1, 2, 3, 4]
    assert history["val_loss"][-1][1] == pytest.approx(vals[4], rel=1e-9)

    export = job_dir / "export"
    assert (export / "config.json").is_file() and (export / "tokenizer.json").is_file()
    import torch

    batch = torch.randint(0, 320, (2, SEQ + 1), generator=torch.Generator().manual_seed(0))
    assert abs(hf_window_loss(export, batch) - hf_window_loss(area / "llama", batch)) > 1e-4  # trained weights
