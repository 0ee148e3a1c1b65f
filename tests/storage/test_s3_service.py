"""The service end to end on ``ORTHOPLEX_STORAGE_PATH=s3://...`` (the session S3 server, the session Ray
cluster, a fresh Postgres database), as the getting-started guide uses it: tenants, data, a job.

- A 64 MiB file is uploaded and downloaded back, streamed both ways, byte for byte the same, while
  the API process's peak memory grows by less than a quarter of it (it is never held whole).
- Each tenant reaches only its own prefix: another tenant neither lists nor reads the file, a
  forged path (``..``) is refused, a job naming another tenant's data is refused at submission.
- A job reads its data from the tenant's prefix, checkpoints to ``jobs/<id>/checkpoints`` on the
  object store (each with its commit marker), writes TensorBoard files there, and SUCCEEDS; its
  artifacts are listed and downloaded through the API; another tenant gets 404.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller import helpers as h
from tests.e2e.test_service_e2e import Service
from workers import object_store

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.cluster, pytest.mark.s3]

BIG = 64 << 20
CHUNK = 1 << 20


def _chunks() -> Iterator[bytes]:
    for i in range(BIG // CHUNK):
        yield hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.timeout(600)
def test_the_service_on_s3_storage(ray_cluster, empty_db_url: str, s3_bucket: str, tmp_path: Path) -> None:
    storage = f"{s3_bucket}/orthoplex"
    svc = Service(empty_db_url, ray_cluster.address, tmp_path, storage=storage,
                  extra_env={"ORTHOPLEX_UPLOAD_MAX_BYTES": str(2 * BIG)})
    try:
        svc.wait_ready()
        acme, beta = svc.tenant("acme", quota=2), svc.tenant("beta", quota=2)
        acme_id = next(t["id"] for t in svc.admin.get("/v1/tenants").json()["items"] if t["name"] == "acme")

        # a round trip of a 12 MiB file first (the API process loads the object store's client and
        # allocates its part buffers once), then a 64 MiB one, streamed up and back down: the API
        # process never holds it whole (its peak memory grows by less than a quarter of it)
        corpus = (Path(h.REPO) / "README.md").read_bytes()
        assert acme.put("/v1/data/corpus/readme.txt", content=corpus).status_code == 201
        warm = b"w" * (12 << 20)
        assert acme.put("/v1/data/warm.bin", content=warm).status_code == 201
        assert acme.get("/v1/data/warm.bin").content == warm
        assert acme.delete("/v1/data/warm.bin").status_code == 204
        want = hashlib.sha256(b"".join(_chunks())).hexdigest()
        before = _peak_rss(svc.proc.pid)
        r = acme.put("/v1/data/big/blob.bin", content=_chunks(), timeout=300)
        assert r.status_code == 201 and r.json() == {"path": "big/blob.bin", "bytes": BIG}, r.text
        assert object_store.size(f"{storage}/tenants/{acme_id}/data/big/blob.bin") == BIG
        up = _peak_rss(svc.proc.pid) - before
        got = hashlib.sha256()
        with acme.stream("GET", "/v1/data/big/blob.bin", timeout=300) as resp:
            assert resp.status_code == 200 and int(resp.headers["content-length"]) == BIG
            for part in resp.iter_bytes():
                got.update(part)
        assert got.hexdigest() == want
        grown = _peak_rss(svc.proc.pid) - before
        assert grown < BIG // 4, f"the API's peak memory grew by {grown} bytes ({up} by the upload) for a {BIG}-byte file"

        # each tenant only its own prefix
        listed = {f["path"] for f in acme.get("/v1/data").json()["items"]}
        assert listed == {"big/blob.bin", "corpus/readme.txt"}, listed
        assert beta.get("/v1/data").json()["items"] == []
        assert beta.get("/v1/data/big/blob.bin").status_code == 404
        assert beta.delete("/v1/data/big/blob.bin").status_code == 404
        forged = beta.get(f"/v1/data/corpus/%2E%2E/%2E%2E/{acme_id}/data/big/blob.bin")
        assert forged.status_code == 422 and "'..'" in forged.text, forged.text
        job = {**h.tiny_spec(6, every=2), "name": "s3-job", "min_gpus": 2, "max_gpus": 2,
               "data": {"kind": "text", "paths": ["corpus"]}}
        refused = beta.post("/v1/jobs", json={**job, "data": {"kind": "text", "paths": [f"../{acme_id}/data/corpus"]}})
        assert refused.status_code == 422 and "data" in refused.text, refused.text

        # a job on the object store, end to end
        r = acme.post("/v1/jobs", json=job)
        assert r.status_code == 201, r.text
        jid = r.json()["id"]

        def done() -> str | None:
            state = acme.get(f"/v1/jobs/{jid}").json()["state"]
            assert state not in ("FAILED", "CANCELLED"), acme.get(f"/v1/jobs/{jid}/events").text[-3000:]
            return state == "SUCCEEDED" and state

        h.wait_for(done, 400, "the job on s3:// storage to succeed", interval_s=1.0)
        events = acme.get(f"/v1/jobs/{jid}/events", params={"limit": 1000}).json()
        assert any(e["type"] == "checkpoint" for e in events), events
        keys = object_store.find(f"{storage}/jobs/{jid}/checkpoints")
        prefixes = {k.split("/")[0] for k in keys if k.startswith("step-")}
        assert prefixes and all(f"{p}/manifest.json" in keys for p in prefixes), keys
        arts = acme.get(f"/v1/jobs/{jid}/artifacts").json()
        assert arts["checkpoints"] and arts["tensorboard"] == "tensorboard", arts
        board = next(i["path"] for i in arts["items"] if i["kind"] == "tensorboard")
        dl = acme.get(f"/v1/jobs/{jid}/artifacts/{board}")
        assert dl.status_code == 200 and dl.content == object_store.read_bytes(f"{storage}/jobs/{jid}/{board}")
        assert beta.get(f"/v1/jobs/{jid}/artifacts").status_code == 404
        assert beta.get(f"/v1/jobs/{jid}/artifacts/{board}").status_code == 404

        assert acme.delete("/v1/data/big/blob.bin").status_code == 204
        assert object_store.file_size(f"{storage}/tenants/{acme_id}/data/big/blob.bin") is None
    finally:
        svc.stop()
    log = svc.log_path.read_text()
    assert "Traceback" not in log, log[-4000:]
