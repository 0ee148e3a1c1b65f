"""API latency: submit (``POST /v1/jobs``) and get (``GET /v1/jobs/{id}``) at a fixed open-loop
rate against a real ``orthoplex serve`` (uvicorn, one process) on 127.0.0.1 backed by PostgreSQL,
with ``GET /healthz`` (no database) at the same rate as the baseline, all in one run.

Open loop: request *i* is due at ``t0 + i / rate`` whatever happened to the earlier ones, and its
latency is counted from that due time, so a stalled server shows up as latency instead of as a
lower send rate (no coordinated omission). The client shares the machine with the server.
The database is a scratch one on ``ORTHOPLEX_TEST_DATABASE_URL``'s server (default: local).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

RATE = 200.0
ADMIN = "bench-admin-" + uuid.uuid4().hex[:8]
SPEC = {"name": "bench", "model": "tiny", "steps": 10, "global_batch": 8, "min_gpus": 1, "max_gpus": 2}


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


async def _open_loop(client: Any, rate: float, seconds: float, make: Any) -> dict[str, Any]:
    n = int(rate * seconds)
    lat: list[float] = []
    errors = 0
    first_error: list[str] = []
    t0 = time.perf_counter() + 0.05

    async def one(i: int) -> None:
        nonlocal errors
        due = t0 + i / rate
        method, path, kw = make(i)
        why = ""
        try:
            r = await client.request(method, path, **kw)
            if r.status_code >= 400:
                why = f"HTTP {r.status_code}"
        except Exception as exc:
            why = type(exc).__name__
        if not why:
            lat.append(time.perf_counter() - due)
        else:
            errors += 1
            if not first_error:
                first_error.append(why)

    tasks = []
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    sent_s = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    done_s = time.perf_counter() - t0
    return {"requests": n, "ok": len(lat), "errors": errors, "achieved_rps": round(len(lat) / done_s, 1),
            "send_rps": round(n / sent_s, 1), "p50_ms": round(1e3 * _pct(lat, 0.50), 2),
            "p99_ms": round(1e3 * _pct(lat, 0.99), 2), "max_ms": round(1e3 * max(lat, default=float("nan")), 2),
            "first_error": first_error[0] if first_error else None}


async def _measure(url: str, token: str, seconds: float) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    headers = {"Authorization": f"Bearer {token}"}
    rows = []
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30.0) as c:
        # warm-up: connections, the planner cache for SPEC, the server's code paths
        for i in range(20):
            await c.get("/healthz")
            await c.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": f"warm-{i}"})
        ids: list[int] = []

        def submit(i: int) -> tuple[str, str, dict[str, Any]]:
            return "POST", "/v1/jobs", {"json": SPEC, "headers": {"Idempotency-Key": f"b-{i}-{uuid.uuid4().hex}"}}

        cases = [
            ("GET /healthz (baseline, no database)", lambda i: ("GET", "/healthz", {})),
            ("POST /v1/jobs (submit)", submit),
        ]
        for label, make in cases:
            rows.append({"operation": label, "target_rps": RATE, **await _open_loop(c, RATE, seconds, make)})
        listing = (await c.get("/v1/jobs", params={"limit": 100})).json()["items"]
        ids = [j["id"] for j in listing]
        rows.append({"operation": "GET /v1/jobs/{id} (get)", "target_rps": RATE,
                     **await _open_loop(c, RATE, seconds, lambda i: ("GET", f"/v1/jobs/{ids[i % len(ids)]}", {}))})
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    """Measure (see the module docstring); ``quick`` runs 3 s per operation instead of 15 s."""
    import httpx

    from service.api.process import LiveServer
    from service.db import migrate

    seconds = 3.0 if quick else 15.0
    load_before = os.getloadavg()[0]
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
        rows = asyncio.run(_measure(server.url, token, seconds))
    finally:
        if server is not None:
            server.stop()
        _admin_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    load_after = os.getloadavg()[0]
    lines = [
        f"Open-loop client at {RATE:.0f} requests/s for {seconds:.0f} s per operation against one uvicorn "
        "process on 127.0.0.1 (PostgreSQL store; client and server share the machine). Latency is counted "
        f"from each request's due time. Machine load average (1 min) {load_before:.1f} before, "
        f"{load_after:.1f} after, on {os.cpu_count()} CPUs: above the CPU count, the numbers measure the "
        "contention, not the API.",
        "",
        "| operation | target req/s | achieved req/s | p50 ms | p99 ms | max ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        err = f"{r['errors']} ({r['first_error']})" if r["errors"] else "0"
        lines.append(f"| {r['operation']} | {r['target_rps']:.0f} | {r['achieved_rps']} | {r['p50_ms']} | "
                     f"{r['p99_ms']} | {r['max_ms']} | {err} |")
    return {"name": "api", "rows": rows, "load_avg": [load_before, load_after], "markdown": "\n".join(lines) + "\n"}


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(run(quick=True), indent=2))
