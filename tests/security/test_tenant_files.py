"""Files inside a tenant's area are hostile input too (issue 44): a path an HF shard index names
follows the data area's rule (relative, no ``..``, inside the checkpoint directory with symlinks
followed) at submission and again where the engine reads; the answers are no oracle for files
outside; a malformed tenant file is a 422 naming the file, never a 500 (nesting bounded too)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.engine.hf_fixtures import make_hf_llama
from tests.engine.test_hf_data import _bpe
from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant
from workers.data_area import TenantFileError, referenced_path, tenant_area
from workers.engine.hf.weights import INDEX_FILE, HFCheckpoint
from workers.tenant_json import MAX_DEPTH, loads, nesting_depth

pytestmark = pytest.mark.unit
DEEP = "[" * 5000 + "]" * 5000
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tenant-files")
    hf = make_hf_llama(root / "llama", tied=False, layers=1, vocab_size=320)
    (root / "train.txt").write_text(TEXT)
    tok = _bpe(root / "tokenizer.json", 300, [root / "train.txt"])
    return {"hf": hf, "tok": tok, "train": root / "train.txt"}


@pytest.fixture
def env(sqlite_url: str, tmp_path: Path, model: dict[str, Path]) -> Iterator[dict]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    settings = Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage)
    with TestClient(create_app(settings, ApiSettings(metrics_cache_s=0, fit_check=False))) as c:
        ta, a = make_tenant(c, "files-a", submit_per_minute=1000)
        tb, _ = make_tenant(c, "files-b", submit_per_minute=1000)
        area_a, area_b = tenant_area(storage, ta), tenant_area(storage, tb)
        shutil.copytree(model["hf"], area_b / "bm")  # tenant B's upload
        export = storage / "jobs" / "1" / "export"  # a job's export under the checkpoint root
        shutil.copytree(model["hf"], export)
        area_a.mkdir(parents=True)
        yield {"c": c, "a": a, "area": area_a, "tb": tb, "storage": storage, "model": model}


def _hf_dir(area: Path, name: str, src: Path, weight_map: object) -> Path:
    """``name``: A's checkpoint directory with ``config.json`` and an index sending tensors where told."""
    d = area / name
    d.mkdir(parents=True)
    shutil.copy(src / "config.json", d / "config.json")
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _all_to(src: Path, target: object) -> dict[str, object]:
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), framework="pt") as h:
        return {k: target for k in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def _submit(env: dict, name: str) -> tuple[int, str]:
    r = env["c"].post("/v1/jobs", json=job_body(name=name, model={"hf": name, "seq_len": 64}), headers=env["a"])
    detail = r.json().get("detail")
    msg = detail[0]["msg"] if isinstance(detail, list) else str(detail)
    if r.status_code == 422:
        assert detail[0]["loc"] == ["body", "model", "hf"], detail
    return r.status_code, msg


def test_an_index_cannot_name_another_tenants_weights_or_a_jobs_export(env: dict) -> None:
    area, src, tb = env["area"], env["model"]["hf"], env["tb"]
    # the positive control: shards named relative to the directory, in a subfolder, are accepted
    good = _hf_dir(area, "good", src, _all_to(src, "shards/model.safetensors"))
    (good / "shards").mkdir()
    shutil.copy(src / "model.safetensors", good / "shards" / "model.safetensors")
    assert _submit(env, "good")[0] == 201
    hostile = {
        "other-tenant": f"../../../{tb}/data/bm/model.safetensors",
        "absolute": str(tenant_area(env["storage"], tb) / "bm" / "model.safetensors"),
        "job-export": "../../../../jobs/1/export/model.safetensors",
        "dot-dot-inside": "sub/../../bm/model.safetensors",
        "url": "file:///etc/hostname",
    }
    for name, target in hostile.items():
        _hf_dir(area, name, src, _all_to(src, target))
        code, msg = _submit(env, name)
        assert code == 422, (name, code, msg)
        assert INDEX_FILE in msg and "weight_map" in msg, (name, msg)
        # what it says: the tenant's own index entry, and nothing of the file it names
        assert "shape" not in msg and str(env["storage"]) not in msg.replace(target, "T"), (name, msg)
        # the run-time reader (load_hf_shards opens it) refuses it too
        with pytest.raises(TenantFileError):
            HFCheckpoint(area / name)
    # a symlink inside the directory that leads to B's shard: refused the same way, at both times
    link = _hf_dir(area, "link", src, _all_to(src, "model.safetensors"))
    os.symlink(tenant_area(env["storage"], tb) / "bm" / "model.safetensors", link / "model.safetensors")
    code, msg = _submit(env, "link")
    assert code == 422 and "resolves outside its directory" in msg, msg
    with pytest.raises(TenantFileError, match="outside"):
        HFCheckpoint(link)
    # config.json itself as a symlink to B's config
    cfg = area / "cfg-link"
    shutil.copytree(src, cfg)
    (cfg / "config.json").unlink()
    os.symlink(tenant_area(env["storage"], tb) / "bm" / "config.json", cfg / "config.json")
    code, msg = _submit(env, "cfg-link")
    assert code == 422 and "config.json" in msg and "outside" in msg, msg


def test_an_index_is_no_oracle_for_files_outside(env: dict, tmp_path: Path) -> None:
    area, src = env["area"], env["model"]["hf"]
    present = tmp_path / "present.safetensors"
    present.write_bytes(b"\x00" * 64)  # "header too small" used to say it exists
    messages = []
    for name, target in (("exists", str(present)), ("missing", str(tmp_path / "absent.safetensors")),
                         ("exists-rel", os.path.relpath(present, area / "exists-rel")),
                         ("missing-rel", os.path.relpath(tmp_path / "absent.safetensors", area / "missing-rel"))):
        _hf_dir(area, name, src, {"model.embed_tokens.weight": target})
        code, msg = _submit(env, name)
        assert code == 422, (name, msg)
        messages.append(msg.replace(target, "T").replace(name, "N"))
    # the same words whether the outside file exists or not
    assert messages[0] == messages[1] and messages[2] == messages[3], messages
    assert not any("small" in m or "missing" in m or "exist" in m for m in messages), messages


def test_another_tenants_shapes_never_show(env: dict) -> None:
    """A's own shard with the wrong shapes is refused naming A's tensor; B's file is never opened."""
    area, src, tb = env["area"], env["model"]["hf"], env["tb"]
    mixed = _all_to(src, "model.safetensors")
    mixed["model.norm.weight"] = f"../../../{tb}/data/bm/model.safetensors"
    d = _hf_dir(area, "mixed", src, mixed)
    shutil.copy(src / "model.safetensors", d / "model.safetensors")
    code, msg = _submit(env, "mixed")
    assert code == 422 and "model.norm.weight" in msg and "[64]" not in msg, msg


@pytest.mark.parametrize(("case", "word"), [
    ("weight_map-list", "weight_map"),
    ("weight_map-values", "weight_map"),
    ("index-array", INDEX_FILE),
    ("index-deep", "nested"),
    ("config-deep", "nested"),
    ("config-array", "config.json"),
    ("config-bad-value", "config.json"),
    ("tokenizer_config-array", "tokenizer_config.json"),
    ("tokenizer_config-deep", "nested"),
    ("jsonl-deep", "docs.jsonl:1"),
])
def test_malformed_tenant_files_are_422_naming_the_file(env: dict, case: str, word: str) -> None:
    area, src, model = env["area"], env["model"]["hf"], env["model"]
    d = area / "m"
    shutil.copytree(src, d)
    tok_dir = area / "tok"
    tok_dir.mkdir()
    shutil.copy(model["tok"], tok_dir / "tokenizer.json")
    (area / "docs.jsonl").write_text(json.dumps({"text": TEXT}) + "\n")
    body = job_body(name=case, model={"hf": "m", "seq_len": 64})
    if case == "weight_map-list":
        (d / INDEX_FILE).write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    elif case == "weight_map-values":
        (d / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.norm.weight": 7}}))
    elif case == "index-array":
        (d / INDEX_FILE).write_text("[]")
    elif case == "index-deep":
        (d / INDEX_FILE).write_text('{"weight_map": ' + DEEP + "}")
    elif case == "config-deep":
        (d / "config.json").write_text('{"model_type": "llama", "x": ' + DEEP + "}")
    elif case == "config-array":
        (d / "config.json").write_text("[]")
    elif case == "config-bad-value":
        cfg = json.loads((src / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": [1]}))
    else:
        body = job_body(name=case, model={"hf": "m", "seq_len": 64}, tokenizer="tok",
                        data={"kind": "text", "paths": ["docs.jsonl"]})
        if case == "tokenizer_config-array":
            (tok_dir / "tokenizer_config.json").write_text("[]")
        elif case == "tokenizer_config-deep":
            (tok_dir / "tokenizer_config.json").write_text('{"eos_token": ' + DEEP + "}")
        elif case == "jsonl-deep":
            (area / "docs.jsonl").write_text('{"text": ' + DEEP + "}\n")
    r = env["c"].post("/v1/jobs", json=body, headers=env["a"])
    assert r.status_code == 422, (case, r.status_code, r.text)
    msg = r.json()["detail"][0]["msg"]
    assert word in msg and str(area) not in msg, (case, msg)


def test_the_rule_itself(tmp_path: Path) -> None:
    base = tmp_path / "d"
    (base / "sub").mkdir(parents=True)
    (base / "sub" / "f").write_text("x")
    assert referenced_path(base, "sub/f", "idx") == (base / "sub" / "f").resolve()
    assert referenced_path(base, "nothing", "idx", required=False) is None
    for bad in ("/etc/hostname", "../d/sub/f", "sub/../../x", "~/x", "a\\b", "", "s3://b/k", 7, None):
        with pytest.raises(TenantFileError):
            referenced_path(base, bad, "idx")
    with pytest.raises(TenantFileError, match="does not exist"):
        referenced_path(base, "sub/none", "idx")
    assert nesting_depth(b'{"a": "[[[[", "b": [[1]]}') == 3
    with pytest.raises(TenantFileError, match=f"at most {MAX_DEPTH}"):
        loads(DEEP, "x.json", expect=None)
