"""The REST job spec's real-model fields: ``model: {"hf": DIR}``, ``tokenizer``, text/jsonl/parquet
data, ``eval_every`` + ``eval_data``, ``export`` and ``tracking``. Every path must lie in the
tenant's data area; bad values are a 422 naming the field; the planner plans the shape the HF
``config.json`` gives; the controller turns the stored spec into a runtime spec the runtime accepts.
A small random ``LlamaForCausalLM`` and a BPE tokenizer are built here (no downloads)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from tests.engine.hf_fixtures import make_hf_llama
from tests.engine.test_hf_data import _bpe
from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant
from workers.data_area import DataArea, tenant_area

pytestmark = pytest.mark.unit

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}\n" for i in range(300))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An HF checkpoint (vocab 320, 2 KV heads), variants of it that must be refused, a BPE
    tokenizer (vocab 300) and one too large (400), text/jsonl/parquet files."""
    root = tmp_path_factory.mktemp("hf-inputs")
    hf = make_hf_llama(root / "llama", tied=False, layers=2, vocab_size=320)
    mistral = root / "mistral"
    shutil.copytree(hf, mistral)
    cfg = json.loads((mistral / "config.json").read_text())
    (mistral / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    corrupt = root / "corrupt"
    shutil.copytree(hf, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    (root / "train.txt").write_text(TEXT)
    tok = _bpe(root / "tokenizer.json", 300, [root / "train.txt"])
    big = _bpe(root / "big-tokenizer.json", 400, [root / "train.txt"])
    docs = TEXT.split("\n")
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs if d))
    pq.write_table(pa.table({"text": [d for d in docs if d]}), root / "docs.parquet")
    pq.write_table(pa.table({"body": docs}), root / "nocol.parquet")
    return {"root": root, "hf": hf, "mistral": mistral, "corrupt": corrupt, "tok": tok, "big": big}


@pytest.fixture
def setup(sqlite_url: str, tmp_path: Path, inputs: dict[str, Path]) -> Iterator[tuple[TestClient, dict, dict, Path]]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    settings = Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage)
    app = create_app(settings, ApiSettings(metrics_cache_s=0, fit_check=True))
    with TestClient(app) as c:
        ta, a = make_tenant(c, "hf-a", submit_per_minute=1000)
        tb, b = make_tenant(c, "hf-b", submit_per_minute=1000)
        area_a, area_b = tenant_area(storage, ta), tenant_area(storage, tb)
        area_a.mkdir(parents=True)
        area_b.mkdir(parents=True)
        root = inputs["root"]
        for name in ("llama", "mistral", "corrupt"):
            shutil.copytree(root / name, area_a / "models" / name)
        shutil.copytree(root / "llama", area_b / "private-llama")
        (area_a / "data").mkdir()
        for name in ("train.txt", "docs.jsonl", "docs.parquet", "nocol.parquet", "tokenizer.json",
                     "big-tokenizer.json"):
            shutil.copy(root / name, area_a / "data" / name)
        (area_a / "held-out.txt").write_text(TEXT[:4000])
        os.symlink(area_b / "private-llama", area_a / "b-llama")
        os.symlink(root / "tokenizer.json", area_a / "tok-outside.json")
        yield c, a, b, area_a


def good_spec(**kw: object) -> dict[str, object]:
    body = job_body("ft", model={"hf": "models/llama", "seq_len": 32}, steps=4, global_batch=4,
                    data={"kind": "text", "paths": ["data/train.txt", "data/docs.jsonl", "data/docs.parquet"]},
                    tokenizer="data/tokenizer.json", eval_every=2, eval_data={"kind": "text", "paths": ["held-out.txt"]},
                    eval_batches=1, export={"format": "hf"}, tracking={"mlflow_uri": "http://mlflow.internal:5000"})
    body.update(kw)
    return body


def _refused(c: TestClient, headers: dict, body: dict) -> tuple[list, str]:
    r = c.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    return err["loc"], err["msg"]


def test_a_fine_tuning_job_is_accepted_and_stored_as_written(setup) -> None:
    c, a, _, _ = setup
    r = c.post("/v1/jobs", json=good_spec(), headers=a)
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["model"] == {"hf": "models/llama", "seq_len": 32}
    assert spec["tokenizer"] == "data/tokenizer.json" and spec["export"] == {"format": "hf"}
    assert spec["eval_every"] == 2 and spec["eval_data"]["paths"] == ["held-out.txt"]


@pytest.mark.parametrize(("change", "loc", "words"), [
    ({"model": {"hf": "models/mistral"}}, ["body", "model", "hf"], "model_type"),
    ({"model": {"hf": "models/corrupt"}}, ["body", "model", "hf"], "corrupt"),
    ({"model": {"hf": "models/nothing"}}, ["body", "model", "hf"], "no file"),
    ({"model": {"hf": "data/train.txt"}}, ["body", "model", "hf"], "not a directory"),
    ({"model": {"hf": "../2/data/private-llama"}}, ["body", "model", "hf"], "inside your data area"),
    ({"model": {"hf": "/etc"}}, ["body", "model", "hf"], "relative"),
    ({"model": {"hf": "b-llama"}}, ["body", "model", "hf"], "outside your data area"),
    ({"model": {"hf": "models/llama", "seq_len": 100000}}, ["body", "model", "hf"], "max_position_embeddings"),
    ({"tokenizer": "data/big-tokenizer.json"}, ["body", "tokenizer"], "does not fit"),
    ({"tokenizer": "tok-outside.json"}, ["body", "tokenizer"], "outside your data area"),
    ({"tokenizer": "data/train.txt"}, ["body", "tokenizer"], "tokenizer"),
    ({"data": {"kind": "text", "paths": ["data/nocol.parquet"]}}, ["body", "data", "paths"], "column 'text'"),
    ({"data": {"kind": "builtin"}}, ["body", "tokenizer"], "kind 'text'"),
    ({"eval_data": None}, ["body", "eval_data"], "eval_every"),
    ({"eval_data": {"kind": "text", "paths": ["b-llama/config.json"]}}, ["body", "eval_data", "paths", 0],
     "outside your data area"),
    ({"eval_data": {"kind": "builtin"}}, ["body", "eval_data", "kind"], "held-out"),
    ({"export": {"format": "onnx"}}, ["body", "export", "format"], "hf"),
    ({"tracking": {"mlflow_uri": "file:///etc/mlruns"}}, ["body", "tracking", "mlflow_uri"], "pattern"),
])
def test_bad_values_are_422_naming_the_field(setup, change: dict, loc: list, words: str) -> None:
    c, a, _, _ = setup
    body = {k: v for k, v in good_spec(**change).items() if v is not None}
    got, msg = _refused(c, a, body)
    # pydantic names the union branch of model (model.hf.hf); the rest is the field itself
    assert [p for p in got if p not in ("hf",)] == [p for p in loc if p != "hf"] or got == loc, (got, msg)
    assert words in msg, msg
    assert "/tmp" not in msg and str(Path.home()) not in msg, msg  # no absolute path leaks
    assert c.get("/v1/jobs", headers=a).json()["items"] == []


def test_another_tenants_model_is_not_reachable(setup) -> None:
    c, _, b, _ = setup
    # tenant b names tenant a's model by every spelling: nothing resolves into a's area
    for path in ("models/llama", "../1/data/models/llama", "../../tenants/1/data/models/llama"):
        loc, _ = _refused(c, b, good_spec(model={"hf": path}, data=None, tokenizer=None, eval_every=None,
                                          eval_data=None, eval_batches=None) | {})
        assert loc[:3] == ["body", "model", "hf"]


def test_the_planner_plans_the_imported_shape(setup) -> None:
    c, a, _, _ = setup
    # the checkpoint has 2 layers: pp=4 cannot split them (the preset tiny, 4 layers, can)
    assert c.post("/v1/plans", json=job_body(layout_hint={"pp": 4}, max_gpus=4), headers=a).status_code == 200
    loc, msg = _refused(c, a, good_spec(layout_hint={"pp": 4}, max_gpus=4))
    assert loc[1] in ("layout_hint", "model", "max_gpus") and "layers" in msg, (loc, msg)
    r = c.post("/v1/plans", json=good_spec(layout_hint={"pp": 2}, max_gpus=2), headers=a)
    assert r.status_code == 200, r.text
    assert r.json()["plans"][0]["layout"]["pp"] == 2
    # the dry run of an HF model needs a tenant (its data area); the admin gets a 422 naming it
    r = c.post("/v1/plans", json=good_spec(), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model", "hf"]


def test_stored_spec_becomes_a_runtime_spec_the_runtime_accepts(setup, tmp_path: Path) -> None:
    from workers.engine.config import TrainConfig
    from workers.runtime.contract.attempt_spec import Grant, attempt_spec
    from workers.runtime.contract.job_spec import parse_job

    c, a, _, area_a = setup
    stored = c.post("/v1/jobs", json=good_spec(), headers=a).json()["spec"]
    job_dir = tmp_path / "jobs" / "7"
    grant = Grant(job_id=7, job_dir=job_dir, gpus=1, min_gpus=1, gpu_type="CPU", mlflow_uri="sqlite:///x.db")
    job = parse_job(attempt_spec(stored, DataArea(root=area_a), grant))
    cfg = TrainConfig.from_dict(job.train)
    assert cfg.model.hf == str((area_a / "models" / "llama").resolve())
    assert (cfg.model.vocab, cfg.model.kv_heads, cfg.model.layers, cfg.model.seq_len) == (320, 2, 2, 32)
    assert cfg.data.tokenizer == str((area_a / "data" / "tokenizer.json").resolve())
    assert cfg.data.area is not None and cfg.eval_data is not None and cfg.eval_data.tokenizer == cfg.data.tokenizer
    assert (cfg.eval_every, cfg.eval_batches) == (2, 1)
    assert cfg.export is not None and (cfg.export.format, cfg.export.dir) == ("hf", str(job_dir / "export"))
    assert cfg.checkpoint_dir == str(job_dir / "checkpoints")
    # the job's own URI wins over the service default; TensorBoard always goes into the job's directory
    assert job.tracking == {"tensorboard_dir": str(job_dir / "tensorboard"), "mlflow_uri": "http://mlflow.internal:5000",
                            "experiment": "orthoplex", "run_name": "job-7"}
    # an input removed since submission fails the attempt naming the field
    shutil.rmtree(area_a / "models" / "llama")
    with pytest.raises(ValueError, match=r"model\.hf"):
        attempt_spec(stored, DataArea(root=area_a), grant)
