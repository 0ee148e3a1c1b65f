"""The API benchmark's code path (``bench/api.py``), tiny: a smoke run, nothing about timing asserted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench import api


class _SlowClient:
    """Answers every request after ``delay_s``; counts what was in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.in_flight = self.most_in_flight = self.sent = 0

    async def request(self, method: str, path: str, **kw: object) -> object:
        self.sent += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        return type("R", (), {"status_code": 200})()


def _in_thread(fn):
    """Run ``fn`` in a fresh thread: the benchmark starts its own event loop (``asyncio.run``), which
    fails in a thread where an earlier test left one running."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


@pytest.mark.unit
def test_open_loop_bounds_in_flight_and_drops_what_it_cannot_send() -> None:
    # a server far slower than the rate: at most 2 in flight, and the backlog is dropped, not queued
    client = _SlowClient(delay_s=0.3)
    row = _in_thread(lambda: asyncio.run(api.open_loop(client, rate=100, seconds=0.3,
                                                       make=lambda i: ("GET", "/x", {}), concurrency=2,
                                                       max_late_s=0.05)))
    assert row["requests"] == 30
    assert client.most_in_flight <= 2
    assert client.sent == row["ok"] + row["errors"] < row["requests"]
    assert row["ok"] + row["errors"] + row["dropped"] == row["requests"]
    assert row["dropped"] > 0 and row["errors"] == 0
    assert row["p99_all_ms"] is None  # most requests never succeeded: no p99 over all of them
    assert not api.sustained(row)


@pytest.mark.unit
def test_capacity_reads_the_ladder() -> None:
    def rung(rate: float, ok: bool) -> dict[str, object]:
        return {"target_rps": rate, "achieved_rps": rate if ok else rate / 2, "p99_all_ms": 5.0 if ok else None}

    assert api.capacity(rung(200, True), [rung(400, False)]) == "200"
    assert api.capacity(rung(200, True), [rung(400, True)]) == ">= 400"
    assert api.capacity(rung(200, False), [rung(100, True)]) == "100"
    assert api.capacity(rung(200, False), [rung(100, False), rung(50, False)]) == "< 50"


@pytest.mark.postgres
def test_api_bench_runs_end_to_end(pg_server_url: str, tmp_path: Path) -> None:
    from bench.common import write_result

    result = _in_thread(lambda: api.run(quick=True, rate=20, seconds=0.5, warmup_s=0.1, ladder=False))
    ops = [r["operation"] for r in result["rows"]]
    assert ops == ["GET /healthz (baseline, no database)", "POST /v1/jobs (submit)", "GET /v1/jobs/{id} (get)"]
    for r in result["rows"]:
        assert r["requests"] == 10
        assert r["ok"] + r["errors"] + r["dropped"] == r["requests"]
        assert r["errors"] == 0, r["first_error"]
        assert r["ok"] > 0 and r["p50_ms"] is not None
    assert set(result["load_avg"]) == {"before", "after"}
    streams = result["streams"]
    assert [(r["store"], r["stream_open"]) for r in streams] == [
        ("SQLite", False), ("SQLite", True), ("PostgreSQL", False), ("PostgreSQL", True)]
    assert all(r["errors"] == 0 and r["submit_p50_ms"] is not None for r in streams), streams
    json_path, md_path = write_result(result, tmp_path)
    assert json.loads(json_path.read_text())["rows"][1]["operation"] == "POST /v1/jobs (submit)"
    text = md_path.read_text()
    assert "| POST /v1/jobs (submit) | 20 |" in text and "load average" in text
