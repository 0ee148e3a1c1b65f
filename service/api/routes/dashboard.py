"""``/v1/dashboard``: the views the web dashboard (``/ui/``) reads, sized for large jobs and queues.

- ``GET /v1/dashboard/jobs``: one page of job rows (progress, GPUs, layout, tokens/s, last event).
- ``GET /v1/dashboard/jobs/{id}``: the job, its timeline (every event but ``step``), the recovery
  ledger and the rank grid of the plan in force.
- ``GET /v1/dashboard/jobs/{id}/curve?max_points=``: loss and tokens/s per step, downsampled in SQL
  (min / mean / max per bucket of steps, per attempt's epoch) to at most ``max_points`` points.
- ``GET /v1/dashboard/jobs/{id}/explain``: the planner's breakdown for the job's spec on the GPU
  count in force, and the alternatives it beat.
- ``GET /v1/dashboard/tenants``, ``GET /v1/dashboard/decisions``: admin only.

A tenant token sees its own jobs only (filtered in SQL; another tenant's job is a 404); the admin
token sees every job, read only.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Query, Request, status

from service.api import job_story, repo
from service.api.attempts import charge_planning
from service.api.deps import Admin, AnyPrincipal, Db, Principal
from service.api.errors import responses
from service.api.fit_check import PlannerRefused, PlannerUnavailable, dry_run
from service.api.schemas import EventPublic, HFModel, JobPublic, JobSpec, JobStateName
from service.db.models import Event, Job, Metric, Tenant
from service.settings import data_area
from workers.job_inputs import model_shape
from workers.states import HOLDING

router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="job id")]
TIMELINE_LIMIT = 500


def _scope(q: Any, principal: Principal) -> Any:
    return q if principal.is_admin else q.where(Job.tenant_id == principal.tenant.id)  # type: ignore[union-attr]


def _job(db: Db, principal: Principal, job_id: int) -> Job:
    job = db.scalars(_scope(sa.select(Job).where(Job.id == job_id), principal)).one_or_none()
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    return job


def _last_per_job(db: Db, ids: list[int], *where: Any) -> dict[int, Event]:
    if not ids:
        return {}
    last = (sa.select(sa.func.max(Event.id)).where(Event.job_id.in_(ids), *where).group_by(Event.job_id))
    return {e.job_id: e for e in db.scalars(sa.select(Event).where(Event.id.in_(last)))}


@router.get("/jobs", operation_id="dashboard_jobs", summary="Job rows for the dashboard",
            responses=responses(401))
def dashboard_jobs(
    principal: AnyPrincipal,
    db: Db,
    state: Annotated[JobStateName | None, Query(description="only jobs in this state")] = None,
    cursor: Annotated[int | None, Query(ge=1, le=2**31 - 1, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> dict[str, Any]:
    """Newest first, one page; ``next_cursor`` is null on the last page."""
    q = _scope(sa.select(Job, Tenant.name).join(Tenant, Tenant.id == Job.tenant_id), principal)
    if state is not None:
        q = q.where(Job.state == state)
    if cursor is not None:
        q = q.where(Job.id < cursor)
    rows = db.execute(q.order_by(Job.id.desc()).limit(limit)).all()
    ids = [j.id for j, _ in rows]
    latest: dict[int, tuple[int, float | None]] = {}
    if ids:
        top = (sa.select(Metric.job_id, sa.func.max(Metric.step).label("step"))
               .where(Metric.job_id.in_(ids)).group_by(Metric.job_id).subquery())
        for job_id, step, tps in db.execute(
            sa.select(Metric.job_id, Metric.step, Metric.tokens_per_s)
            .join(top, sa.and_(top.c.job_id == Metric.job_id, top.c.step == Metric.step))
            .order_by(Metric.epoch)
        ):
            latest[job_id] = (step, tps)
    last_event = _last_per_job(db, ids, Event.type != "step")
    last_plan = _last_per_job(db, ids, Event.type.in_(("plan", "resumed", "ranks_mapped")))
    items = []
    for job, tenant_name in rows:
        step, tps = latest.get(job.id, (None, None))
        ev = last_event.get(job.id)
        plan = last_plan.get(job.id)
        layout = None
        if plan is not None:
            layout = plan.payload.get("short") or job_story._short(plan.payload.get("layout"))
        items.append({
            "id": job.id, "name": job.name, "state": job.state, "reason": job.reason,
            "tenant": tenant_name if principal.is_admin else None,
            "step": job.final_step if job.final_step is not None else (step or 0),
            "steps": int(job.spec.get("steps") or 0),
            "gpus": job.gpus_allocated, "min_gpus": job.min_gpus, "max_gpus": job.max_gpus,
            "layout": layout,
            "tokens_per_s": tps if job.state in HOLDING else None,
            "last_event": None if ev is None else {"type": ev.type, "ts": ev.ts,
                                                   "reason": str(ev.payload.get("reason") or ev.payload.get("to")
                                                                 or "")[:200]},
            "updated_at": job.updated_at,
        })
    return {"items": items, "next_cursor": ids[-1] if len(ids) == limit else None}


@router.get("/jobs/{job_id}", operation_id="dashboard_job", summary="A job's page: timeline, ledger, grid",
            responses=responses(401, 404))
def dashboard_job(job_id: JobId, principal: AnyPrincipal, db: Db) -> dict[str, Any]:
    job = _job(db, principal, job_id)
    # the newest TIMELINE_LIMIT events that are not steps, oldest first
    newest = db.scalars(sa.select(Event).where(Event.job_id == job.id, Event.type != "step")
                        .order_by(Event.id.desc()).limit(TIMELINE_LIMIT)).all()
    events = [EventPublic.model_validate(e).model_dump(mode="json") for e in reversed(newest)]
    latest = db.execute(sa.select(Metric.step, Metric.tokens_per_s).where(Metric.job_id == job.id)
                        .order_by(Metric.step.desc(), Metric.epoch.desc()).limit(1)).one_or_none()
    return {
        "job": {**JobPublic.model_validate(job).model_dump(mode="json"), "recovery": repo.attempt_recovery(db, job.id)},
        "step": job.final_step if job.final_step is not None else (latest[0] if latest else 0),
        "tokens_per_s": latest[1] if latest else None,
        "events": events,
        "events_truncated": len(newest) == TIMELINE_LIMIT,
        "ledger": job_story.recovery_ledger(events),
        "grid": job_story.rank_grid(events),
        "markers": job_story.markers(events),
    }


def _buckets(db: Db, job_id: int, width: int) -> list[dict[str, Any]]:
    b = (Metric.step // width).label("b")
    q = (sa.select(Metric.epoch, sa.func.min(Metric.step), sa.func.avg(Metric.loss), sa.func.min(Metric.loss),
                   sa.func.max(Metric.loss), sa.func.avg(Metric.tokens_per_s))
         .where(Metric.job_id == job_id).group_by(Metric.epoch, b).order_by(sa.func.min(Metric.step), Metric.epoch))
    return [{"step": s, "epoch": e, "loss": lo, "loss_min": mn, "loss_max": mx, "tokens_per_s": t}
            for e, s, lo, mn, mx, t in db.execute(q)]


@router.get("/jobs/{job_id}/curve", operation_id="dashboard_curve",
            summary="Loss and throughput per step, downsampled", responses=responses(401, 404))
def dashboard_curve(
    job_id: JobId,
    principal: AnyPrincipal,
    db: Db,
    max_points: Annotated[int, Query(ge=10, le=10_000, description="most points returned")] = 1500,
) -> dict[str, Any]:
    """Every metric row when there are at most ``max_points``; otherwise buckets of ``width`` steps
    per epoch with the mean loss (and its min and max) and the mean tokens/s, at most ``max_points``;
    ``val_loss``: the steps that evaluated on held-out data, with their loss."""
    job = _job(db, principal, job_id)
    total = db.scalar(sa.select(sa.func.count()).select_from(Metric).where(Metric.job_id == job.id)) or 0
    if total <= max_points:
        rows = db.execute(sa.select(Metric.step, Metric.epoch, Metric.loss, Metric.tokens_per_s)
                          .where(Metric.job_id == job.id).order_by(Metric.step, Metric.epoch)).all()
        points = [{"step": s, "epoch": e, "loss": lo, "loss_min": lo, "loss_max": lo, "tokens_per_s": t}
                  for s, e, lo, t in rows]
        width = 1
    else:
        width = math.ceil(total / max_points)
        points = _buckets(db, job.id, width)
        while len(points) > max_points:  # bucket edges of several epochs: widen until it fits
            width *= 2
            points = _buckets(db, job.id, width)
    return {"total_points": total, "width": width, "points": points, "val_loss": _val_loss(db, job.id, max_points)}


def _val_loss(db: Db, job_id: int, max_points: int) -> list[dict[str, Any]] | None:
    """The job's evaluations (steps that measured ``val_loss``), at most ``max_points`` of them evenly
    spaced (the last one kept); ``None`` when the job never evaluated."""
    rows = db.execute(sa.select(Metric.step, Metric.epoch, Metric.val_loss)
                      .where(Metric.job_id == job_id, Metric.val_loss.is_not(None))
                      .order_by(Metric.step, Metric.epoch)).all()
    if not rows:
        return None
    kept = rows[::math.ceil(len(rows) / max_points)]
    if kept[-1] is not rows[-1]:
        kept = [*kept[: max_points - 1], rows[-1]]
    return [{"step": s, "epoch": e, "loss": v} for s, e, v in kept]


@router.get("/jobs/{job_id}/explain", operation_id="dashboard_explain",
            summary="The planner's explanation of the job's layout", responses=responses(401, 404, 429))
def dashboard_explain(request: Request, job_id: JobId, principal: AnyPrincipal, db: Db) -> dict[str, Any]:
    """The planner's ranked plans for the job's spec on the GPU count in force (the last ``plan`` or
    ``resumed`` event; ``max_gpus`` before the first), with their memory and step time by component.
    A tenant's explain counts toward its submission rate like a dry run (429 over it); answers are
    cached by the planner's input. The job is read in one short transaction, ended before planning."""
    job = _job(db, principal, job_id)
    last = db.scalars(sa.select(Event).where(Event.job_id == job.id, Event.type.in_(("plan", "resumed")))
                      .order_by(Event.id.desc()).limit(1)).one_or_none()
    gpus = None
    if last is not None:
        gpus = last.payload.get("num_gpus") or last.payload.get("world_size")
    in_force = last.payload.get("short") if last is not None else None
    spec, owner = dict(job.spec), job.tenant_id
    goodput, note = None, ""
    if spec.get("duration_days") is not None:  # the event store's failure rates and recovery phases
        from service.cluster_history import planner_inputs

        goodput, note = planner_inputs(db, spec.get("failure_rates") or "llama3",
                                       request.app.state.settings.gpus_per_node)
    db.rollback()  # no transaction (on SQLite: the write lock) stays open while the planner searches
    if principal.tenant is not None:
        charge_planning(request.app.state.sessions, request.app.state.attempts, principal.tenant)
    if isinstance(gpus, int) and gpus >= 1:
        spec["min_gpus"] = spec["max_gpus"] = gpus
    try:
        parsed = JobSpec.model_validate(spec)
        shape = None
        if isinstance(parsed.model, HFModel):  # the shape its config.json gives, read in the owner's area
            shape = model_shape(parsed.stored()["model"], data_area(request.app.state.settings, owner))
        out = dry_run(parsed, request.app.state.api, 4, model=shape, goodput=goodput, note=note)
    except (PlannerRefused, PlannerUnavailable, ValueError) as exc:
        return {"available": False, "reason": str(exc)[:300] or type(exc).__name__, "gpus": gpus}
    return {"available": True, "gpus": out.gpus, "plans": out.plans, "rejected": out.rejected[:10],
            "searched": out.searched, "search_time_s": out.search_time_s, "in_force": in_force,
            "goodput": out.goodput, "recovery": out.recovery}


@router.get("/tenants", operation_id="dashboard_tenants", summary="Tenants with quota, use and borrowed GPUs",
            responses=responses(401, 403))
def dashboard_tenants(_: Admin, db: Db) -> dict[str, Any]:
    """Every tenant (admin only): quota, fair-share weight, GPUs in use by its jobs, the GPUs it
    borrows over its quota, and its jobs per state."""
    used = dict(db.execute(sa.select(Job.tenant_id, sa.func.sum(Job.gpus_allocated))
                           .where(Job.state.in_(sorted(HOLDING))).group_by(Job.tenant_id)).all())
    per_state: dict[int, dict[str, int]] = {}
    for tid, st, n in db.execute(sa.select(Job.tenant_id, Job.state, sa.func.count()).group_by(Job.tenant_id, Job.state)):
        per_state.setdefault(tid, {})[st] = n
    items = []
    for t in db.scalars(sa.select(Tenant).order_by(Tenant.id).limit(1000)):
        u = int(used.get(t.id) or 0)
        items.append({"id": t.id, "name": t.name, "gpu_quota": t.gpu_quota, "weight": t.weight,
                      "gpus_used": u, "gpus_borrowed": max(0, u - t.gpu_quota), "max_jobs": t.max_jobs,
                      "jobs": per_state.get(t.id, {})})
    return {"items": items}


@router.get("/decisions", operation_id="dashboard_decisions", summary="The scheduler's recent decisions",
            responses=responses(401, 403))
def dashboard_decisions(
    _: Admin, db: Db, limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """The newest scheduler decisions (admin only), newest first, with their reasons."""
    q = (sa.select(Event, Job.name, Tenant.name).join(Job, Job.id == Event.job_id)
         .join(Tenant, Tenant.id == Job.tenant_id).where(Event.type == "decision")
         .order_by(Event.id.desc()).limit(limit))
    return {"items": [{"id": e.id, "ts": e.ts, "job_id": e.job_id, "job": jn, "tenant": tn,
                       "kind": e.payload.get("kind"), "gpus": e.payload.get("gpus"),
                       "outcome": e.payload.get("outcome"), "reason": e.payload.get("reason", "")}
                      for e, jn, tn in db.execute(q)]}
