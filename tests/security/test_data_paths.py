"""Data paths as a hostile tenant writes them: every path outside the tenant's data area (absolute,
``..``, ``~``, symlink escapes, ``/proc``, globs over the disk, another tenant's area, the checkpoint
root, URL schemes) and every oversized glob is a 422 naming ``data.paths[i]`` that creates nothing
and says nothing about files outside the area. The same rule holds again where the engine reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant
from workers.data_area import DataArea, DataPathError, checkpoint_root, resolve_data_paths, tenant_area

pytestmark = pytest.mark.unit


@pytest.fixture
def setup(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Path, dict, dict, Path]]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    shared = tmp_path / "corpora"
    (shared / "wiki").mkdir(parents=True)
    (shared / "wiki" / "a.txt").write_text("shared text " * 50)
    settings = Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage,
                        shared_data_roots={"corpora": str(shared)}, data_max_files=20, data_max_bytes=1 << 20)
    app = create_app(settings, ApiSettings(metrics_cache_s=0, fit_check=False))
    with TestClient(app) as c:
        ta, a = make_tenant(c, "data-a", submit_per_minute=1000)
        tb, b = make_tenant(c, "data-b", submit_per_minute=1000)
        area_a, area_b = tenant_area(storage, ta), tenant_area(storage, tb)
        for area in (area_a, area_b):
            (area / "corpus").mkdir(parents=True)
            (area / "corpus" / "one.txt").write_text("hello world " * 100)
        (area_b / "secret.txt").write_text("tenant b's secret")
        ckpt = checkpoint_root(storage) / "1" / "checkpoints"
        ckpt.mkdir(parents=True)
        (ckpt / "meta.json").write_text("{}")
        outside = tmp_path / "outside.txt"
        outside.write_text("outside")
        os.symlink(outside, area_a / "link-out.txt")
        os.symlink(tmp_path / "missing.txt", area_a / "link-missing.txt")
        os.symlink(area_b, area_a / "b-area")
        os.symlink(ckpt, area_a / "ckpt")
        os.symlink("/", area_a / "root")
        many = area_a / "many"
        many.mkdir()
        for i in range(30):
            (many / f"{i}.txt").write_text("x")
        (area_a / "big.txt").write_bytes(b"y" * (2 << 20))
        yield c, tmp_path, a, b, area_a


def _submit(c: TestClient, headers: dict, paths: list[str]) -> tuple[int, dict]:
    r = c.post("/v1/jobs", json=job_body(data={"kind": "text", "paths": paths}), headers=headers)
    return r.status_code, r.json()


HOSTILE = [
    "/etc/passwd", "/proc/self/environ", "~/.bashrc", "~root/x", "../2/data/secret.txt", "corpus/../../2/data/x",
    "/**", "/**/*.db", "**/../../**", "link-out.txt", "link-missing.txt", "b-area/secret.txt", "b-area",
    "ckpt/meta.json", "ckpt", "root/etc/passwd", "root/**", "s3://bucket/x", "gs://bucket/x", "file:///etc/passwd",
    "shared:nope/a.txt", "shared:corpora/../outside.txt", "many/*.txt", "many", "big.txt", "nothing-here.txt",
]


def test_hostile_paths_are_422_and_create_nothing(setup) -> None:
    c, tmp, a, _, _ = setup
    for path in HOSTILE:
        code, body = _submit(c, a, ["corpus/one.txt", path])
        assert code == 422, (path, body)
        (err,) = body["detail"]
        assert err["loc"] == ["body", "data", "paths", 1], (path, err)
        msg = err["msg"]
        for leak in (str(tmp), "outside.txt", "secret", "passwd", "environ", "bytes,", "tokens"):
            assert leak not in msg, (path, msg)
    assert c.get("/v1/jobs", headers=a).json()["items"] == []


def test_messages_are_no_oracle(setup) -> None:
    c, _, a, _, _ = setup
    # a link to an existing file outside and one to a missing file answer the same
    assert _submit(c, a, ["link-out.txt"])[1] == _submit(c, a, ["link-missing.txt"])[1]
    assert _submit(c, a, ["/etc/passwd"])[1] == _submit(c, a, ["/etc/no-such-file"])[1]


def test_own_area_and_shared_roots_are_allowed(setup) -> None:
    c, _, a, b, _ = setup
    for paths in (["corpus/one.txt"], ["corpus"], ["corpus/*.txt"], ["**/one.txt"], ["shared:corpora/wiki"],
                  ["shared:corpora/**/*.txt", "corpus/one.txt"]):
        code, body = _submit(c, a, paths)
        assert code == 201, (paths, body)
    # tenant b's "secret.txt" is in b's area, so b may use it and a may not
    assert _submit(c, b, ["secret.txt"])[0] == 201
    assert _submit(c, a, ["secret.txt"])[0] == 422


def test_engine_enforces_again(setup, tmp_path: Path) -> None:
    """Defence in depth: a path that was fine at submission is swapped for a symlink out of the area
    before the engine reads; the engine refuses it with the same message."""
    from workers.engine.data import build_dataset

    _, tmp, _, _, area_a = setup
    area = DataArea(root=area_a, max_files=20, max_bytes=1 << 20)
    cfg = {"kind": "text", "paths": ["corpus/swap.txt"], "area": area.to_dict()}
    (area_a / "corpus" / "swap.txt").write_text("fine " * 100)
    assert len(build_dataset(cfg, seq_len=8)) > 0
    (area_a / "corpus" / "swap.txt").unlink()
    os.symlink(tmp / "outside.txt", area_a / "corpus" / "swap.txt")
    with pytest.raises(DataPathError, match="resolves outside your data area"):
        build_dataset(cfg, seq_len=8)
    with pytest.raises(DataPathError, match="relative"):
        build_dataset({**cfg, "paths": ["/proc/self/environ"]}, seq_len=8)
    files = resolve_data_paths(["**"], DataArea(root=area_a / "many", max_files=40, max_bytes=1 << 20))
    assert len(files) == 30 and all(p.is_relative_to((area_a / "many").resolve()) for p in files)


def test_controller_hands_the_engine_the_tenant_area(tmp_path: Path) -> None:
    import types

    from service.controller.apply import supervisor_spec
    from service.controller.cluster_snapshot import JobRow
    from service.controller.context import ControllerConfig
    from workers.runtime.contract.job_spec import parse_job

    spec = {"model": "tiny", "global_batch": 8, "steps": 4, "min_gpus": 1, "max_gpus": 1,
            "data": {"kind": "text", "paths": ["corpus"]}}
    job = JobRow(id=7, tenant_id=5, name="j", state="PENDING", priority=0, min_gpus=1, max_gpus=1, attempt=1,
                 epoch=0, cancel_requested=False, gpus_allocated=0, spec=spec, created_at=0.0, admitted_at=None)
    ctx = types.SimpleNamespace(gpu_type="CPU", config=ControllerConfig(storage_path=tmp_path),
                                job_storage=lambda job_id: tmp_path / "jobs" / str(job_id),
                                recoveries={}, gpus_per_node=None)  # the job's recovery is planned here
    out = supervisor_spec(ctx, job, gpus=1)
    assert out["data"]["area"]["root"] == str(tenant_area(tmp_path, 5))
    assert not Path(out["checkpoint_dir"]).is_relative_to(tmp_path / "tenants")
    assert "'root': '" + str(tenant_area(tmp_path, 5)) in repr(parse_job(out))
