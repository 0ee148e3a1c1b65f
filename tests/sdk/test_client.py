"""``orthoplex.Client`` against a real ``orthoplex serve`` on SQLite and PostgreSQL: every method,
every typed error, following a job across the server's stream limit, and the retry rules (a
submission whose answer was lost is sent again with its Idempotency-Key and gives one job; a call
that may not be repeated is not)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import orthoplex
from orthoplex import (
    Client,
    Conflict,
    Invalid,
    JobFailed,
    NotFound,
    RateLimited,
    Retry,
    ServiceUnavailable,
    Unauthorized,
    WaitTimeout,
)
from orthoplex.models import DataFile, Job, JobSpec, MetricPublic, PlanOut
from service.db import transitions as tr
from tests.sdk.conftest import SSE_MAX_S, Service
from tests.sdk.proxy import FaultProxy

SPEC = {"name": "sdk-job", "model": "tiny", "steps": 6, "global_batch": 4, "min_gpus": 1, "max_gpus": 2}
FAST = Retry(attempts=4, base=0.05, cap=0.2)


def run_job(service: Service, job: int, steps: int, *, pause_s: float = 0.0, fail: bool = False) -> None:
    """What the controller records for a job that trains ``steps`` steps, then ends."""
    with service.sessions() as s:
        epoch = tr.start_attempt(s, job, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="admitted")
        assert epoch == 1
        assert tr.transition(s, job, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="placed",
                             fields={"gpus_allocated": 2})
        tr.record_event(s, job, epoch=1, source="a1", seq=0, type="plan",
                        payload={"layout": {"tp": 1, "pp": 1, "cp": 1, "dp": 2}, "world_size": 2})
    for step in range(1, steps + 1):
        time.sleep(pause_s)
        with service.sessions() as s:
            tr.record_metric(s, job, epoch=1, step=step, loss=4.0 / step, tokens_per_s=1000.0)
            tr.record_event(s, job, epoch=1, source="a1", seq=step, type="checkpoint", payload={"step": step})
    with service.sessions() as s:
        new = "FAILED" if fail else "SUCCEEDED"
        assert tr.transition(s, job, expected={"RUNNING"}, new=new, epoch=1,
                             reason="worker died" if fail else "done",
                             fields={"final_loss": 4.0 / steps, "final_step": steps})


def in_background(fn: object, *args: object, **kw: object) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, kwargs=kw, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


def test_jobs_round_trip(service: Service, tmp_path: Path) -> None:
    _, token = service.tenant(gpu_quota=2)
    with Client(service.url, token) as c:
        job = c.submit(SPEC)
        assert isinstance(job, Job) and job.state == "PENDING" and job.name == "sdk-job"
        assert repr(job).startswith(f"Job(id={job.id}, name='sdk-job', state=PENDING")
        as_model = c.submit(JobSpec.model_validate({**SPEC, "name": "from-model"}))
        path = tmp_path / "job.yaml"
        path.write_text("name: from-file\nmodel: tiny\nsteps: 3\nglobal_batch: 4\n")
        from_file = c.submit(path)
        assert (as_model.name, from_file.name, from_file.spec["steps"]) == ("from-model", "from-file", 3)
        assert c.get(job.id) == job and c.get(job).id == job.id
        first = c.list(limit=2)
        assert [j.id for j in first.items] == [from_file.id, as_model.id] and first.next_cursor is not None
        rest = c.list(limit=2, page=first.next_cursor)
        assert [j.id for j in rest.items] == [job.id] and all(isinstance(j, Job) for j in rest.items)
        assert [j.id for j in c.list(state="pending").items] == [from_file.id, as_model.id, job.id]
        cancelled = c.cancel(as_model)
        assert cancelled.state == "CANCELLED" and cancelled.ended
        assert [j.id for j in c.list(state="CANCELLED").items] == [as_model.id]
        events = list(c.events(as_model, follow=False))
        assert [e.type for e in events] == ["submitted", "transition"]
        stream = c.events(as_model)  # follow: ends at once, the job has ended
        assert [e.id for e in stream] == [e.id for e in events] and stream.state == "CANCELLED"
        assert list(c.events(as_model, follow=False, since=events[0].id)) == events[1:]
        assert c.metrics(job) == []
        plan = c.plan(SPEC, top_k=2)
        assert isinstance(plan, PlanOut) and 1 <= len(plan.plans) <= 2 and plan.gpus in (1, 2)
        assert c.cluster().jobs == []
        assert c.artifacts(job).items == []


def test_wait_metrics_and_progress(service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    _, token = service.tenant(gpu_quota=2)
    with Client(service.url, token) as c:
        job = c.submit(SPEC)
        worker = in_background(run_job, service, job.id, 6, pause_s=0.3)
        done = c.wait(job, timeout=120, progress=True, poll_s=0.2)
        worker.join()
        assert done.state == "SUCCEEDED" and done.final_step == 6 and done.final_loss == pytest.approx(4.0 / 6)
        rows = c.metrics(job)
        assert [m.step for m in rows] == [1, 2, 3, 4, 5, 6] and isinstance(rows[0], MetricPublic)
        assert rows[0].loss == pytest.approx(4.0) and rows[-1].tokens_per_s == pytest.approx(1000.0)
        assert [m.step for m in c.metrics(job, since_step=4)] == [5, 6]
        assert [m.step for m in c.recent_metrics(job, rows=2)] == [5, 6]
        out = capsys.readouterr().out
        assert f"job {job.id} sdk-job" in out and "6/6" in out and "loss 0.6667" in out and "SUCCEEDED" in out
        # a job that fails: wait raises JobFailed with its final state and reason
        bad = c.submit({**SPEC, "name": "doomed"})
        in_background(run_job, service, bad.id, 2, fail=True).join()
        with pytest.raises(JobFailed) as failed:
            c.wait(bad, timeout=60, poll_s=0.1)
        assert failed.value.state == "FAILED" and failed.value.reason == "worker died"
        assert failed.value.job.id == bad.id
        slow = c.submit({**SPEC, "name": "slow"})
        with pytest.raises(WaitTimeout) as waited:
            c.wait(slow, timeout=0.3, poll_s=0.1)
        assert isinstance(waited.value, TimeoutError) and waited.value.job.state == "PENDING"


def test_events_follow_reconnects_after_the_stream_limit(service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    _, token = service.tenant(gpu_quota=2)
    with Client(service.url, token) as c:
        job = c.submit(SPEC)
        # the job runs for several of the server's stream limits (SSE_MAX_S)
        worker = in_background(run_job, service, job.id, 6, pause_s=SSE_MAX_S * 0.6)
        stream = c.events(job, progress=True)
        followed = list(stream)
        worker.join()
        assert stream.state == "SUCCEEDED" and stream.reconnects >= 1, stream
        listed = list(c.events(job, follow=False))
        assert [e.id for e in followed] == [e.id for e in listed]  # none lost, none repeated
        assert [e.type for e in followed].count("checkpoint") == 6 and followed[-1].type == "transition"
        assert "6/6" in capsys.readouterr().out


def test_typed_errors(service: Service, tmp_path: Path) -> None:
    tid, token = service.tenant(gpu_quota=2, submit_per_minute=3)
    with Client(service.url, token, retry=FAST) as c:
        with pytest.raises(NotFound) as nf:
            c.get(2_000_000_000)
        assert nf.value.status == 404 and "job not found" in str(nf.value)
        job = c.submit(SPEC, idempotency_key="k-1")
        c.cancel(job)
        with pytest.raises(Conflict) as cf:
            c.cancel(job)
        assert cf.value.status == 409 and "already ended" in cf.value.message
        with pytest.raises(Conflict):  # the key names another spec
            c.submit({**SPEC, "steps": 7}, idempotency_key="k-1")
        with pytest.raises(Invalid) as local:  # found before sending, by the API's own schema
            c.submit({**SPEC, "steps": 0})
        assert local.value.status is None and local.value.field == "steps"
        with pytest.raises(Invalid) as bad_file:
            c.submit(tmp_path / "missing.yaml")
        assert bad_file.value.field == "spec"
        with pytest.raises(Invalid) as server:  # the server's cross-field rule
            c.submit({**SPEC, "min_gpus": 4, "max_gpus": 2})
        assert server.value.status == 422 and server.value.field == "max_gpus"
        assert "must be >= min_gpus" in server.value.message
        with pytest.raises(Invalid) as area:  # only the tenant's data area can tell
            c.submit({**SPEC, "model": {"hf": "no-such-dir"}})
        assert area.value.status == 422 and area.value.field == "model.hf"
        with pytest.raises(RateLimited) as rl:  # 3 submissions a minute; refused ones count
            c.submit(SPEC)
        assert rl.value.status == 429 and rl.value.retry_after is not None and rl.value.retry_after > 0
        with pytest.raises(Unauthorized) as forbidden:  # a tenant's token on an admin call
            c.admin.list_tenants()
        assert forbidden.value.status == 403
    with Client(service.url, "not-a-token") as c, pytest.raises(Unauthorized) as unauth:
        c.list()
    assert unauth.value.status == 401
    from tests.service.live import free_port

    with Client(f"http://127.0.0.1:{free_port()}", token, retry=FAST) as c, \
            pytest.raises(ServiceUnavailable) as down:
        c.get(job)
    assert down.value.status is None and "cannot reach" in str(down.value)
    assert all(issubclass(e, orthoplex.OrthoplexError) for e in (NotFound, Conflict, Invalid, RateLimited,
                                                                 Unauthorized, ServiceUnavailable, JobFailed))
    with Client(service.url, service.admin_token) as admin, pytest.raises(Invalid) as bad_name:
        admin.admin.create_tenant("Bad Name!")
    assert bad_name.value.field == "name" and bad_name.value.status is None
    assert tid > 0


def test_admin_tenants_and_tokens(service: Service) -> None:
    with Client(service.url, service.admin_token) as admin:
        t = admin.admin.create_tenant(f"adm-{service.backend}", gpu_quota=3, weight=2.0)
        assert (t.gpu_quota, t.weight) == (3, 2.0)
        with pytest.raises(Conflict):
            admin.admin.create_tenant(f"adm-{service.backend}")
        assert admin.admin.get_tenant(t.id) == t
        assert admin.admin.update_tenant(t.id, max_jobs=7).max_jobs == 7
        page = admin.admin.list_tenants(limit=1)
        assert len(page.items) == 1 and page.next_cursor is not None
        everyone = admin.admin.list_tenants(limit=100).items
        assert t.id in [x.id for x in everyone]
        tok = admin.admin.create_token(t.id, "ci", expires_in_days=None)
        assert tok.expires_at is None and tok.token.startswith(tok.prefix)
        with Client(service.url, tok.token) as c:
            assert c.list().items == []
            admin.admin.revoke_token(tok.id)
            with pytest.raises(Unauthorized):
                c.list()
        with pytest.raises(NotFound):
            admin.admin.revoke_token(tok.id)
        with pytest.raises(NotFound):
            admin.admin.get_tenant(2_000_000_000)


def test_data_area(service: Service, tmp_path: Path) -> None:
    _, token = service.tenant()
    src = tmp_path / "corpus.txt"
    src.write_bytes(bytes(range(256)) * 12_000)  # 3 MiB: several chunks
    seen: list[tuple[int, int]] = []
    with Client(service.url, token) as c:
        up = c.data.upload(src, "texts/corpus.txt", progress=lambda done, total: seen.append((done, total)))
        assert up == DataFile(path="texts/corpus.txt", bytes=src.stat().st_size)
        assert seen[-1] == (src.stat().st_size, src.stat().st_size) and len(seen) >= 3
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        assert c.data.upload(src).path == "corpus.txt"  # the file's name by default
        listing = c.data.list()
        assert sorted(f.path for f in listing.items) == ["corpus.txt", "texts/corpus.txt"]
        assert listing.used_bytes == 2 * src.stat().st_size
        got: list[int] = []
        back = c.data.download("texts/corpus.txt", tmp_path / "out" / "back.txt", progress=lambda d, t: got.append(d))
        assert back.read_bytes() == src.read_bytes() and got[-1] == src.stat().st_size
        c.data.rm("corpus.txt")
        with pytest.raises(NotFound):
            c.data.rm("corpus.txt")
        with pytest.raises(NotFound):
            c.data.download("corpus.txt", tmp_path / "never.txt")
        assert not (tmp_path / "never.txt").exists() and not (tmp_path / "never.txt.part").exists()
        with pytest.raises(Invalid) as outside:  # the server's rule, before sending
            c.data.upload(src, "../escape.txt")
        assert outside.value.field == "path" and "inside your data area" in outside.value.message
        assert [f.path for f in c.data.list().items] == ["texts/corpus.txt"]


def test_artifacts_download(service: Service, tmp_path: Path) -> None:
    from workers.data_area import checkpoint_root

    _, token = service.tenant()
    with Client(service.url, token) as c:
        job = c.submit(SPEC)
        export = checkpoint_root(service.storage) / str(job.id) / "export"  # what the job's export step writes
        export.mkdir(parents=True)
        (export / "config.json").write_text('{"model_type": "llama"}')
        (export / "model.safetensors").write_bytes(b"\0" * 1000)
        listing = c.artifacts(job)
        assert listing.export == "export" and len(listing.items) == 2
        files = c.download_artifacts(job, "export", tmp_path / "model")
        assert sorted(p.name for p in files) == ["config.json", "model.safetensors"]
        assert (tmp_path / "model" / "config.json").read_text() == '{"model_type": "llama"}'
        one = c.download_artifact(job, "export/model.safetensors", tmp_path / "one.bin")
        assert one.stat().st_size == 1000
        with pytest.raises(NotFound) as none:
            c.download_artifacts(job, "checkpoints", tmp_path / "ck")
        assert none.value.status is None


def test_a_submission_whose_answer_was_lost_gives_one_job(service: Service) -> None:
    _, token = service.tenant()
    proxy = FaultProxy(service.server.port)
    try:
        proxy.inject("POST /v1/jobs ", "drop")  # the server creates the job; its answer never arrives
        with Client(proxy.url, token, retry=FAST) as c:
            job = c.submit(SPEC)
            assert proxy.count("POST /v1/jobs ") == 2  # sent again, with the same key
            assert [j.id for j in c.list().items] == [job.id]
            # without retries the caller learns the answer was lost; the server still made one job
            with Client(proxy.url, token, retry=Retry(attempts=1)) as once:
                proxy.inject("POST /v1/jobs ", "drop")
                with pytest.raises(ServiceUnavailable):
                    once.submit({**SPEC, "name": "lost"}, idempotency_key="lost-1")
                again = once.submit({**SPEC, "name": "lost"}, idempotency_key="lost-1")  # the caller retries
            assert [j.id for j in c.list().items] == [again.id, job.id]
    finally:
        proxy.close()


def test_retries_on_503_only_for_calls_that_may_be_repeated(service: Service) -> None:
    _, token = service.tenant()
    proxy = FaultProxy(service.server.port)
    try:
        with Client(proxy.url, token, retry=FAST) as c:
            job = c.submit(SPEC)
            proxy.inject("GET /v1/jobs/", "status", times=2)
            assert c.get(job).id == job.id and proxy.count(f"GET /v1/jobs/{job.id} ") == 3
            proxy.inject("GET /v1/jobs/", "status", times=10)
            with pytest.raises(ServiceUnavailable) as gave_up:
                c.get(job)
            assert gave_up.value.status == 503 and proxy.count(f"GET /v1/jobs/{job.id} ") == 3 + FAST.attempts
            proxy.faults.clear()
        with Client(proxy.url, service.admin_token, retry=FAST) as admin:
            proxy.inject("POST /v1/tenants ", "status")
            with pytest.raises(ServiceUnavailable):  # creating a tenant is not repeated
                admin.admin.create_tenant(f"once-{service.backend}")
            assert proxy.count("POST /v1/tenants ") == 1
    finally:
        proxy.close()


def test_cli_has_no_http_code_of_its_own() -> None:
    import service.cli

    root = Path(service.cli.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "import httpx" not in text and "urllib.request" not in text, path
