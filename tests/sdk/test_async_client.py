"""``orthoplex.AsyncClient`` against a real ``orthoplex serve`` on SQLite and PostgreSQL: the
same calls as ``Client``, awaited (each test drives one event loop with ``asyncio.run``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orthoplex import (
    AsyncClient,
    Conflict,
    Invalid,
    JobFailed,
    NotFound,
    Retry,
    ServiceUnavailable,
    WaitTimeout,
)
from orthoplex.models import Job, PlanOut
from tests.sdk.conftest import SSE_MAX_S, Service
from tests.sdk.proxy import FaultProxy
from tests.sdk.test_client import SPEC, in_background, run_job

FAST = Retry(attempts=4, base=0.05, cap=0.2)


def test_async_jobs_events_and_wait(service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    _, token = service.tenant(gpu_quota=2)

    async def main() -> None:
        async with AsyncClient(service.url, token) as c:
            job = await c.submit(SPEC)
            assert isinstance(job, Job) and (await c.get(job.id)) == job
            other = await c.submit({**SPEC, "name": "other"})
            listed = await c.list(limit=1)
            assert [j.id for j in listed.items] == [other.id]
            assert [j.id for j in (await c.list(page=listed.next_cursor)).items] == [job.id]
            assert (await c.cancel(other)).state == "CANCELLED"
            with pytest.raises(Conflict):
                await c.cancel(other)
            assert [e.type async for e in c.events(other, follow=False)] == ["submitted", "transition"]
            assert isinstance(await c.plan(SPEC), PlanOut)
            assert (await c.cluster()).jobs == []
            worker = in_background(run_job, service, job.id, 6, pause_s=SSE_MAX_S * 0.5)
            stream = c.events(job, progress=True)
            followed = [e async for e in stream]
            worker.join()
            assert stream.state == "SUCCEEDED" and stream.reconnects >= 1
            assert [e.id for e in followed] == [e.id async for e in c.events(job, follow=False)]
            done = await c.wait(job, timeout=30, progress=True, poll_s=0.1)
            assert done.state == "SUCCEEDED" and done.final_step == 6
            assert [m.step for m in await c.metrics(job)] == [1, 2, 3, 4, 5, 6]
            assert [m.step for m in await c.recent_metrics(job, rows=2)] == [5, 6]
            with pytest.raises(JobFailed) as failed:
                await c.wait(other)
            assert failed.value.state == "CANCELLED"
            slow = await c.submit({**SPEC, "name": "slow"})
            with pytest.raises(WaitTimeout):
                await c.wait(slow, timeout=0.2, poll_s=0.05)
            with pytest.raises(NotFound):
                await c.get(2_000_000_000)
            with pytest.raises(Invalid) as bad:
                await c.submit({**SPEC, "min_gpus": 4, "max_gpus": 2})
            assert bad.value.field == "max_gpus" and bad.value.status == 422

    asyncio.run(main())
    assert "6/6" in capsys.readouterr().out


def test_async_data_artifacts_and_admin(service: Service, tmp_path: Path) -> None:
    from workers.data_area import checkpoint_root

    src = tmp_path / "tokens.bin"
    src.write_bytes(b"\1\2" * 700_000)

    async def main() -> None:
        async with AsyncClient(service.url, service.admin_token) as admin:
            t = await admin.admin.create_tenant(f"async-{service.backend}", gpu_quota=1)
            assert (await admin.admin.get_tenant(t.id)).name == t.name
            assert (await admin.admin.update_tenant(t.id, weight=3.0)).weight == 3.0
            assert t.id in [x.id for x in (await admin.admin.list_tenants(limit=100)).items]
            tok = await admin.admin.create_token(t.id, "async")
        async with AsyncClient(service.url, tok.token) as c:
            seen: list[int] = []
            up = await c.data.upload(src, "bin/tokens.bin", progress=lambda d, t: seen.append(d))
            assert up.bytes == src.stat().st_size and seen[-1] == up.bytes
            assert [f.path for f in (await c.data.list()).items] == ["bin/tokens.bin"]
            back = await c.data.download("bin/tokens.bin", tmp_path / "back.bin")
            assert back.read_bytes() == src.read_bytes()
            await c.data.rm("bin/tokens.bin")
            with pytest.raises(NotFound):
                await c.data.rm("bin/tokens.bin")
            job = await c.submit(SPEC)
            export = checkpoint_root(service.storage) / str(job.id) / "export"
            export.mkdir(parents=True)
            (export / "config.json").write_text("{}")
            assert (await c.artifacts(job)).export == "export"
            files = await c.download_artifacts(job, "export", tmp_path / "exp")
            assert [p.name for p in files] == ["config.json"]
            one = await c.download_artifact(job, "export/config.json", tmp_path / "c.json")
            assert one.read_text() == "{}"
        async with AsyncClient(service.url, service.admin_token) as admin:
            await admin.admin.revoke_token(tok.id)
            with pytest.raises(NotFound):
                await admin.admin.revoke_token(tok.id)

    asyncio.run(main())


def test_async_lost_answer_gives_one_job(service: Service) -> None:
    _, token = service.tenant()
    proxy = FaultProxy(service.server.port)

    async def main() -> None:
        async with AsyncClient(proxy.url, token, retry=FAST) as c:
            proxy.inject("POST /v1/jobs ", "drop")
            job = await c.submit(SPEC)
            assert proxy.count("POST /v1/jobs ") == 2
            assert [j.id for j in (await c.list()).items] == [job.id]
            proxy.inject("GET /v1/jobs/", "status", times=10)
            with pytest.raises(ServiceUnavailable):
                await c.get(job)
            assert proxy.count(f"GET /v1/jobs/{job.id} ") == FAST.attempts

    try:
        asyncio.run(main())
    finally:
        proxy.close()
