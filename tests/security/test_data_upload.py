"""Data into and out of a tenant's area over the API: uploads stream to disk under a size limit
and a quota and land atomically; paths out of the area, into the temporary folder or into a shared
root are 422; a tenant never reaches another tenant's files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant
from workers.data_area import tenant_area

pytestmark = pytest.mark.unit
LIMIT = 3 << 20
QUOTA = 5 << 20


@pytest.fixture
def env(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Path, dict, dict, int]]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    settings = Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage,
                        upload_max_bytes=LIMIT, tenant_quota_bytes=QUOTA)
    with TestClient(create_app(settings, ApiSettings(metrics_cache_s=0, fit_check=False))) as c:
        ta, a = make_tenant(c, "up-a", submit_per_minute=1000)
        _, b = make_tenant(c, "up-b", submit_per_minute=1000)
        yield c, storage, a, b, ta


def _files(area: Path) -> list[str]:
    return sorted(p.relative_to(area).as_posix() for p in area.rglob("*") if p.is_file())


def test_upload_list_download_use_delete(env) -> None:
    c, storage, a, b, ta = env
    body = os.urandom(2 << 20)  # over the 1 MiB cap of JSON bodies: uploads stream instead

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1 << 16):
            yield body[i:i + (1 << 16)]

    r = c.put("/v1/data/corpus/part-0.txt", content=chunks(), headers=a)
    assert r.status_code == 201, r.text
    assert r.json() == {"path": "corpus/part-0.txt", "bytes": len(body)}
    listing = c.get("/v1/data", headers=a).json()
    assert [f["path"] for f in listing["items"]] == ["corpus/part-0.txt"] and listing["used_bytes"] == len(body)
    assert c.get("/v1/data/corpus/part-0.txt", headers=a).content == body
    assert c.post("/v1/jobs", json=job_body(data={"kind": "text", "paths": ["corpus"]}), headers=a).status_code == 201
    # tenant b sees nothing of it
    assert c.get("/v1/data", headers=b).json()["items"] == []
    assert c.get("/v1/data/corpus/part-0.txt", headers=b).status_code == 404
    assert c.post("/v1/jobs", json=job_body(data={"kind": "text", "paths": ["corpus"]}), headers=b).status_code == 422
    # replace atomically, then delete
    assert c.put("/v1/data/corpus/part-0.txt", content=b"new", headers=a).json()["bytes"] == 3
    assert c.get("/v1/data/corpus/part-0.txt", headers=a).content == b"new"
    assert c.delete("/v1/data/corpus/part-0.txt", headers=a).status_code == 204
    assert c.delete("/v1/data/corpus/part-0.txt", headers=a).status_code == 404
    assert _files(tenant_area(storage, ta)) == []


def test_hostile_uploads_change_nothing(env, tmp_path: Path) -> None:
    c, storage, a, _, ta = env
    area = tenant_area(storage, ta)
    area.mkdir(parents=True)
    os.symlink(tmp_path, area / "out")
    for path in ("../x.txt", "%2E%2E/x.txt", "corpus/../../x.txt", "~/x", ".uploads/x", "shared:corpora/x",
                 "out/x.txt", "a*.txt"):
        r = c.put(f"/v1/data/{path}", content=b"x", headers=a)
        assert r.status_code in (404, 422), (path, r.status_code, r.text)
        if r.status_code == 422:
            assert r.json()["detail"][0]["loc"] == ["path", "path"]
    assert not (tmp_path / "x.txt").exists() and not (storage / "tenants" / "x.txt").exists()
    assert c.get("/v1/data/out/../../x", headers=a).status_code in (404, 422)
    # over the single-upload limit, and over the quota: 413, nothing written, no temporary file left
    r = c.put("/v1/data/big.bin", content=iter([b"z" * (1 << 20)] * 4), headers=a)
    assert r.status_code == 413, r.text
    assert c.put("/v1/data/one.bin", content=b"z" * (3 << 20), headers=a).status_code == 201
    r = c.put("/v1/data/two.bin", content=iter([b"z" * (1 << 20)] * 3), headers=a)
    assert r.status_code == 413 and "quota" in r.json()["detail"], r.text
    assert c.put("/v1/data/one.bin/under-a-file", content=b"x", headers=a).status_code == 409
    assert c.put(f"/v1/data/{'n' * 300}", content=b"x", headers=a).status_code == 422
    assert _files(area) == ["one.bin"]
