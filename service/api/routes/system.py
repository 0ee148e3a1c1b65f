"""Health, readiness, Prometheus metrics, the planner's dry run, and the cluster view."""

from __future__ import annotations

import concurrent.futures
import socket
from typing import Annotated, Any, Protocol

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api.attempts import charge_planning
from service.api.deps import AnyPrincipal
from service.api.errors import field_error, responses
from service.api.fit_check import PlannerRefused, PlannerUnavailable, dry_run
from service.api.routes.jobs import check_inputs, validate_spec
from service.api.schemas import ClusterJob, ClusterOut, Health, HFModel, JobSpec, NodeDrainOut, PlanOut, Ready
from service.api.security import is_admin_token
from service.controller.cluster import drain_state, gpus_held
from service.controller.ray_access import INSECURE_WARNING
from service.db.models import Attempt, Job, NodeDrain
from service.settings import data_area
from workers.states import HOLDING

router = APIRouter(tags=["system"])
_RAY_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster-view")


class ClusterViewLike(Protocol):
    """What ``service.controller.cluster.cluster_view()`` returns (the parts the API uses)."""

    available: bool

    def to_dict(self) -> dict[str, Any]: ...


@router.get("/healthz", response_model=Health, operation_id="healthz", summary="Liveness (no dependencies)")
def healthz() -> Health:
    return Health(status="ok")


def _ray_reachable(address: str, timeout: float = 1.0) -> str:
    """TCP reachability of the configured Ray address (``auto``: trust the local cluster)."""
    if address in ("auto", "local"):
        return "ok"
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host:
        host, port = hostport, "6379"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return "ok"
    except (OSError, ValueError) as exc:
        return f"unreachable: {exc}"


@router.get("/readyz", response_model=Ready, operation_id="readyz", summary="Readiness (database, Ray)",
            responses={503: {"model": Ready, "description": "a dependency is not reachable"}})
def readyz(request: Request) -> Any:
    checks: dict[str, str] = {}
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    address = request.app.state.settings.ray_address
    if address:
        checks["ray"] = _ray_reachable(address)
    ok = all(v == "ok" for v in checks.values())
    warnings = [INSECURE_WARNING] if request.app.state.settings.allow_insecure_ray else []
    body = Ready(status="ready" if ok else "not ready", checks=checks, warnings=warnings)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Aggregate series for anyone; per-tenant series (tenant names) only with the admin token or
    ``ORTHOPLEX_METRICS_TOKEN`` (any other caller gets the aggregate series only)."""
    body = generate_latest(request.app.state.registry)
    settings = request.app.state.settings
    # read by hand, not as a security dependency: the endpoint is public, a token only adds series
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and presented and (is_admin_token(presented, settings.admin_token)
                                                     or is_admin_token(presented, settings.metrics_token)):
        body += generate_latest(request.app.state.tenant_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/plans", response_model=PlanOut, operation_id="plan_job", summary="Plan a job (dry run)",
             responses=responses(400, 401, 413, 429))
def plan_job(
    spec: JobSpec,
    request: Request,
    principal: AnyPrincipal,
    top_k: Annotated[int, Query(ge=1, le=20, description="how many plans")] = 3,
) -> PlanOut:
    """The planner's ranked layouts for this spec on the cluster profile, for some GPU count in
    ``min_gpus..max_gpus``; 422 names the field when nothing fits. A tenant's dry runs count toward
    its submission rate (429 over it); 429 with ``Retry-After`` when every planner slot is busy."""
    tenant = principal.tenant
    if tenant is not None:
        charge_planning(request.app.state.sessions, request.app.state.attempts, tenant)
    validate_spec(spec)
    shape = None
    if isinstance(spec.model, HFModel):
        if tenant is None:
            raise field_error(["body", "model", "hf"], "an HF model lies in a tenant's data area: plan it with "
                                                       "a tenant's token", "value_error")
        shape = check_inputs(spec, data_area(request.app.state.settings, tenant.id))
    goodput, note = None, ""
    if spec.duration_days is not None:  # the event store's failure rates and recovery phases, read before planning
        from service.cluster_history import planner_inputs

        with request.app.state.sessions() as db:
            goodput, note = planner_inputs(db, spec.failure_rates or "llama3", request.app.state.settings.gpus_per_node)
    try:
        return dry_run(spec, request.app.state.api, top_k, model=shape, goodput=goodput, note=note)
    except PlannerRefused as exc:
        raise field_error(["body", *exc.loc], exc.msg, "plan_infeasible") from None
    except PlannerUnavailable as exc:
        # a dry run finding the planner busy is load shedding (429); a submission's is 503
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, f"{exc}; retry shortly",
                            headers={"Retry-After": str(exc.retry_after)}) from None


def _view() -> ClusterViewLike:
    from service.controller.cluster import cluster_view

    return cluster_view()


@router.get("/v1/cluster", response_model=ClusterOut, operation_id="cluster", summary="Nodes, GPUs, jobs",
            responses=responses(401))
async def cluster(request: Request, principal: AnyPrincipal) -> ClusterOut:
    """The admin sees every node, allocation and job holding GPUs; a tenant sees the totals and
    its own jobs only."""
    d = await cluster_dict(request)
    if not principal.is_admin and d.get("reason"):
        d["reason"] = "the cluster could not be asked"  # Ray's errors name its addresses: admin only
    jobs = await run_in_threadpool(_jobs, request, principal.tenant.id if principal.tenant else None)
    if principal.is_admin and d.get("nodes"):
        await run_in_threadpool(_label_allocations, request, d["nodes"])
    drains = await run_in_threadpool(node_drains, request, d)
    return ClusterOut(
        available=bool(d.get("available")), reason=d.get("reason"), total_gpus=int(d.get("total_gpus", 0)),
        used_gpus=int(d.get("used_gpus", 0)), free_gpus=int(d.get("free_gpus", 0)),
        alive_nodes=int(d.get("alive_nodes", 0)), nodes=list(d.get("nodes", [])) if principal.is_admin else [],
        jobs=jobs, draining_nodes=len(drains), drains=drains if principal.is_admin else [],
        ray_address=(request.app.state.settings.ray_address or "local") if principal.is_admin else None,
        ray_insecure=request.app.state.settings.allow_insecure_ray if principal.is_admin else None,
    )


async def cluster_dict(request: Request) -> dict[str, Any]:
    """The cluster view's ``to_dict()``, asked within ``cluster_timeout_s`` (an unavailable view when
    Ray is slow or broken: the API still answers)."""
    timeout = request.app.state.api.cluster_timeout_s
    try:
        view = await run_in_threadpool(lambda: _RAY_POOL.submit(_view).result(timeout=timeout))
        return view.to_dict()
    except Exception as exc:
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}


def drain_out(row: NodeDrain | None, node_id: str, view: dict[str, Any]) -> NodeDrainOut:
    """A node's drain state (``drains.drain_state``) from its row (``None``: not drained) and the view."""
    node = next((n for n in view.get("nodes") or [] if n.get("node_id") == node_id), None)
    held = gpus_held(node) if view.get("available") else 0
    state = drain_state(row is not None, held if view.get("available") else 1)  # unknown: still draining
    if row is None:
        return NodeDrainOut(node_id=node_id, state=state, gpus_held=held)  # type: ignore[arg-type]
    return NodeDrainOut(node_id=node_id, state=state, gpus_held=held, deadline_s=row.deadline_s,  # type: ignore[arg-type]
                        requested_at=row.requested_at, deadline_at=row.deadline_at)


def node_drains(request: Request, view: dict[str, Any]) -> list[NodeDrainOut]:
    """Every drained node's state; the view's nodes get theirs as ``drain`` (``None``: not drained)."""
    with request.app.state.sessions() as db:
        rows = list(db.scalars(sa.select(NodeDrain).order_by(NodeDrain.node_id)))
    out = [drain_out(r, r.node_id, view) for r in rows]
    states = {o.node_id: o.state for o in out}
    for n in view.get("nodes") or []:
        n["drain"] = states.get(n.get("node_id"))
    return out


def _label_allocations(request: Request, nodes: list[dict[str, Any]]) -> None:
    """Name the job and attempt behind each placement group, from the attempt rows the controller
    stores (``attempts.placement_group``, reported by the ``placed`` event): the admin's view."""
    names = {a.get("name") for n in nodes for a in n.get("allocations") or [] if a.get("name")}
    if not names:
        return
    with request.app.state.sessions() as db:
        rows = db.execute(sa.select(Attempt.placement_group, Attempt.job_id, Attempt.number)
                          .where(Attempt.placement_group.in_(sorted(names)))).all()
    owner = {pg: (job_id, number) for pg, job_id, number in rows}
    for n in nodes:
        for a in n.get("allocations") or []:
            if a.get("name") in owner:
                a["job_id"], a["attempt"] = owner[a["name"]]


def _jobs(request: Request, tenant_id: int | None) -> list[ClusterJob]:
    with request.app.state.sessions() as db:
        q = sa.select(Job).where(Job.state.in_(sorted(HOLDING))).order_by(Job.id).limit(10_000)
        if tenant_id is not None:
            q = q.where(Job.tenant_id == tenant_id)
        return [
            ClusterJob(id=j.id, name=j.name, state=j.state, gpus_allocated=j.gpus_allocated,  # type: ignore[arg-type]
                       tenant_id=j.tenant_id if tenant_id is None else None)
            for j in db.scalars(q)
        ]

