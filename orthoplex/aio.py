"""``orthoplex.AsyncClient``: :class:`orthoplex.Client` for asyncio, method for method (the same
calls, retries, typed errors and event cursor; ``events`` is an async iterator)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from orthoplex import _calls as calls
from orthoplex._calls import PAGE, JobRef, SpecLike, job_id
from orthoplex._transport import Call, Retry, SSEParser, error, headers, settings, unreachable
from orthoplex.client import CHUNK, POLL_S, RECONNECT_S, ProgressCallback
from orthoplex.errors import JobFailed, NotFound, ServiceUnavailable, Unauthorized, WaitTimeout
from orthoplex.models import (
    Artifacts,
    ClusterOut,
    DataFile,
    DataList,
    EventPublic,
    Job,
    JobList,
    JobState,
    MetricPublic,
    NodeDrainOut,
    PlanOut,
    TenantList,
    TenantPublic,
    TokenCreated,
)
from orthoplex.progress import JobProgress, ProgressBar

T = TypeVar("T")


class AsyncClient:
    """The Orthoplex REST API for asyncio; see :class:`orthoplex.Client` (``await`` each call,
    ``async for`` over :meth:`events`, ``async with`` or ``await aclose()``)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retry: Retry | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url, self.token = settings(url, token)
        self.retry = retry or Retry()
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers(self.token), transport=transport,
                                       timeout=httpx.Timeout(timeout, connect=5.0))
        self.data = AsyncDataApi(self)
        self.admin = AsyncAdminApi(self)

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _retrying(self, idempotent: bool, once: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await once()
            except httpx.TransportError as exc:
                err = unreachable(self.url, exc)
            except ServiceUnavailable as exc:
                err = exc
            if not idempotent or attempt + 1 >= self.retry.attempts:
                raise err
            await asyncio.sleep(self.retry.delay(attempt, err.retry_after))
            attempt += 1

    async def _once(self, call: Call[T]) -> T:
        resp = await self._http.request(call.method, call.path, params=call.params, json=call.json,
                                        headers=dict(call.headers))
        if resp.status_code >= 400:
            raise error(resp)
        return call.parse(resp)

    async def _do(self, call: Call[T]) -> T:
        return await self._retrying(call.idempotent, lambda: self._once(call))

    # ------------------------------------------------------------------------------- jobs
    async def submit(self, spec: SpecLike, idempotency_key: str | None = None) -> Job:
        return await self._do(calls.submit(spec, idempotency_key))

    async def get(self, job: JobRef) -> Job:
        return await self._do(calls.get(job))

    async def list(self, state: str | None = None, page: int | None = None, limit: int = 20) -> JobList:
        return await self._do(calls.list_jobs(state, page, limit))

    async def cancel(self, job: JobRef) -> Job:
        return await self._do(calls.cancel(job))

    async def metrics(self, job: JobRef, since_step: int = 0) -> builtins.list[MetricPublic]:
        out: builtins.list[MetricPublic] = []
        while True:
            rows = await self._do(calls.metrics_page(job, since_step))
            out += rows
            if len(rows) < PAGE:
                return out
            since_step = rows[-1].step

    async def recent_metrics(self, job: JobRef, rows: int = PAGE) -> builtins.list[MetricPublic]:
        j = job if isinstance(job, Job) else await self.get(job)
        since = max(-1, int(j.final_step or j.spec.get("steps") or 0) - rows)
        while True:
            page = await self._do(calls.metrics_page(j, since, rows))
            if page or since <= -1:
                return page
            since = max(-1, since - rows)

    async def plan(self, spec: SpecLike, top_k: int = 3) -> PlanOut:
        return await self._do(calls.plan(spec, top_k))

    async def cluster(self) -> ClusterOut:
        return await self._do(calls.cluster())

    async def artifacts(self, job: JobRef) -> Artifacts:
        return await self._do(calls.artifacts(job))

    async def download_artifact(self, job: JobRef, path: str, out: str | Path,
                                progress: ProgressCallback | None = None) -> Path:
        return await self._download(calls.artifact_url(job, path), Path(out), progress)

    async def download_artifacts(self, job: JobRef, prefix: str, out_dir: str | Path) -> builtins.list[Path]:
        chosen = calls.chosen_artifacts(await self.artifacts(job), prefix)
        if not chosen:
            raise NotFound(f"no artifact of job {job_id(job)} is or lies under {prefix!r}")
        return [await self._download(calls.artifact_url(job, src), Path(out_dir) / rel, None) for src, rel in chosen]

    # ------------------------------------------------------------------------------- following
    def events(self, job: JobRef, follow: bool = True, since: int = 0, progress: bool = False,
               reconnect_s: float = RECONNECT_S) -> AsyncEventStream:
        return AsyncEventStream(self, job_id(job), since, follow, progress, reconnect_s)

    async def wait(self, job: JobRef, timeout: float | None = None, progress: bool = False,
                   poll_s: float = POLL_S) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        current = await self.get(job)
        tracker = JobProgress(current.model_dump(mode="json")) if progress else None
        with ProgressBar(tracker) if tracker else contextlib.nullcontext() as bar:
            while True:
                if tracker is not None:
                    await self._track(tracker, current)
                    assert bar is not None
                    bar.refresh()
                if current.ended:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(current, float(timeout or 0))
                await asyncio.sleep(poll_s if left is None else min(poll_s, left))
                current = await self.get(job)
        if current.state != JobState.SUCCEEDED:
            raise JobFailed(current)
        return current

    async def _track(self, tracker: JobProgress, job: Job, events: bool = True) -> None:
        tracker.job = job.model_dump(mode="json")
        if not tracker.metrics:
            rows = await self.recent_metrics(job)
        else:
            rows = await self._do(calls.metrics_page(job, tracker.last_step))
        tracker.add_metrics([m.model_dump(mode="json") for m in rows])
        if events:
            since = tracker.events[-1]["id"] if tracker.events else 0
            for ev in await self._do(calls.events_page(job, since)):
                tracker.add_event(ev.model_dump(mode="json"))

    # ------------------------------------------------------------------------------- files
    async def _download(self, url: str, out: Path, progress: ProgressCallback | None) -> Path:
        async def once() -> Path:
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")
            try:
                async with self._http.stream("GET", url) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        raise error(r)
                    total, done = int(r.headers.get("content-length") or 0), 0
                    with open(part, "wb") as f:
                        async for chunk in r.aiter_bytes(CHUNK):
                            f.write(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(done, total)
                os.replace(part, out)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
            return out

        return await self._retrying(True, once)

    async def _upload(self, file: Path, dest: str, progress: ProgressCallback | None) -> DataFile:
        size = file.stat().st_size
        url = f"/v1/data/{calls.data_path(dest)}"

        async def chunks() -> AsyncIterator[bytes]:
            done = 0
            with open(file, "rb") as f:
                while chunk := f.read(CHUNK):
                    done += len(chunk)
                    yield chunk
                    if progress is not None:
                        progress(done, size)

        async def once() -> DataFile:
            resp = await self._http.put(url, content=chunks(), headers={"Content-Length": str(size)})
            if resp.status_code >= 400:
                raise error(resp)
            return calls.data_file(resp)

        return await self._retrying(True, once)


class AsyncEventStream:
    """:class:`orthoplex.client.EventStream` for ``async for``."""

    def __init__(self, client: AsyncClient, job: int, since: int, follow: bool, progress: bool,
                 reconnect_s: float) -> None:
        self.client, self.job, self.last_id, self.follow = client, job, since, follow
        self.progress, self.reconnect_s = progress, reconnect_s
        self.state: str | None = None
        self.reconnects = 0
        self._it = self._run()

    def __repr__(self) -> str:
        return f"AsyncEventStream(job={self.job}, last_id={self.last_id}, state={self.state})"

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> EventPublic:
        return await self._it.__anext__()

    async def aclose(self) -> None:
        await self._it.aclose()

    async def _run(self) -> AsyncGenerator[EventPublic, None]:
        source = self._follow() if self.follow else self._pages()
        if not self.progress:
            async for ev in source:
                yield ev
            return
        c = self.client
        tracker = JobProgress((await c.get(self.job)).model_dump(mode="json"))
        with ProgressBar(tracker) as bar:
            await c._track(tracker, await c.get(self.job), events=False)
            polled = time.monotonic()
            async for ev in source:
                tracker.add_event(ev.model_dump(mode="json"))
                if time.monotonic() - polled >= POLL_S:
                    await c._track(tracker, await c.get(self.job), events=False)
                    polled = time.monotonic()
                bar.refresh()
                yield ev
            await c._track(tracker, await c.get(self.job), events=False)

    async def _pages(self) -> AsyncIterator[EventPublic]:
        while True:
            page = await self.client._do(calls.events_page(self.job, self.last_id))
            for ev in page:
                self.last_id = ev.id
                yield ev
            if len(page) < PAGE:
                return

    async def _follow(self) -> AsyncIterator[EventPublic]:
        http = self.client._http
        down_since: float | None = None
        while True:
            try:
                async with http.stream("GET", f"/v1/jobs/{self.job}/events", params={"since": self.last_id},
                                       headers={"Accept": "text/event-stream"},
                                       timeout=httpx.Timeout(60.0, connect=5.0)) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        raise error(r)
                    down_since = None
                    parser = SSEParser()
                    async for line in r.aiter_lines():
                        frame = parser.feed(line)
                        if frame is None:
                            continue
                        if frame.event == "end":
                            if frame.data.get("timeout"):
                                self.last_id = int(frame.data.get("last_id") or self.last_id)
                                break
                            if frame.data.get("reason"):
                                raise Unauthorized(f"event stream ended: {frame.data['reason']}")
                            self.state = frame.data.get("state")
                            return
                        ev = EventPublic.model_validate(frame.data)
                        self.last_id = ev.id
                        yield ev
                self.reconnects += 1
            except (httpx.TransportError, ServiceUnavailable) as exc:
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > self.reconnect_s:
                    raise ServiceUnavailable(f"event stream lost for {self.reconnect_s:g} s: "
                                             f"{type(exc).__name__}") from None
                self.reconnects += 1
                await asyncio.sleep(1.0)


class AsyncDataApi:
    """``await client.data.upload|list|download|rm``."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(self, file: str | Path, dest: str | None = None,
                     progress: ProgressCallback | None = None) -> DataFile:
        path = Path(file)
        return await self._c._upload(path, dest or path.name, progress)

    async def list(self, cursor: str | None = None, limit: int | None = None) -> DataList:
        """One page of the data area's files (``limit`` at most 1000, the server's default), in the
        byte order of their paths; pass the page's ``next_cursor`` as ``cursor`` for the next one."""
        return await self._c._do(calls.data_list(cursor, limit))

    async def download(self, path: str, out: str | Path, progress: ProgressCallback | None = None) -> Path:
        return await self._c._download(f"/v1/data/{calls.data_path(path)}", Path(out), progress)

    async def rm(self, path: str) -> None:
        await self._c._do(calls.data_rm(path))


class AsyncAdminApi:
    """``await client.admin.create_tenant(...)`` and the other tenant and token calls."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create_tenant(self, name: str, **fields: Any) -> TenantPublic:
        return await self._c._do(calls.create_tenant(name, fields))

    async def list_tenants(self, page: int | None = None, limit: int = 50) -> TenantList:
        return await self._c._do(calls.list_tenants(page, limit))

    async def get_tenant(self, tenant_id: int) -> TenantPublic:
        return await self._c._do(calls.get_tenant(tenant_id))

    async def update_tenant(self, tenant_id: int, **fields: Any) -> TenantPublic:
        return await self._c._do(calls.update_tenant(tenant_id, fields))

    async def create_token(self, tenant_id: int, name: str = "", expires_in_days: int | None = 90) -> TokenCreated:
        return await self._c._do(calls.create_token(tenant_id, name, expires_in_days))

    async def revoke_token(self, token_id: int) -> None:
        await self._c._do(calls.revoke_token(token_id))

    async def drain_node(self, node_id: str, deadline_s: float) -> NodeDrainOut:
        return await self._c._do(calls.drain_node(node_id, deadline_s))

    async def undrain_node(self, node_id: str) -> NodeDrainOut:
        return await self._c._do(calls.undrain_node(node_id))
