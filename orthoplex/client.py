"""``orthoplex.Client``: the REST API from Python, synchronous (``orthoplex.AsyncClient`` is the
same with ``await``). One place for auth, retries, the event stream's cursor and error mapping;
the ``orthoplex`` command line uses it for every call."""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from orthoplex import _calls as calls
from orthoplex._calls import PAGE, JobRef, SpecLike, job_id
from orthoplex._transport import Call, Retry, SSEParser, error, headers, settings, unreachable
from orthoplex.errors import JobFailed, ServiceUnavailable, Unauthorized, WaitTimeout
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
#: called with (bytes done, bytes in all) while a file moves
ProgressCallback = Callable[[int, int], None]
CHUNK = 1 << 20
#: ``events(follow=True)`` reconnects (with its cursor) this long while the service is down
RECONNECT_S = 300.0
#: how often ``wait`` and a progress bar ask for the job's state and newest metrics
POLL_S = 2.0


class Client:
    """The Orthoplex REST API.

    ``url`` and ``token`` default to ``ORTHOPLEX_API_URL`` and ``ORTHOPLEX_API_TOKEN``. Calls that
    may be repeated (reads, cancel, uploads, deletes, and ``submit``, which always carries an
    ``Idempotency-Key``) are retried with backoff on connection errors and 502/503/504; errors are
    the typed exceptions of :mod:`orthoplex.errors`. Use it as a context manager, or ``close()`` it.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retry: Retry | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self.url, self.token = settings(url, token)
        self.retry = retry or Retry()
        self._http = httpx.Client(base_url=self.url, headers=headers(self.token), transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=5.0))
        self.data = DataApi(self)
        self.admin = AdminApi(self)

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------------------- sending
    def _retrying(self, idempotent: bool, once: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                return once()
            except httpx.TransportError as exc:
                err = unreachable(self.url, exc)
            except ServiceUnavailable as exc:
                err = exc
            if not idempotent or attempt + 1 >= self.retry.attempts:
                raise err
            time.sleep(self.retry.delay(attempt, err.retry_after))
            attempt += 1

    def _once(self, call: Call[T]) -> T:
        resp = self._http.request(call.method, call.path, params=call.params, json=call.json,
                                  headers=dict(call.headers))
        if resp.status_code >= 400:
            raise error(resp)
        return call.parse(resp)

    def _do(self, call: Call[T]) -> T:
        return self._retrying(call.idempotent, lambda: self._once(call))

    # ------------------------------------------------------------------------------- jobs
    def submit(self, spec: SpecLike, idempotency_key: str | None = None) -> Job:
        """Queue a job (a :class:`JobSpec`, a dict as the REST API takes it, or a YAML/JSON file).
        It carries ``idempotency_key`` (a random one by default), so a retry after a dropped
        connection returns the job the server accepted rather than a second one."""
        return self._do(calls.submit(spec, idempotency_key))

    def get(self, job: JobRef) -> Job:
        return self._do(calls.get(job))

    def list(self, state: str | None = None, page: int | None = None, limit: int = 20) -> JobList:
        """The tenant's jobs, newest first; ``page``: the ``next_cursor`` of the previous list."""
        return self._do(calls.list_jobs(state, page, limit))

    def cancel(self, job: JobRef) -> Job:
        """Cancel a job: a queued one at once, a running one at the controller's next step
        (``cancel_requested``). :class:`Conflict` when it has already ended."""
        return self._do(calls.cancel(job))

    def metrics(self, job: JobRef, since_step: int = 0) -> builtins.list[MetricPublic]:
        """Loss, throughput and validation loss per step (every row after ``since_step``)."""
        out: builtins.list[MetricPublic] = []
        while True:
            rows = self._do(calls.metrics_page(job, since_step))
            out += rows
            if len(rows) < PAGE:
                return out
            since_step = rows[-1].step

    def recent_metrics(self, job: JobRef, rows: int = PAGE) -> builtins.list[MetricPublic]:
        """A page of the job's newest metrics rows: at most ``rows``, the newest one included when
        there is any (one request for a job near its end; what a progress bar needs)."""
        j = job if isinstance(job, Job) else self.get(job)
        since = max(-1, int(j.final_step or j.spec.get("steps") or 0) - rows)
        while True:
            page = self._do(calls.metrics_page(j, since, rows))
            if page or since <= -1:
                return page
            since = max(-1, since - rows)

    def plan(self, spec: SpecLike, top_k: int = 3) -> PlanOut:
        """The planner's best layouts for ``spec`` (a dry run: nothing is queued)."""
        return self._do(calls.plan(spec, top_k))

    def cluster(self) -> ClusterOut:
        return self._do(calls.cluster())

    def artifacts(self, job: JobRef) -> Artifacts:
        """What the job wrote: checkpoints, the HF export, TensorBoard files."""
        return self._do(calls.artifacts(job))

    def download_artifact(self, job: JobRef, path: str, out: str | Path,
                          progress: ProgressCallback | None = None) -> Path:
        """One artifact file (a path from :meth:`artifacts`) into the file ``out``."""
        return self._download(calls.artifact_url(job, path), Path(out), progress)

    def download_artifacts(self, job: JobRef, prefix: str, out_dir: str | Path) -> builtins.list[Path]:
        """Every artifact file that is ``prefix`` or lies under it (``"export"``: the HF export)
        into the folder ``out_dir``; :class:`NotFound` when there is none."""
        from orthoplex.errors import NotFound

        chosen = calls.chosen_artifacts(self.artifacts(job), prefix)
        if not chosen:
            raise NotFound(f"no artifact of job {job_id(job)} is or lies under {prefix!r}")
        return [self._download(calls.artifact_url(job, src), Path(out_dir) / rel, None) for src, rel in chosen]

    # ------------------------------------------------------------------------------- following
    def events(self, job: JobRef, follow: bool = True, since: int = 0, progress: bool = False,
               reconnect_s: float = RECONNECT_S) -> EventStream:
        """The job's events, oldest first, as :class:`EventPublic` objects. With ``follow`` (the
        default) it waits for new ones until the job ends (then ``stream.state`` is its final
        state), reconnecting with its cursor after the server's stream limit or a dropped
        connection (for up to ``reconnect_s`` of consecutive failures); without, it stops at the
        newest. ``progress`` draws a bar (step/steps, loss, ETA)."""
        return EventStream(self, job_id(job), since, follow, progress, reconnect_s)

    def wait(self, job: JobRef, timeout: float | None = None, progress: bool = False,
             poll_s: float = POLL_S) -> Job:
        """Block until the job ends; returns it if it SUCCEEDED, else raises :class:`JobFailed`
        (FAILED or CANCELLED), or :class:`WaitTimeout` after ``timeout`` seconds. ``progress``
        draws a bar (step/steps, loss, ETA)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        current = self.get(job)
        tracker = JobProgress(current.model_dump(mode="json")) if progress else None
        with ProgressBar(tracker) if tracker else contextlib.nullcontext() as bar:
            while True:
                if tracker is not None:
                    self._track(tracker, current)
                    assert bar is not None
                    bar.refresh()
                if current.ended:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(current, float(timeout or 0))
                time.sleep(poll_s if left is None else min(poll_s, left))
                current = self.get(job)
        if current.state != JobState.SUCCEEDED:
            raise JobFailed(current)
        return current

    def _track(self, tracker: JobProgress, job: Job, events: bool = True) -> None:
        tracker.job = job.model_dump(mode="json")
        if not tracker.metrics:
            rows = self.recent_metrics(job)
        else:
            rows = self._do(calls.metrics_page(job, tracker.last_step))
        tracker.add_metrics([m.model_dump(mode="json") for m in rows])
        if events:
            since = tracker.events[-1]["id"] if tracker.events else 0
            for ev in self._do(calls.events_page(job, since)):
                tracker.add_event(ev.model_dump(mode="json"))

    # ------------------------------------------------------------------------------- files
    def _download(self, url: str, out: Path, progress: ProgressCallback | None) -> Path:
        def once() -> Path:
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")
            try:
                with self._http.stream("GET", url) as r:
                    if r.status_code >= 400:
                        r.read()
                        raise error(r)
                    total, done = int(r.headers.get("content-length") or 0), 0
                    with open(part, "wb") as f:
                        for chunk in r.iter_bytes(CHUNK):
                            f.write(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(done, total)
                os.replace(part, out)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
            return out

        return self._retrying(True, once)

    def _upload(self, file: Path, dest: str, progress: ProgressCallback | None) -> DataFile:
        size = file.stat().st_size
        url = f"/v1/data/{calls.data_path(dest)}"

        def chunks() -> Iterator[bytes]:
            done = 0
            with open(file, "rb") as f:
                while chunk := f.read(CHUNK):
                    done += len(chunk)
                    yield chunk
                    if progress is not None:
                        progress(done, size)

        def once() -> DataFile:  # an upload replaces the file atomically: sending it again is safe
            resp = self._http.put(url, content=chunks(), headers={"Content-Length": str(size)})
            if resp.status_code >= 400:
                raise error(resp)
            return calls.data_file(resp)

        return self._retrying(True, once)


class EventStream:
    """An iterator over a job's events (:meth:`Client.events`). After it ends, ``state`` is the
    job's final state (when following), ``last_id`` the cursor, ``reconnects`` how many times it
    resumed after the server's stream limit or a lost connection."""

    def __init__(self, client: Client, job: int, since: int, follow: bool, progress: bool,
                 reconnect_s: float) -> None:
        self.client, self.job, self.last_id, self.follow = client, job, since, follow
        self.progress, self.reconnect_s = progress, reconnect_s
        self.state: str | None = None
        self.reconnects = 0
        self._it = self._run()

    def __repr__(self) -> str:
        return f"EventStream(job={self.job}, last_id={self.last_id}, state={self.state})"

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> EventPublic:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    def _run(self) -> Generator[EventPublic, None, None]:
        if not self.progress:
            yield from (self._follow() if self.follow else self._pages())
            return
        c = self.client
        tracker = JobProgress(c.get(self.job).model_dump(mode="json"))
        with ProgressBar(tracker) as bar:
            c._track(tracker, c.get(self.job), events=False)
            polled = time.monotonic()
            for ev in self._follow() if self.follow else self._pages():
                tracker.add_event(ev.model_dump(mode="json"))
                if time.monotonic() - polled >= POLL_S:
                    c._track(tracker, c.get(self.job), events=False)
                    polled = time.monotonic()
                bar.refresh()
                yield ev
            c._track(tracker, c.get(self.job), events=False)

    def _pages(self) -> Iterator[EventPublic]:
        while True:
            page = self.client._do(calls.events_page(self.job, self.last_id))
            for ev in page:
                self.last_id = ev.id
                yield ev
            if len(page) < PAGE:
                return

    def _follow(self) -> Iterator[EventPublic]:
        http = self.client._http
        down_since: float | None = None
        while True:
            try:
                with http.stream("GET", f"/v1/jobs/{self.job}/events", params={"since": self.last_id},
                                 headers={"Accept": "text/event-stream"},
                                 timeout=httpx.Timeout(60.0, connect=5.0)) as r:
                    if r.status_code >= 400:
                        r.read()
                        raise error(r)
                    down_since = None
                    parser = SSEParser()
                    for line in r.iter_lines():
                        frame = parser.feed(line)
                        if frame is None:
                            continue
                        if frame.event == "end":
                            if frame.data.get("timeout"):  # the server's stream limit, not the job's end
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
                time.sleep(1.0)


class DataApi:
    """Your data area on the service: ``client.data.upload|list|download|rm``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def upload(self, file: str | Path, dest: str | None = None, progress: ProgressCallback | None = None) -> DataFile:
        """Stream a local file to ``dest`` in the data area (default: its name); an existing
        file is replaced atomically. ``progress(done, total)`` is called as bytes go out."""
        path = Path(file)
        return self._c._upload(path, dest or path.name, progress)

    def list(self, cursor: str | None = None, limit: int | None = None) -> DataList:
        """One page of the data area's files (``limit`` at most 1000, the server's default), in the
        byte order of their paths; pass the page's ``next_cursor`` as ``cursor`` for the next one."""
        return self._c._do(calls.data_list(cursor, limit))

    def download(self, path: str, out: str | Path, progress: ProgressCallback | None = None) -> Path:
        """Stream a file of the data area into the local file ``out`` (written whole, or not at all)."""
        return self._c._download(f"/v1/data/{calls.data_path(path)}", Path(out), progress)

    def rm(self, path: str) -> None:
        self._c._do(calls.data_rm(path))


class AdminApi:
    """Tenants and their tokens (the admin token only): ``client.admin.create_tenant(...)``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create_tenant(self, name: str, **fields: Any) -> TenantPublic:
        """``fields``: ``gpu_quota``, ``weight``, ``max_jobs``, ``submit_per_minute``."""
        return self._c._do(calls.create_tenant(name, fields))

    def list_tenants(self, page: int | None = None, limit: int = 50) -> TenantList:
        return self._c._do(calls.list_tenants(page, limit))

    def get_tenant(self, tenant_id: int) -> TenantPublic:
        return self._c._do(calls.get_tenant(tenant_id))

    def update_tenant(self, tenant_id: int, **fields: Any) -> TenantPublic:
        return self._c._do(calls.update_tenant(tenant_id, fields))

    def create_token(self, tenant_id: int, name: str = "", expires_in_days: int | None = 90) -> TokenCreated:
        """A new token for the tenant; its secret (``.token``) is shown this once."""
        return self._c._do(calls.create_token(tenant_id, name, expires_in_days))

    def revoke_token(self, token_id: int) -> None:
        self._c._do(calls.revoke_token(token_id))

    def drain_node(self, node_id: str, deadline_s: float) -> NodeDrainOut:
        """Drain a node: it takes no new work and every job on it moves off within ``deadline_s``."""
        return self._c._do(calls.drain_node(node_id, deadline_s))

    def undrain_node(self, node_id: str) -> NodeDrainOut:
        """The node takes new work again."""
        return self._c._do(calls.undrain_node(node_id))
