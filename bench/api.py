"""API latency: submit (``POST /v1/jobs``) and get (``GET /v1/jobs/{id}``) at a fixed open-loop
rate against a real ``orthoplex serve`` (uvicorn, one process) on 127.0.0.1 backed by PostgreSQL,
with ``GET /healthz`` (no database) at the same rate as the baseline, all in one run.

Open loop with a bounded client: request *i* is due at ``t0 + i / rate`` whatever happened to the
earlier ones, and its latency is counted from that due time, so a stalled server shows up as
latency instead of as a lower send rate (no coordinated omission). At most ``CONCURRENCY``
requests are in flight (so at most as many connections are open); a request that finds no
free slot waits for one, and its wait is part of its latency. A request that could not be sent
within ``MAX_LATE_S`` of its due time is *dropped* (counted, never sent), so the client's backlog is
bounded and an overloaded server cannot turn the client into the thing being measured. A request
sent more than ``LATE_S`` after its due time is counted as *late* (it is still measured).

Each phase runs a short warm-up at its rate (not measured), then ``SECONDS`` measured. ``p99_all``
counts dropped and failed requests as slower than everything: where more than 1 % of the requests
did not succeed it is undefined (None) and the rate is not sustained. After the 200 req/s phases a
small ladder (50/100/200/400 req/s, shorter phases) finds per operation the highest rate at which
at least 95 % of the target rate succeeds with p99_all under 100 ms: a measured capacity of this
machine at the time of the run, not a promise.

The client shares the machine with the server: measured requests go through :class:`RawClient`
(a fraction of httpx's CPU per request), and each phase reports the CPU per request of the client,
the server process and the whole machine, the jobs in the table (the submit path's limit checks
scan them) and the load average, so a reader can tell a saturated server from a busy machine.
The database is a scratch one on
``ORTHOPLEX_TEST_DATABASE_URL``'s server (default: local), dropped afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from workers.runtime.cluster import procfs

RATE = 200.0  # req/s of the main phases
SECONDS = 12.0  # measured seconds per main phase (2,400 requests at 200 req/s: 24 beyond p99)
WARMUP_S = 1.5  # unmeasured seconds at the phase's rate before each phase
LADDER = (50.0, 100.0, 200.0, 400.0)  # req/s
LADDER_SECONDS = 6.0  # measured seconds per ladder rung (the 200 req/s rung is the main phase)
CONCURRENCY = 32  # most requests in flight at once
MAX_LATE_S = 1.0  # a request not sent by due + this is dropped
LATE_S = 0.010  # a request sent more than this after its due time is "late"
TIMEOUT_S = 5.0  # per request; a timeout is an error
SUSTAINED_FRACTION = 0.95  # of the target rate
SLO_P99_MS = 100.0

ADMIN = "bench-admin-" + uuid.uuid4().hex[:8]
SPEC = {"name": "bench", "model": "tiny", "steps": 10, "global_batch": 8, "min_gpus": 1, "max_gpus": 2}

Make = Callable[[int], tuple[str, str, dict[str, Any]]]


def _server_url() -> str:
    url = os.environ.get("ORTHOPLEX_TEST_DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    return url.rsplit("/", 1)[0]


def _admin_sql(sql: str) -> None:
    import psycopg

    conninfo = (_server_url() + "/postgres").replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else round(1e3 * seconds, 2)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _proc_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid`` from /proc; None off Linux."""
    fields = procfs.stat_fields(pid) if pid is not None else None
    return procfs.cpu_seconds(fields) if fields else None


def _machine_busy_s() -> float | None:
    """CPU seconds spent not idle by the whole machine (every process: server, client, PostgreSQL, others)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _count_jobs(conninfo: str | None) -> int | None:
    """Jobs in the bench database (the submit path's limit checks scan the tenant's recent and
    unfinished jobs, so its cost depends on this); None without a database to ask."""
    if conninfo is None:
        return None
    import psycopg

    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM jobs").fetchone()
        return int(row[0]) if row else None


class _Response:
    __slots__ = ("status_code",)

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams, for the measured requests only.

    httpx costs the client about 2 ms of CPU per request, which on a 2-CPU machine shared with the
    server is a large part of what is measured; this one sends a prebuilt request and reads a
    ``Content-Length`` response (all the measured routes answer so), at a fraction of that. A pooled
    connection that the server closed while idle is retried once on a new connection.
    """

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float = TIMEOUT_S) -> None:
        hostport = url.split("://", 1)[1].rstrip("/")
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": hostport, **headers}.items())
        self.timeout_s = timeout_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, json: Any = None,
                      headers: dict[str, str] | None = None) -> _Response:
        body = b"" if json is None else _dumps(json)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if json is not None:
            extra += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = f"{method} {path} HTTP/1.1\r\n{self.head}{extra}\r\n".encode() + body
        async with asyncio.timeout(self.timeout_s):
            while self.idle:  # reuse, newest first; a stale one is closed and the next tried
                conn = self.idle.pop()
                try:
                    return await self._exchange(conn, data)
                except (ConnectionError, asyncio.IncompleteReadError, _Closed):
                    conn[1].close()
            conn = await asyncio.open_connection(self.host, self.port)
            try:
                return await self._exchange(conn, data)
            except BaseException:
                conn[1].close()
                raise

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> _Response:
        reader, writer = conn
        writer.write(data)
        status = await reader.readline()
        if not status:
            raise _Closed
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"transfer-encoding":
                raise ValueError("chunked responses are not supported by the bench client")
        if length:
            await reader.readexactly(length)
        if close:
            writer.close()
        else:
            self.idle.append(conn)
        return _Response(int(status.split(b" ", 2)[1]))

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop()[1].close()


class _Closed(Exception):
    """The server closed a kept-alive connection before answering."""


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _CpuMeter:
    """CPU used over a window by the client (this process), the server process and the machine."""

    def __init__(self, server_pid: int | None) -> None:
        self.pid = server_pid
        self.start = (time.process_time(), _proc_cpu_s(server_pid), _machine_busy_s(), time.perf_counter())

    def per_request_ms(self, n: int) -> dict[str, float | None]:
        end = (time.process_time(), _proc_cpu_s(self.pid), _machine_busy_s(), time.perf_counter())
        d = [None if a is None or b is None else b - a for a, b in zip(self.start, end, strict=True)]
        per = [None if x is None else round(1e3 * x / max(1, n), 2) for x in d[:3]]
        util = None if d[2] is None else round(d[2] / (d[3] * (os.cpu_count() or 1)), 2)
        return {"client_cpu_ms_per_req": per[0], "server_cpu_ms_per_req": per[1],
                "machine_cpu_ms_per_req": per[2], "machine_cpu_util": util}


async def open_loop(client: Any, rate: float, seconds: float, make: Make, *,
                    concurrency: int = CONCURRENCY, max_late_s: float = MAX_LATE_S) -> dict[str, Any]:
    """Send ``rate * seconds`` requests made by ``make(i)``, request *i* due at ``t0 + i / rate``;
    at most ``concurrency`` in flight; see the module docstring for late, dropped and latency."""
    n = max(1, round(rate * seconds))
    lat: list[float] = []  # due -> response, successful requests, in due order of completion
    lag: list[float] = []  # due -> sent (slot wait + the client's own scheduling delay)
    done_at: list[float] = []
    errors = late = dropped = 0
    first_error: list[str] = []
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter() + 0.02

    async def one(i: int, due: float) -> None:
        nonlocal errors
        method, path, kw = make(i)
        why = ""
        try:
            r = await client.request(method, path, **kw)
            if r.status_code >= 400:
                why = f"HTTP {r.status_code}"
        except Exception as exc:
            why = type(exc).__name__
        finally:
            slots.release()
        now = time.perf_counter()
        done_at.append(now)
        if not why:
            lat.append(now - due)
        else:
            errors += 1
            if not first_error:
                first_error.append(why)

    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() - due > max_late_s:
            dropped += 1
            continue
        await slots.acquire()  # blocks while `concurrency` requests are in flight
        sent = time.perf_counter()
        if sent - due > max_late_s:
            slots.release()
            dropped += 1
            continue
        lag.append(sent - due)
        late += sent - due > LATE_S
        task = asyncio.create_task(one(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    span = max(n / rate, (max(done_at) if done_at else t0) - t0)
    ok = len(lat)
    # p99 over every scheduled request, a dropped or failed one counting as slower than all others
    bad = n - ok
    p99_all = _pct(lat + [math.inf] * bad, 0.99) if ok else math.inf
    fifth = max(1, ok // 5)
    return {
        "target_rps": rate, "seconds": seconds, "requests": n, "ok": ok, "errors": errors, "late": late,
        "dropped": dropped, "achieved_rps": round(ok / span, 1),
        "p50_ms": _ms(_pct(lat, 0.50)), "p99_ms": _ms(_pct(lat, 0.99)),
        "p99_all_ms": None if math.isinf(p99_all) else _ms(p99_all),
        "max_ms": _ms(max(lat, default=float("nan"))),
        "send_lag_p99_ms": _ms(_pct(lag, 0.99)),
        # median of the first and the last fifth (completion order): drift within the phase
        "p50_first_fifth_ms": _ms(_pct(lat[:fifth], 0.5)), "p50_last_fifth_ms": _ms(_pct(lat[-fifth:], 0.5)),
        "first_error": first_error[0] if first_error else None,
    }


def sustained(row: dict[str, Any]) -> bool:
    """At least 95 % of the target rate succeeded and p99 (dropped and failed counted) < 100 ms."""
    return (row["achieved_rps"] >= SUSTAINED_FRACTION * row["target_rps"]
            and row["p99_all_ms"] is not None and row["p99_all_ms"] < SLO_P99_MS)


async def _phase(client: Any, rate: float, seconds: float, warmup_s: float, make: Make,
                 concurrency: int, server_pid: int | None, db: str | None = None) -> dict[str, Any]:
    if warmup_s > 0:
        await open_loop(client, rate, warmup_s, make, concurrency=concurrency)
    gc.collect()
    gc.disable()  # no client-side collector pauses inside the measured window
    load = _load()
    jobs_before = _count_jobs(db)
    cpu = _CpuMeter(server_pid)
    try:
        row = await open_loop(client, rate, seconds, make, concurrency=concurrency)
    finally:
        gc.enable()
    cpu_row = cpu.per_request_ms(row["requests"] - row["dropped"])
    return {**row, **cpu_row, "load_1m_before": load, "jobs_in_db": [jobs_before, _count_jobs(db)]}


async def _measure(url: str, token: str, rate: float, seconds: float, warmup_s: float, ladder: bool,
                   ladder_seconds: float, concurrency: int, server_pid: int | None,
                   client: str, db: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    ids: list[int] = []

    def healthz(i: int) -> tuple[str, str, dict[str, Any]]:
        return "GET", "/healthz", {}

    def submit(i: int) -> tuple[str, str, dict[str, Any]]:
        return "POST", "/v1/jobs", {"json": SPEC, "headers": {"Idempotency-Key": f"b-{uuid.uuid4().hex}"}}

    def get(i: int) -> tuple[str, str, dict[str, Any]]:
        return "GET", f"/v1/jobs/{ids[i % len(ids)]}", {}

    cases: list[tuple[str, Make]] = [
        ("GET /healthz (baseline, no database)", healthz),
        ("POST /v1/jobs (submit)", submit),
        ("GET /v1/jobs/{id} (get)", get),
    ]
    rows: list[dict[str, Any]] = []
    rungs: list[dict[str, Any]] = []
    raw = RawClient(url, headers)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=TIMEOUT_S) as hc:
        c: Any = raw if client == "raw" else hc
        try:
            # warm the planner's cache for SPEC and the server's code paths before anything is timed
            for i in range(5):
                await c.request("GET", "/healthz")
                await c.request("POST", "/v1/jobs", json=SPEC, headers={"Idempotency-Key": f"warm-{i}"})
            for label, make in cases:
                if make is get:
                    listing = (await hc.get("/v1/jobs", params={"limit": 100})).json()["items"]
                    ids[:] = [j["id"] for j in listing]
                row = await _phase(c, rate, seconds, warmup_s, make, concurrency, server_pid, db)
                rows.append({"operation": label, **row})
            if ladder:
                for (label, make), main in zip(cases, rows, strict=True):
                    rungs.extend(await _ladder(c, label, make, main, ladder_seconds, warmup_s, concurrency,
                                               server_pid, db))
        finally:
            await raw.aclose()
    return rows, rungs


async def _ladder(client: Any, label: str, make: Make, main: dict[str, Any], seconds: float, warmup_s: float,
                  concurrency: int, server_pid: int | None, db: str | None) -> list[dict[str, Any]]:
    """Walk LADDER from the main phase's rate: up while sustained, down while not."""
    out: list[dict[str, Any]] = []
    if main["target_rps"] not in LADDER:
        return out
    k = LADDER.index(main["target_rps"])
    step = 1 if sustained(main) else -1
    k += step
    while 0 <= k < len(LADDER):
        row = await _phase(client, LADDER[k], seconds, min(warmup_s, 1.0), make, concurrency, server_pid, db)
        out.append({"operation": label, **row, "sustained": sustained(row)})
        if sustained(row) != (step == 1):  # going up and failed, or going down and passed: done
            break
        k += step
    return out


def capacity(main: dict[str, Any], rungs: list[dict[str, Any]]) -> str:
    """The highest ladder rate sustained, as text ('>= 400' at the top, '< 50' below the bottom)."""
    ok = [r["target_rps"] for r in [main, *rungs] if sustained(r)]
    if not ok:
        low = min([main["target_rps"], *(r["target_rps"] for r in rungs)])
        return f"< {low:.0f}"
    best = max(ok)
    return f">= {best:.0f}" if best == LADDER[-1] else f"{best:.0f}"


STREAM_N = 200  # submissions and listings per condition of the stream-impact section


def _stream_case(url: str, n: int, stream: bool) -> dict[str, Any]:
    """Tenant B submits and lists ``n`` times each (closed loop), while tenant A has an event stream
    open on a job of its own (``stream``) or not; per-call latency percentiles in ms."""
    import threading

    import httpx

    admin = {"Authorization": f"Bearer {ADMIN}"}

    def tenant(name: str) -> dict[str, str]:
        t = httpx.post(f"{url}/v1/tenants", headers=admin, timeout=TIMEOUT_S,
                       json={"name": f"{name}-{uuid.uuid4().hex[:6]}", "submit_per_minute": 100_000,
                             "max_jobs": 100_000}).json()
        tok = httpx.post(f"{url}/v1/tenants/{t['id']}/tokens", headers=admin, json={}, timeout=TIMEOUT_S).json()
        return {"Authorization": f"Bearer {tok['token']}"}

    a, b = tenant("streamer"), tenant("writer")
    opened = threading.Event()
    stop = threading.Event()
    frames = [0]

    follower = httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, read=None))

    def follow() -> None:
        jid = httpx.post(f"{url}/v1/jobs", json=SPEC, headers=a, timeout=TIMEOUT_S).json()["id"]
        try:
            with follower.stream("GET", f"{url}/v1/jobs/{jid}/events",
                                 headers={**a, "Accept": "text/event-stream"}) as r:
                opened.set()
                for line in r.iter_lines():
                    frames[0] += line.startswith("event:")
                    if stop.is_set():
                        return
        except (httpx.HTTPError, RuntimeError):  # closed from the main thread at the end
            return

    thread = threading.Thread(target=follow, daemon=True) if stream else None
    if thread is not None:
        thread.start()
        opened.wait(TIMEOUT_S * 4)
    lat: dict[str, list[float]] = {"submit": [], "list": []}
    errors = 0
    with httpx.Client(base_url=url, headers=b, timeout=TIMEOUT_S) as c:
        for _ in range(n):
            for op, (method, path, kw) in (("submit", ("POST", "/v1/jobs", {"json": SPEC})),
                                           ("list", ("GET", "/v1/jobs", {"params": {"limit": 20}}))):
                t = time.perf_counter()
                try:
                    ok = c.request(method, path, **kw).status_code < 400
                except httpx.HTTPError:
                    ok = False
                if ok:
                    lat[op].append(time.perf_counter() - t)
                else:
                    errors += 1
    stop.set()
    follower.close()
    if thread is not None:
        thread.join(TIMEOUT_S)
    out: dict[str, Any] = {"stream_open": stream, "errors": errors, "stream_frames": frames[0]}
    for op, v in lat.items():
        out[f"{op}_p50_ms"] = _ms(_pct(v, 0.5)) if v else None
        out[f"{op}_p99_ms"] = _ms(_pct(v, 0.99)) if v else None
    return out


def stream_impact(n: int = STREAM_N) -> list[dict[str, Any]]:
    """Submissions and listings of one tenant with and without another tenant's event stream open,
    on SQLite and on PostgreSQL (one server process each, fresh stores)."""
    import tempfile

    from service.api.process import LiveServer
    from service.db import migrate

    rows = []
    with tempfile.TemporaryDirectory(prefix="orthoplex-bench-") as tmp:
        db = f"orthoplex_bench_{uuid.uuid4().hex[:8]}"
        _admin_sql(f'CREATE DATABASE "{db}"')
        try:
            for store, url in (("SQLite", f"sqlite:///{tmp}/bench.db"), ("PostgreSQL", f"{_server_url()}/{db}")):
                migrate.upgrade(url)
                server = LiveServer(url, ADMIN, env={"ORTHOPLEX_API_FIT_CHECK": "false",
                                                     "ORTHOPLEX_STORAGE_PATH": f"{tmp}/storage"})
                server.start()
                try:
                    for stream in (False, True):
                        rows.append({"store": store, **_stream_case(server.url, n, stream)})
                finally:
                    server.stop()
        finally:
            _admin_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 1)


def run(quick: bool = False, *, rate: float | None = None, seconds: float | None = None,
        warmup_s: float | None = None, ladder: bool | None = None, concurrency: int = CONCURRENCY,
        client: str = "raw") -> dict[str, Any]:
    """Measure (see the module docstring). ``quick``: 2 s phases and no ladder (a smoke run, not for
    reporting); the keywords override the sizes (the tests use a tiny rate and duration). ``client``:
    ``raw`` (:class:`RawClient`, the default) or ``httpx`` (to compare what the client costs)."""
    import httpx

    from service.api.process import LiveServer
    from service.db import migrate

    rate = rate or RATE
    seconds = seconds or (2.0 if quick else SECONDS)
    warmup_s = (0.5 if quick else WARMUP_S) if warmup_s is None else warmup_s
    ladder = (not quick) if ladder is None else ladder
    ladder_seconds = min(LADDER_SECONDS, seconds)
    started = time.perf_counter()
    load_before = os.getloadavg()
    db = f"orthoplex_bench_{uuid.uuid4().hex[:8]}"
    _admin_sql(f'CREATE DATABASE "{db}"')
    server = None
    try:
        url = f"{_server_url()}/{db}"
        migrate.upgrade(url)
        server = LiveServer(url, ADMIN)
        server.start()
        admin = {"Authorization": f"Bearer {ADMIN}"}
        tenant = httpx.post(f"{server.url}/v1/tenants", headers=admin,
                            json={"name": "bench", "submit_per_minute": 100_000, "max_jobs": 100_000}).json()
        token = httpx.post(f"{server.url}/v1/tenants/{tenant['id']}/tokens", headers=admin, json={}).json()["token"]
        rows, rungs = asyncio.run(_measure(server.url, token, rate, seconds, warmup_s, ladder, ladder_seconds,
                                           concurrency, server.proc.pid if server.proc else None, client,
                                           url.replace("postgresql+psycopg://", "postgresql://")))
    finally:
        if server is not None:
            server.stop()
        _admin_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    stream_rows = stream_impact(10 if quick else STREAM_N)
    load_after = os.getloadavg()
    wall_s = round(time.perf_counter() - started, 1)

    base = rows[0]
    for r in rows:
        r["sustained"] = sustained(r)
        r["p50_vs_healthz"] = _ratio(r["p50_ms"], base["p50_ms"])
        r["p99_vs_healthz"] = _ratio(r["p99_ms"], base["p99_ms"])
        if ladder:
            r["capacity_rps"] = capacity(r, [g for g in rungs if g["operation"] == r["operation"]])
    cpus = os.cpu_count() or 1
    busy = load_before[0] > 0.5 * cpus  # "after" includes this run's own client, server and database
    lines = [
        f"Open-loop client at {rate:.0f} requests/s, {seconds:.0f} s measured per operation after "
        f"{warmup_s:g} s of unmeasured warm-up, against one uvicorn process on 127.0.0.1 (PostgreSQL store; "
        f"client and server share the machine's {cpus} CPUs). Latency is counted from each request's due "
        f"time (no coordinated omission); at most {concurrency} requests in flight ({client} client); a request that cannot "
        f"be sent within {MAX_LATE_S:g} s of its due time is dropped (counted, not sent); *late* = sent more "
        f"than {1e3 * LATE_S:g} ms after its due time (measured). Ratios are against `GET /healthz` (no "
        "database) measured in the same run at the same rate.",
        "",
        "| operation | target req/s | requests | ok | errors | late | dropped | achieved req/s | p50 ms "
        "| p99 ms | max ms | p50 / healthz | p99 / healthz |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        err = f"{r['errors']} ({r['first_error']})" if r["errors"] else "0"
        lines.append(
            f"| {r['operation']} | {r['target_rps']:.0f} | {r['requests']} | {r['ok']} | {err} | {r['late']} | "
            f"{r['dropped']} | {r['achieved_rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
            f"{r['p50_vs_healthz']}x | {r['p99_vs_healthz']}x |")
    lines += [
        "",
        "CPU per request sent, in ms, over each measured window: the client (this process), the server "
        "process, and the whole machine (server, client, PostgreSQL and anything else running); machine "
        "utilisation = busy CPU time / (window x CPUs).",
        "",
        "| operation | client CPU | server CPU | machine CPU | machine utilisation | p50 first / last fifth ms "
        "| send lag p99 ms | jobs in the table, start / end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['operation']} | {r['client_cpu_ms_per_req']} | {r['server_cpu_ms_per_req']} | "
            f"{r['machine_cpu_ms_per_req']} | {r['machine_cpu_util']} | {r['p50_first_fifth_ms']} / "
            f"{r['p50_last_fifth_ms']} | {r['send_lag_p99_ms']} | {r['jobs_in_db'][0]} / {r['jobs_in_db'][1]} |")
    if ladder:
        lines += [
            "",
            f"Capacity: the highest rate of the ladder {'/'.join(f'{x:.0f}' for x in LADDER)} req/s at which "
            f"achieved >= {100 * SUSTAINED_FRACTION:.0f} % of the target and p99 (dropped and failed requests "
            f"counted as slowest) < {SLO_P99_MS:.0f} ms; rungs other than {rate:.0f} req/s run {ladder_seconds:g} s. "
            "Measured on this machine in this run, not a guarantee.",
            "",
            "| operation | rungs (req/s: achieved, p99 ms, dropped) | capacity req/s |",
            "|---|---|---:|",
        ]
        for r in rows:
            mine = sorted([r, *(g for g in rungs if g["operation"] == r["operation"])], key=lambda g: g["target_rps"])
            cells = "; ".join(f"{g['target_rps']:.0f}: {g['achieved_rps']}, {g['p99_all_ms'] or '-'}, {g['dropped']}"
                              for g in mine)
            lines.append(f"| {r['operation']} | {cells} | {r['capacity_rps']} |")
    n_stream = 10 if quick else STREAM_N
    lines += [
        "",
        f"Event streams: tenant B submits and lists {n_stream} times each, one call after the other "
        "(closed loop, fit check off), with tenant A's event stream (`Accept: text/event-stream`) open on "
        "a job of its own or not, on each store (one server process each). Ratios are against the same "
        "store without a stream, in the same run; the SQLite store is a file on local disk.",
        "",
        "| store | stream open | submit p50 ms | submit p99 ms | list p50 ms | list p99 ms | errors "
        "| submit p50 / no stream | list p50 / no stream |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in stream_rows:
        base_row = next(x for x in stream_rows if x["store"] == r["store"] and not x["stream_open"])
        lines.append(
            f"| {r['store']} | {'yes' if r['stream_open'] else 'no'} | {r['submit_p50_ms']} | {r['submit_p99_ms']} | "
            f"{r['list_p50_ms']} | {r['list_p99_ms']} | {r['errors']} | "
            f"{_ratio(r['submit_p50_ms'], base_row['submit_p50_ms'])}x | {_ratio(r['list_p50_ms'], base_row['list_p50_ms'])}x |")
    lines += [
        "",
        f"Machine load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} before and "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after (which includes this run's own load), on {cpus} "
        f"CPUs: {'LOADED before the run, other work shared the CPUs' if busy else 'quiet before the run'}; "
        f"whole run {wall_s} s.",
    ]
    return {"name": "api", "client": client, "rate": rate, "seconds": seconds, "warmup_s": warmup_s, "concurrency": concurrency,
            "max_late_s": MAX_LATE_S, "late_s": LATE_S, "rows": rows, "ladder": rungs, "streams": stream_rows,
            "load_avg": {"before": list(load_before), "after": list(load_after)}, "wall_s": wall_s,
            "markdown": "\n".join(lines) + "\n"}


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(run(quick=True), indent=2))
