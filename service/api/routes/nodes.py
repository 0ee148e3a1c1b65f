"""Drain a node, and undrain it (the admin token only): ``POST /v1/cluster/nodes/{node}/drain`` and
``.../undrain``.

A drained node takes no new work, and every job on it moves off before the deadline with no step
redone (``service.controller.drains`` tells the jobs' supervisors; the runtime moves at a step
boundary). The drain is a row of ``node_drains``, so it survives a restart of the service; its state
(``draining`` while jobs still hold GPUs there, then ``drained``) is read from the cluster view.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool

from service.api.deps import Admin
from service.api.errors import responses
from service.api.routes.system import cluster_dict, drain_out
from service.api.schemas import NodeDrainIn, NodeDrainOut
from service.db.models import NodeDrain, utcnow

router = APIRouter(tags=["admin"])

NodeId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                             description="the Ray node id (GET /v1/cluster lists them)")]


def _known(view: dict[str, Any], node_id: str) -> bool:
    """Whether the cluster knows ``node_id`` (503 when it could not be asked)."""
    if not view.get("available"):
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the cluster could not be asked: cannot check the "
                            "node; retry shortly", headers={"Retry-After": "2"})
    return any(n.get("node_id") == node_id for n in view.get("nodes") or [])


@router.post("/v1/cluster/nodes/{node_id}/drain", response_model=NodeDrainOut, operation_id="drain_node",
             summary="Drain a node: no new work, every job moves off before the deadline",
             responses=responses(401, 403, 404, 413, 503))
async def drain_node(node_id: NodeId, body: NodeDrainIn, request: Request, _: Admin) -> NodeDrainOut:
    """Drain ``node_id`` with ``deadline_s`` to move off; again on a drained node: a new deadline.
    404 when the cluster does not know the node; 422 names a bad ``deadline_s``."""
    view = await cluster_dict(request)
    if not _known(view, node_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"node {node_id} not found in the cluster")

    def write() -> NodeDrainOut:
        now = utcnow()
        with request.app.state.sessions() as db:
            row = db.get(NodeDrain, node_id) or NodeDrain(node_id=node_id)
            row.deadline_s, row.requested_at = float(body.deadline_s), now
            row.deadline_at = now + dt.timedelta(seconds=float(body.deadline_s))
            db.add(row)
            db.commit()
            return drain_out(row, node_id, view)

    return await run_in_threadpool(write)


@router.post("/v1/cluster/nodes/{node_id}/undrain", response_model=NodeDrainOut, operation_id="undrain_node",
             summary="Undrain a node: it takes new work again", responses=responses(401, 403, 404, 503))
async def undrain_node(node_id: NodeId, request: Request, _: Admin) -> NodeDrainOut:
    """Idempotent: a node that is not drained answers ``active`` too; 404 when it is neither drained
    nor known to the cluster."""

    def delete() -> bool:
        with request.app.state.sessions() as db:
            row = db.get(NodeDrain, node_id)
            if row is None:
                return False
            db.delete(row)
            db.commit()
            return True

    deleted = await run_in_threadpool(delete)
    view = await cluster_dict(request)
    if not deleted and not _known(view, node_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"node {node_id} not found in the cluster")
    return drain_out(None, node_id, view)
