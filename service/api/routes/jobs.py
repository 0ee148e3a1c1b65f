"""``/v1/jobs``: submit, list, get, cancel, events (JSON or server-sent events), metrics.

Everything is scoped to the caller's tenant in SQL; another tenant's job is a 404.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from planner.recovery_choice import ChoiceError, check_block
from service.api import repo
from service.api.deps import AnyPrincipal, CurrentTenant, Db
from service.api.errors import field_error, responses
from service.api.fit_check import PlannerRefused, PlannerUnavailable, check_fit, planner_unavailable
from service.api.schemas import (
    EventPublic,
    HFModel,
    JobList,
    JobPublic,
    JobSpec,
    JobStateName,
    MetricPublic,
    ModelShape,
)
from service.api.sse import SSE_EVENT_SCHEMA, open_stream, wants_stream
from service.db import transitions as tr
from service.db.models import Job
from service.settings import data_area
from workers.data_area import DataArea, DataPathError, split_path

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="job id")]
IdemKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$",
           description="a retry with the same key returns the same job instead of creating another"),
]

_JOB_LINKS = {
    "GetJob": {"operationId": "get_job", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "cancel_job", "parameters": {"job_id": "$response.body#/id"}},
    "JobEvents": {"operationId": "job_events", "parameters": {"job_id": "$response.body#/id"}},
    "JobMetrics": {"operationId": "job_metrics", "parameters": {"job_id": "$response.body#/id"}},
}


def validate_spec(spec: JobSpec) -> None:
    """Cross-field rules the schema cannot say; raises a 422 naming the field."""
    errors: list[tuple[list[str | int], str]] = []
    if spec.max_gpus < spec.min_gpus:
        errors.append((["max_gpus"], f"must be >= min_gpus ({spec.min_gpus})"))
    if isinstance(spec.model, ModelShape):
        m = spec.model
        if m.hidden % m.heads:
            errors.append((["model", "heads"], f"hidden {m.hidden} is not divisible by heads {m.heads}"))
        elif (m.hidden // m.heads) % 2:
            errors.append((["model", "hidden"], "hidden / heads (the head dim) must be even for rotary embeddings"))
        if m.kv_heads > m.heads or m.heads % m.kv_heads:
            errors.append((["model", "kv_heads"], f"heads {m.heads} is not a multiple of kv_heads {m.kv_heads}"))
    if spec.checkpoint is not None and spec.checkpoint.max_every_steps < spec.checkpoint.min_every_steps:
        errors.append((["checkpoint", "max_every_steps"], "must be >= min_every_steps"))
    if spec.failure_rates is not None and spec.duration_days is None:
        errors.append((["duration_days"], "is required with failure_rates (the job's expected days of training)"))
    if spec.lr is not None and spec.min_lr is not None and spec.min_lr > spec.lr:
        errors.append((["min_lr"], "must be <= lr"))
    if spec.data is not None:
        if spec.data.kind == "builtin" and spec.data.paths:
            errors.append((["data", "paths"], "must be empty for the builtin corpus"))
        if spec.data.kind != "builtin" and not spec.data.paths:
            errors.append((["data", "paths"], f"required for kind {spec.data.kind!r}"))
        for i, p in enumerate(spec.data.paths):  # the syntax; submit_job then resolves them in the area
            try:
                split_path(p, None, i)
            except DataPathError as exc:
                errors.append((["data", "paths", i], exc.msg))
    named: list[tuple[list[str | int], str]] = []
    if isinstance(spec.model, HFModel):
        named.append((["model", "hf"], spec.model.hf))
    if spec.tokenizer is not None:
        named.append((["tokenizer"], spec.tokenizer))
        if spec.data is None or spec.data.kind != "text":
            errors.append((["tokenizer"], "applies to data of kind 'text' (text, jsonl or parquet files)"))
    if spec.eval_data is not None:
        if spec.eval_data.kind == "builtin":
            errors.append((["eval_data", "kind"], "must be text or tokens (held-out files in your data area)"))
        elif not spec.eval_data.paths:
            errors.append((["eval_data", "paths"], f"required for kind {spec.eval_data.kind!r}"))
        named += [(["eval_data", "paths", i], p) for i, p in enumerate(spec.eval_data.paths)]
    if spec.eval_every is not None and spec.eval_data is None:
        errors.append((["eval_data"], "required with eval_every (the held-out data val_loss is measured on)"))
    if spec.eval_batches is not None and spec.eval_every is None:
        errors.append((["eval_batches"], "applies only with eval_every"))
    for loc, p in named:  # the syntax; submit_job then resolves them in the area
        try:
            split_path(p, None)
        except DataPathError as exc:
            errors.append((loc, exc.msg))
    hint = spec.layout_hint
    if hint is not None:
        used = (hint.tp or 1) * (hint.pp or 1) * (hint.cp or 1) * (hint.dp or 1)
        if used > spec.max_gpus:
            errors.append((["layout_hint"], f"tp*pp*cp*dp = {used} is more than max_gpus ({spec.max_gpus})"))
    if spec.recovery is not None:
        try:  # the one rule (planner.recovery_choice): groups only with replica_groups, restart without snapshots
            check_block(spec.recovery.model_dump(mode="json", exclude_none=True))
        except ChoiceError as exc:
            errors.append((exc.field.split("."), exc.msg))
    if errors:
        raise RequestValidationError(
            [{"loc": ("body", *loc), "msg": msg, "type": "value_error"} for loc, msg in errors]
        )


def check_inputs(spec: JobSpec, area: DataArea) -> dict[str, Any]:
    """422 naming the field unless the spec's data, HF model, tokenizer and eval data lie inside the
    tenant's area (or a shared root) and fit together (``workers.job_inputs``); returns the engine
    shape of the model, which the planner plans."""
    from workers.job_inputs import InputError
    from workers.job_inputs import check_inputs as check

    try:
        return check(spec.stored(), area)
    except InputError as exc:
        raise RequestValidationError([{"loc": ("body", *exc.loc), "msg": exc.msg, "type": "value_error"}]) from None


def _public(job: Job) -> JobPublic:
    return JobPublic.model_validate(job)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobPublic,
    operation_id="submit_job",
    summary="Submit a job",
    responses={
        200: {"model": JobPublic, "description": "a retry: the job created earlier with this Idempotency-Key"},
        201: {"description": "created", "links": _JOB_LINKS},
        **responses(400, 401, 403, 409, 413, 429, 503),
    },
)
def submit_job(spec: JobSpec, request: Request, response: Response, tenant: CurrentTenant, db: Db,
               idempotency_key: IdemKey = None) -> Any:
    """Queue a declarative job for the caller's tenant. 422 names the field of an invalid spec,
    including one the planner says fits on no GPU count in ``min_gpus..max_gpus``."""
    attempts = request.app.state.attempts
    try:
        validate_spec(spec)
        shape = check_inputs(spec, data_area(request.app.state.settings, tenant.id))
    except RequestValidationError:
        attempts.record(tenant.id)  # a refused submission counts toward the rate
        raise
    stored = spec.stored()
    digest = hashlib.sha256(json.dumps(stored, sort_keys=True).encode()).hexdigest()
    if idempotency_key is not None:
        existing = repo.job_by_key(db, tenant.id, idempotency_key)
        if existing is not None:
            return _replay(existing, digest, response)
    api = request.app.state.api
    if api.fit_check:
        db.rollback()  # no transaction stays open while the planner searches

        def over_limits() -> None:
            # a tenant over its limits is refused before any planning (create_job checks again, locked)
            try:
                repo.check_limits(db, tenant, lock=False, attempts=attempts.recent(tenant.id, tenant.submit_per_minute))
            finally:
                db.rollback()

        try:
            check_fit(spec, api, before_planning=over_limits, model=shape)
        except PlannerRefused as exc:
            attempts.record(tenant.id)
            raise field_error(["body", *exc.loc], exc.msg, "plan_infeasible") from None
        except PlannerUnavailable as exc:
            attempts.record(tenant.id)
            raise planner_unavailable(exc) from None
    try:
        job = repo.create_job(db, tenant, name=spec.name, spec=stored, min_gpus=spec.min_gpus,
                              max_gpus=spec.max_gpus, priority=spec.priority, key=idempotency_key,
                              request_hash=digest, attempts=attempts.recent(tenant.id, tenant.submit_per_minute))
        db.commit()
    except sa_exc.IntegrityError:
        db.rollback()
        existing = repo.job_by_key(db, tenant.id, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return _replay(existing, digest, response)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return _public(job)


def _replay(job: Job, digest: str, response: Response) -> JobPublic:
    if job.request_hash != digest:
        raise HTTPException(status.HTTP_409_CONFLICT, "Idempotency-Key was used for a different job spec")
    response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return _public(job)


@router.get("", response_model=JobList, operation_id="list_jobs", summary="List jobs",
            responses=responses(401, 403))
def list_jobs(
    tenant: CurrentTenant,
    db: Db,
    state: Annotated[JobStateName | None, Query(description="only jobs in this state")] = None,
    cursor: Annotated[int | None, Query(ge=1, le=2**31 - 1, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    """The tenant's jobs, newest first."""
    jobs = repo.list_jobs(db, tenant.id, state=state, cursor=cursor, limit=limit)
    nxt = jobs[-1].id if len(jobs) == limit else None
    return JobList(items=[_public(j) for j in jobs], next_cursor=nxt)


@router.get("/{job_id}", response_model=JobPublic, operation_id="get_job", summary="Get a job",
            responses=responses(401, 403, 404))
def get_job(job_id: JobId, tenant: CurrentTenant, db: Db) -> JobPublic:
    job = repo.get_job(db, tenant.id, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    return _public(job).model_copy(update={"recovery": repo.attempt_recovery(db, job.id)})


@router.post("/{job_id}/cancel", response_model=JobPublic, operation_id="cancel_job", summary="Cancel a job",
             responses=responses(400, 401, 403, 404, 409, 413))
def cancel_job(job_id: JobId, tenant: CurrentTenant, db: Db) -> JobPublic:
    """A queued or preempted job is cancelled at once; an admitted or running one is marked
    ``cancel_requested`` and the controller stops it. 409 when the job has already ended."""
    outcome = tr.request_cancel(db, job_id, tenant_id=tenant.id)
    if outcome is tr.CancelOutcome.MISSING:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    if outcome is tr.CancelOutcome.TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, "job has already ended")
    job = repo.get_job(db, tenant.id, job_id)
    if job is None:  # pragma: no cover - jobs are never deleted
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    return _public(job)


@router.get(
    "/{job_id}/events",
    response_model=list[EventPublic],
    operation_id="job_events",
    summary="A job's events",
    responses={
        200: {"content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
              "description": "JSON list, or a server-sent event stream (Accept: text/event-stream)"},
        **responses(401, 403, 404, 429),
    },
)
def job_events(
    request: Request,
    job_id: JobId,
    tenant: CurrentTenant,
    principal: AnyPrincipal,
    db: Db,
    since: Annotated[int, Query(ge=0, le=2**63 - 1, description="only events with a larger id")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    stream: Annotated[bool, Query(description="answer with a server-sent event stream "
                                              "(the same as Accept: text/event-stream)")] = False,
) -> Any:
    """Events oldest first (state changes with their reason, and the runtime's events). With
    ``Accept: text/event-stream`` (or ``?stream=true``) the answer is a server-sent event stream
    that follows the job and ends (``event: end``) once the job has ended."""
    job = repo.get_job(db, tenant.id, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    if stream or wants_stream(request):
        return open_stream(request.app, tenant.id, principal.token_id, job_id, since)
    rows = repo.list_events(db, job_id, since=since, limit=limit)
    return JSONResponse([EventPublic.model_validate(e).model_dump(mode="json") for e in rows])


@router.get("/{job_id}/metrics", response_model=list[MetricPublic], operation_id="job_metrics",
            summary="A job's training metrics", responses=responses(401, 403, 404))
def job_metrics(
    job_id: JobId,
    tenant: CurrentTenant,
    db: Db,
    since_step: Annotated[
        int, Query(ge=-1, le=2**31 - 1, description="only steps after this one (steps are numbered from 1; "
                                                      "0 or -1: from the first)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
) -> list[MetricPublic]:
    """Loss and throughput per step (per attempt: a step re-run after a recovery appears twice)."""
    job = repo.get_job(db, tenant.id, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")
    return [MetricPublic.model_validate(m) for m in repo.list_metrics(db, job_id, since_step=since_step, limit=limit)]

