"""``orthoplex bench dashboard``: the dashboard with 1,000 jobs and a 100,000-step curve.

Setup: a scratch SQLite database (migrated), one tenant with 1,000 jobs (the newest RUNNING with
metrics and events), one of them with a 100,000-step curve (100,000 metric rows and 100,000 ``step``
events plus its plan, failure and recovery events), served by a real ``orthoplex serve
--no-controller`` (one uvicorn process on 127.0.0.1). Client, server and browser share the machine.

Measured, each against a baseline from the same run:

- **API**: sequential requests (one in flight), median and p95 of ``repeats`` each:
  ``GET /healthz`` (the baseline: no database), ``GET /v1/dashboard/jobs`` first and last page
  (50 rows of 1,000), the 100,000-step job's page (``/v1/dashboard/jobs/{id}``) and its curve
  downsampled to 1,500 points; against the way a client would get the curve without downsampling:
  every metric row through ``GET /v1/jobs/{id}/metrics`` pages of 1,000 (100 requests).
- **Page render** in headless Chromium (Debian's ``/usr/bin/chromium`` through Playwright): from
  navigation to the jobs table drawn (first page of the 1,000 jobs) and to the 100,000-step job's
  loss chart drawn, against the same job page for a 100-step job (the baseline).
"""

from __future__ import annotations

import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.progress import Progress

ADMIN = "bench-dashboard-admin-token"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def _seed(url: str, jobs: int, steps: int) -> dict[str, Any]:
    """The tenant, its token, the jobs, the big curve and a small one; returns ids and the token."""
    import sqlalchemy as sa

    from service.api.security import new_token
    from service.db.models import ApiToken, Event, Job, Metric, Tenant, utcnow
    from service.db.session import make_engine, make_sessionmaker

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    now = utcnow()
    with sessions() as s:
        tenant = Tenant(name="bench", gpu_quota=64, max_jobs=100_000, submit_per_minute=100_000)
        s.add(tenant)
        s.flush()
        secret, prefix, digest = new_token()
        s.add(ApiToken(tenant_id=tenant.id, name="bench", prefix=prefix, token_hash=digest, created_at=now))
        spec = {"name": "bench", "model": "tiny", "steps": steps, "global_batch": 8, "min_gpus": 2, "max_gpus": 4}
        rows = [{"tenant_id": tenant.id, "name": f"bench-{i}", "spec": spec, "state": "SUCCEEDED" if i < jobs - 2
                 else "RUNNING", "reason": "seeded", "min_gpus": 2, "max_gpus": 4, "gpus_allocated": 0 if i < jobs - 2
                 else 4, "created_at": now, "updated_at": now, "attempt": 1, "epoch": 1} for i in range(jobs)]
        s.execute(sa.insert(Job), rows)
        big, small = s.scalars(sa.select(Job.id).order_by(Job.id.desc()).limit(2)).all()
        s.commit()
        t0 = now - dt.timedelta(seconds=steps)
        layout = {"tp": 2, "pp": 2, "cp": 1, "dp": 1}
        for job_id, n in ((big, steps), (small, 100)):
            s.execute(sa.insert(Metric), [{"job_id": job_id, "epoch": 1, "step": i, "loss": 10.0 / (1 + i / 100),
                                          "tokens_per_s": 1000.0 + (i % 50), "ts": t0 + dt.timedelta(seconds=i)}
                                         for i in range(1, n + 1)])
            s.execute(sa.insert(Event), [{"job_id": job_id, "epoch": 1, "source": "runtime:a1", "seq": i + 10,
                                         "type": "step", "payload": {"step": i, "loss": 1.0}, "ts": t0}
                                        for i in range(1, n + 1)])
            s.execute(sa.insert(Event), [
                {"job_id": job_id, "epoch": 1, "source": "runtime:a1", "seq": 1, "type": "plan", "ts": t0,
                 "payload": {"layout": layout, "short": "tp2·pp2·cp1·dp1", "num_gpus": 4}},
                {"job_id": job_id, "epoch": 1, "source": "runtime:a1", "seq": 2, "type": "ranks_mapped", "ts": t0,
                 "payload": {"layout": layout, "rank_to_node": ["n1", "n1", "n2", "n2"]}},
            ])
        s.commit()
    engine.dispose()
    return {"token": secret, "big": big, "small": small}


def _timed(fn: Any, repeats: int) -> dict[str, float]:
    fn()  # warm-up, not measured
    xs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    xs.sort()
    return {"p50_ms": statistics.median(xs), "p95_ms": xs[min(len(xs) - 1, int(0.95 * len(xs)))], "n": len(xs)}


def _get(c: httpx.Client, path: str, **params: Any) -> Any:
    r = c.get(path, params=params)
    r.raise_for_status()
    return r.json()


def _render(base: str, token: str, ids: dict[str, Any], repeats: int) -> dict[str, dict[str, float]]:
    if not CHROMIUM.exists():
        raise RuntimeError(f"Chromium is missing at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    out: dict[str, dict[str, float]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        page.goto(f"{base}/ui/")
        page.get_by_test_id("token-input").fill(token)
        page.get_by_test_id("login").click()
        page.get_by_test_id("job-row").first.wait_for()

        def jobs() -> None:
            page.goto(f"{base}/ui/")
            # a function, not an expression: the page's CSP refuses eval
            page.wait_for_function("() => document.querySelectorAll('[data-testid=job-row]').length >= 50")

        def job(job_id: int) -> Any:
            def go() -> None:
                page.goto(f"{base}/ui/jobs/{job_id}")
                page.wait_for_function("() => document.querySelector('[data-testid=loss-chart]')"
                                       " && Number(document.querySelector('[data-testid=loss-chart]').dataset.points) > 0")
            return go

        out["jobs page (1,000 jobs, first 50 drawn)"] = _timed(jobs, repeats)
        out["job page, 100-step curve (baseline)"] = _timed(job(ids["small"]), repeats)
        out["job page, 100,000-step curve"] = _timed(job(ids["big"]), repeats)
        out["_points"] = {"p50_ms": float(page.get_by_test_id("loss-chart").get_attribute("data-points")), "p95_ms": 0, "n": 1}
        browser.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    from service.api.process import LiveServer
    from service.db import migrate

    jobs, steps = (200, 10_000) if quick else (1_000, 100_000)
    repeats = 5 if quick else 20
    tmp = Path(tempfile.mkdtemp(prefix="orthoplex-bench-dashboard-"))
    url = f"sqlite:///{tmp / 'bench.db'}"
    with Progress() as progress:
        task = progress.add_task("seeding", total=4)
        migrate.upgrade(url)
        ids = _seed(url, jobs, steps)
        progress.update(task, advance=1, description="starting the API")
        server = LiveServer(url, ADMIN, log_path=tmp / "server.log")
        server.start()
        api: dict[str, dict[str, float]] = {}
        try:
            c = httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {ids['token']}"})
            progress.update(task, advance=1, description="API latencies")
            last_cursor = None
            cursor = None
            while True:  # the cursor of the last page, for the deep-page measurement
                page = _get(c, "/v1/dashboard/jobs", limit=50, **({"cursor": cursor} if cursor else {}))
                if page["next_cursor"] is None:
                    break
                last_cursor, cursor = cursor, page["next_cursor"]
            big = ids["big"]
            api["GET /healthz (baseline)"] = _timed(lambda: c.get("/healthz"), repeats)
            api["GET /v1/dashboard/jobs, first page of 50"] = _timed(lambda: _get(c, "/v1/dashboard/jobs", limit=50), repeats)
            api["GET /v1/dashboard/jobs, last page"] = _timed(
                lambda: _get(c, "/v1/dashboard/jobs", limit=50, cursor=cursor or last_cursor), repeats)
            api[f"GET /v1/dashboard/jobs/{{id}} ({steps:,} steps)"] = _timed(lambda: _get(c, f"/v1/dashboard/jobs/{big}"), repeats)
            api[f"GET .../curve?max_points=1500 ({steps:,} steps)"] = _timed(
                lambda: _get(c, f"/v1/dashboard/jobs/{big}/curve", max_points=1500), repeats)

            def full_curve() -> None:
                since = -1
                while True:
                    rows = _get(c, f"/v1/jobs/{big}/metrics", since_step=since, limit=1000)
                    if len(rows) < 1000:
                        return
                    since = rows[-1]["step"]

            api[f"every metric row, pages of 1,000 (no downsampling, {steps // 1000} requests)"] = _timed(
                full_curve, 2 if quick else 3)
            progress.update(task, advance=1, description="page render in Chromium")
            render = _render(server.url, ids["token"], ids, 3 if quick else 10)
            progress.update(task, advance=1)
        finally:
            server.stop()
    points = int(render.pop("_points")["p50_ms"])
    base = api["GET /healthz (baseline)"]["p50_ms"]
    curve_key = f"GET .../curve?max_points=1500 ({steps:,} steps)"
    full_key = next(k for k in api if k.startswith("every metric row"))
    lines = [f"{jobs:,} jobs; one with a {steps:,}-step curve ({steps:,} metric rows and {steps:,} step events); "
             "SQLite; one `orthoplex serve --no-controller` process; client, server and Chromium on the same machine.",
             "", "| API request | p50 ms | p95 ms | n | p50 / healthz |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {v['p50_ms']:.1f} | {v['p95_ms']:.1f} | {v['n']} | {v['p50_ms'] / base:.1f}x |" for k, v in api.items()]
    lines += ["", f"Downsampled curve vs every row: {api[full_key]['p50_ms'] / api[curve_key]['p50_ms']:.0f}x faster "
              f"({points} points drawn instead of {steps:,}).", "",
              "| page (headless Chromium, 1280x800) | p50 ms | p95 ms | n | p50 / 100-step job page |", "|---|---:|---:|---:|---:|"]
    rbase = render["job page, 100-step curve (baseline)"]["p50_ms"]
    lines += [f"| {k} | {v['p50_ms']:.0f} | {v['p95_ms']:.0f} | {v['n']} | {v['p50_ms'] / rbase:.2f}x |" for k, v in render.items()]
    lines += ["", "Baselines' limits: `/healthz` touches no database (the floor of one request through uvicorn "
              "and httpx here); the 100-step page is the same page with a small job, so its ratio is the cost "
              "of the big curve alone. Times include the client's and Chromium's CPU on the same 2 cores."]
    return {"name": "dashboard", "jobs": jobs, "steps": steps, "api": api, "render": render, "points_drawn": points,
            "markdown": "\n".join(lines)}
