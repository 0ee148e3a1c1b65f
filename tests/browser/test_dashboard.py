"""The dashboard in headless Chromium against the real demo (Ray cluster, service, two tenants, a
job that recovered from a killed node). See ``conftest.py``."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from service.db.models import ApiToken, utcnow
from service.db.session import make_engine, make_sessionmaker
from tests.browser.conftest import shot, sign_in
from tests.fixtures.demo_stack import DemoStack

# the first test also waits for the demo (its session fixture), which takes minutes on a loaded machine
pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(1200)]

LONG = 420_000  # ms: a job on a loaded 2-core machine can take minutes to start and step


def research(demo: DemoStack) -> dict[str, Any]:
    return demo.tenants["research"]


def product(demo: DemoStack) -> dict[str, Any]:
    return demo.tenants["product"]


def test_sign_in_with_a_bad_and_a_good_token(page, demo: DemoStack) -> None:
    page.goto(demo.ui)
    page.get_by_test_id("token-input").fill("opx_notatoken_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
    page.get_by_test_id("login").click()
    err = page.get_by_test_id("login-error")
    err.wait_for(state="visible")
    assert "not accepted" in err.inner_text()
    assert page.get_by_test_id("job-row").count() == 0
    shot(page, "sign-in-error")
    token = research(demo)["token"]
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("login").click()
    page.get_by_test_id("job-row").first.wait_for()
    # the token lives in this tab's session storage and never in a URL
    assert page.evaluate("sessionStorage.getItem('orthoplex.token')") == token
    assert token not in page.url
    assert page.evaluate("localStorage.length") == 0


def test_a_tenant_sees_only_its_own_jobs(page, demo: DemoStack) -> None:
    sign_in(page, demo, product(demo)["token"])
    page.get_by_test_id("job-row").first.wait_for()
    shown = {int(r.get_attribute("data-job-id")) for r in page.get_by_test_id("job-row").all()}
    assert set(product(demo)["job_ids"]) <= shown
    assert not shown & set(research(demo)["job_ids"])
    assert page.get_by_test_id("nav-cluster").is_hidden()
    # another tenant's job, opened directly, is not found (existence is not revealed)
    other = research(demo)["job_ids"][0]
    page.goto(f"{demo.ui}jobs/{other}")
    page.get_by_test_id("not-found").wait_for()
    assert page.get_by_test_id("loss-chart").count() == 0
    page.goto(f"{demo.ui}cluster")
    assert "admin" in page.get_by_test_id("message").inner_text()


def test_job_page_after_a_recovery(page, demo: DemoStack) -> None:
    job_id = research(demo)["job_ids"][0]
    token = research(demo)["token"]
    with demo.client(token) as c:
        metrics = c.get(f"/v1/jobs/{job_id}/metrics").json()
        events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    assert any(e["type"] == "recovery" for e in events), "the demo's job did not recover; nothing to show"
    sign_in(page, demo, token)
    page.locator(f'[data-testid="job-row"][data-job-id="{job_id}"]').click()
    page.wait_for_url(f"**/ui/jobs/{job_id}")
    chart = page.get_by_test_id("loss-chart")
    chart.wait_for()
    page.get_by_test_id("recovery-row").first.wait_for()
    assert int(chart.get_attribute("data-points")) == len([m for m in metrics if m["loss"] is not None]) > 0
    assert chart.locator('[data-testid="chart-marker"][data-kind="recovery"]').count() >= 1
    assert page.locator('path[data-series^="loss"]').count() >= 1
    # the event timeline, with the failure and the recovery
    types = {r.get_attribute("data-type") for r in page.get_by_test_id("event-row").all()}
    assert {"node_lost", "replan", "resumed", "recovery", "transition"} <= types
    assert "step" not in types
    # the ledger: cause, layout before -> after, six phases
    ledger = page.get_by_test_id("recovery-ledger")
    row = ledger.get_by_test_id("recovery-row").first
    assert row.get_attribute("data-cause") == "node_lost"
    assert re.search(r"tp\d.*→ tp\d", row.get_by_test_id("recovery-layouts").inner_text())
    assert row.locator("rect[data-phase]").count() == 6
    # the rank grid of the plan in force: one cell per rank, distinct coordinates, the lost node shown
    resumed = [e for e in events if e["type"] == "resumed"][-1]["payload"]
    layout = resumed["layout"]
    cells = page.get_by_test_id("rank-cell").all()
    assert len(cells) == resumed["world_size"] == layout["tp"] * layout["pp"] * layout["cp"] * layout["dp"]
    coords = {tuple(int(c.get_attribute(f"data-{k}")) for k in ("tp", "pp", "cp", "dp")) for c in cells}
    assert len(coords) == len(cells)
    for k in ("tp", "pp", "cp", "dp"):
        assert {c[("tp", "pp", "cp", "dp").index(k)] for c in coords} == set(range(layout[k]))
    lost = next(n for n in events if n["type"] == "node_lost")["payload"]["nodes"]
    assert page.locator(f'[data-testid="rank-node"][data-node="{lost[0]}"]').get_attribute("data-status") == "lost"
    assert all(c.get_attribute("data-node") != lost[0] for c in cells)
    # the planner's explanation
    page.get_by_test_id("alternatives").wait_for()
    assert "bubble" in page.get_by_test_id("plan-explain").inner_text()
    shot(page, "job-after-recovery")


def _submit(demo: DemoStack, token: str, **kw: Any) -> int:
    body = {"name": f"b-{uuid.uuid4().hex[:6]}", "model": "tiny", "steps": 2000, "global_batch": 8,
            "min_gpus": 2, "max_gpus": 2, "lr": 3e-3, **kw}
    with demo.client(token) as c:
        r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_live_update_and_cancel_of_a_running_job(page, demo: DemoStack) -> None:
    token = research(demo)["token"]
    job_id = _submit(demo, token)
    try:
        sign_in(page, demo, token)
        page.goto(f"{demo.ui}jobs/{job_id}")
        step = page.get_by_test_id("job-step")
        step.wait_for()
        # without a reload, the page follows the job: steps appear and grow
        page.wait_for_function("() => Number(document.querySelector('[data-testid=job-step]').dataset.step) >= 2",
                               timeout=LONG)
        first = int(step.get_attribute("data-step"))
        page.wait_for_function(f"() => Number(document.querySelector('[data-testid=job-step]').dataset.step) > {first}",
                               timeout=LONG)
        assert int(page.get_by_test_id("loss-chart").get_attribute("data-points")) >= 1
        assert page.get_by_test_id("job-state").inner_text() in ("RUNNING", "RECOVERING")
        shot(page, "job-running")
        # cancel, with a confirmation that can be declined
        page.get_by_test_id("cancel-job").click()
        page.get_by_test_id("keep-job").click()
        assert page.get_by_test_id("cancel-dialog").is_hidden()
        page.get_by_test_id("cancel-job").click()
        page.get_by_test_id("confirm-cancel").click()
        page.wait_for_function("() => document.querySelector('[data-testid=job-state]').textContent === 'CANCELLED'",
                               timeout=LONG)
        assert page.get_by_test_id("cancel-job").is_hidden()
        with demo.client(token) as c:
            assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"
    finally:
        with demo.client(token) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_submit_with_plan_preview_and_a_field_error(page, demo: DemoStack) -> None:
    token = product(demo)["token"]
    sign_in(page, demo, token)
    page.get_by_test_id("nav-submit").click()
    name = f"ui-{uuid.uuid4().hex[:6]}"
    page.get_by_label("Name").fill(name)
    page.get_by_label("Steps").fill("4")
    page.get_by_label("Min GPUs").fill("2")
    page.get_by_label("Max GPUs").fill("1")
    page.get_by_test_id("preview-plan").click()
    err = page.locator('[data-testid="field-error"][data-field="max_gpus"]')
    err.wait_for(state="visible")
    assert "max_gpus" in err.inner_text() and "min_gpus" in err.inner_text()
    assert page.get_by_label("Max GPUs").get_attribute("aria-invalid") == "true"
    shot(page, "submit-field-error")
    page.get_by_label("Max GPUs").fill("2")
    page.get_by_test_id("preview-plan").click()
    page.get_by_test_id("preview-plan-row").first.wait_for()
    assert err.is_hidden()
    assert "tp" in page.get_by_test_id("plan-preview").inner_text()
    # what the recovery block (left at its defaults) comes to on the best plan, and why
    assert "Why:" in page.get_by_test_id("preview-recovery").inner_text()
    assert page.get_by_label("Recovery", exact=True).input_value() == "auto"
    shot(page, "submit-preview")
    page.get_by_test_id("submit-job").click()
    page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    try:
        assert page.get_by_test_id("job-title").inner_text().startswith(name)
        with demo.client(token) as c:
            assert c.get(f"/v1/jobs/{job_id}").json()["name"] == name
    finally:
        with demo.client(token) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_admin_cluster_view(page, demo: DemoStack) -> None:
    sign_in(page, demo, demo.admin_token)
    page.get_by_test_id("nav-cluster").click()
    page.wait_for_url("**/ui/cluster")
    page.get_by_test_id("cluster-node").first.wait_for()
    page.get_by_test_id("decision-row").first.wait_for()
    with demo.client() as c:
        cluster = c.get("/v1/cluster").json()
    nodes = page.get_by_test_id("cluster-node")
    assert nodes.count() == len(cluster["nodes"]) >= 3
    assert page.locator('[data-testid="cluster-node"][data-alive="false"]').count() >= 1  # the node the demo killed
    gpus = sum(n["gpus_total"] for n in cluster["nodes"])
    assert page.get_by_test_id("gpu").count() >= gpus  # every GPU of every node drawn
    tenants = {r.get_attribute("data-tenant") for r in page.get_by_test_id("tenant-row").all()}
    assert {"research", "product"} <= tenants
    # tenants' colours are applied (inline style attributes would be refused by the page's CSP)
    key = page.locator('[data-testid="tenant-row"] .key').first
    assert key.evaluate("e => getComputedStyle(e).backgroundColor") not in ("rgba(0, 0, 0, 0)", "transparent")
    assert page.get_by_test_id("decision-row").first.locator("td").nth(4).inner_text().strip()  # a reason
    # the admin's job list shows every tenant's jobs
    page.get_by_test_id("nav-jobs").click()
    page.get_by_test_id("job-row").first.wait_for()
    shown = {int(r.get_attribute("data-job-id")) for r in page.get_by_test_id("job-row").all()}
    assert set(research(demo)["job_ids"]) | set(product(demo)["job_ids"]) <= shown
    page.get_by_test_id("nav-cluster").click()
    page.get_by_test_id("cluster-node").first.wait_for()
    shot(page, "cluster")


def test_bad_input_never_breaks_the_page(page, demo: DemoStack) -> None:
    token = research(demo)["token"]
    sign_in(page, demo, token)
    for path in ("jobs/999999999", "jobs/abc", "jobs/0"):
        page.goto(f"{demo.ui}{path}")
        page.get_by_test_id("not-found").wait_for()
    page.goto(f"{demo.ui}nowhere")
    page.get_by_test_id("not-found").wait_for()
    # the API stops answering, then comes back
    job_id = research(demo)["job_ids"][0]
    page.goto(f"{demo.ui}jobs/{job_id}")
    page.get_by_test_id("loss-chart").wait_for()
    page.route("**/v1/**", lambda route: route.abort("connectionreset"))
    page.get_by_test_id("conn-status").wait_for(state="visible")
    assert page.get_by_test_id("loss-chart").is_visible()  # what was shown stays
    page.unroute("**/v1/**")
    page.get_by_test_id("conn-status").wait_for(state="hidden")


def _new_token(demo: DemoStack, tenant: str) -> dict[str, Any]:
    with demo.client() as c:
        r = c.post(f"/v1/tenants/{demo.tenant_id(tenant)}/tokens", json={"name": "ui-test"})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_revoked_or_expired_token_signs_out_with_a_message(page, demo: DemoStack) -> None:
    tok = _new_token(demo, "product")
    sign_in(page, demo, tok["token"])
    page.get_by_test_id("job-row").first.wait_for()
    with demo.client() as c:
        assert c.delete(f"/v1/tokens/{tok['id']}").status_code == 204
    err = page.get_by_test_id("login-error")
    err.wait_for(state="visible")
    assert "revoked or expired" in err.inner_text()
    assert page.evaluate("sessionStorage.getItem('orthoplex.token')") is None
    # a token that expires while signed in (expiry written in the demo's database)
    tok = _new_token(demo, "product")
    sign_in(page, demo, tok["token"])
    page.get_by_test_id("job-row").first.wait_for()
    engine = make_engine(f"sqlite:///{demo.workdir / 'orthoplex.db'}")
    with make_sessionmaker(engine)() as s:
        s.execute(sa.update(ApiToken).where(ApiToken.id == tok["id"])
                  .values(expires_at=utcnow() - dt.timedelta(minutes=1)))
        s.commit()
    engine.dispose()
    err.wait_for(state="visible")
    assert "revoked or expired" in err.inner_text()


@pytest.mark.parametrize("width,height,name", [(1280, 800, "desktop"), (390, 844, "phone")])
def test_usable_at_desktop_and_phone_width(browser, demo: DemoStack, width: int, height: int, name: str) -> None:
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    try:
        sign_in(page, demo, research(demo)["token"])
        page.get_by_test_id("job-row").first.wait_for()
        job_id = research(demo)["job_ids"][0]
        for path in ("", f"jobs/{job_id}"):
            page.goto(f"{demo.ui}{path}")
            page.locator('[data-testid="job-row"], [data-testid="recovery-row"]').first.wait_for()
            # nothing is wider than the screen: wide tables scroll inside their own box
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{name} {path or 'jobs'}: page is {overflow}px wider than the screen"
            assert page.get_by_test_id("logout").is_visible()
            shot(page, f"{name}-{'job' if path else 'jobs'}")
    finally:
        ctx.close()


def test_keyboard_only_and_labels(page, demo: DemoStack) -> None:
    page.goto(demo.ui)
    field = page.get_by_label("API token")
    field.wait_for()
    assert page.evaluate("document.activeElement.dataset.testid") == "token-input"
    page.keyboard.type(research(demo)["token"])
    page.keyboard.press("Enter")
    page.get_by_test_id("job-row").first.wait_for()
    for _ in range(40):  # Tab through the page to the first job's link
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.testid") == "job-link":
            break
    else:
        pytest.fail("no job link reachable with Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
    page.get_by_test_id("job-title").wait_for()
    # every form control of the submit page has a label
    page.goto(f"{demo.ui}submit")
    page.get_by_test_id("preview-plan").wait_for()
    unlabelled = page.evaluate("[...document.querySelectorAll('input, select')].filter(e => !e.labels.length)"
                               ".map(e => e.id)")
    assert unlabelled == []
    # the rank cells of the grid are focusable and named
    page.goto(f"{demo.ui}jobs/{research(demo)['job_ids'][0]}")
    cell = page.get_by_test_id("rank-cell").first
    cell.wait_for()
    assert cell.get_attribute("tabindex") == "0" and "rank" in cell.get_attribute("aria-label")
