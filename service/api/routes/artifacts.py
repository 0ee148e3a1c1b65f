"""``/v1/jobs/{id}/artifacts``: what a job wrote into its directory (``<storage>/jobs/<id>``):
checkpoints, the HF export (``export: {"format": "hf"}``) and the TensorBoard event files;
listed, and downloaded one file at a time.

A job of another tenant is a 404, as everywhere under ``/v1/jobs``. A download path is relative to
the job's directory, under one of the artifact folders (``workers.job_inputs``), with no ``..``, no
absolute path and no symlink out of the job's directory (the rule of ``workers.data_area``); any
other path is the same 404 as a missing file (no oracle). On ``s3://`` storage the job's directory is
a prefix: a download must be a key the listing gives, and it is streamed from the object store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from service.api import object_data, repo
from service.api.deps import CurrentTenant, Db
from service.api.errors import responses
from service.api.routes.jobs import JobId
from workers import object_store
from workers.data_area import DataArea, DataPathError, checkpoint_root, split_path
from workers.job_inputs import CHECKPOINT_DIR, EXPORT_DIR, TENSORBOARD_DIR

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
KINDS = {CHECKPOINT_DIR: "checkpoint", EXPORT_DIR: "export", TENSORBOARD_DIR: "tensorboard"}
LIST_MAX = 10_000
ArtifactPath = Annotated[str, PathParam(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9._/=+-]+$",
                                        description="path inside the job's artifacts, as the listing gives it")]


class ArtifactFile(BaseModel):
    path: str = Field(description="relative to the job's directory: checkpoints/..., export/..., tensorboard/...")
    kind: str = Field(description="checkpoint | export | tensorboard")
    bytes: int


class Artifacts(BaseModel):
    checkpoints: list[str] = Field(description="the job's checkpoint directories, oldest first")
    export: str | None = Field(default=None, description="the HF export directory, once written")
    tensorboard: str | None = Field(default=None, description="the TensorBoard log directory, once written")
    items: list[ArtifactFile]
    truncated: bool = False


def job_dir(request: Request, job_id: int) -> Path | str:
    return object_store.under(checkpoint_root(request.app.state.settings.storage_path), str(int(job_id)))


def _files(root: Path | str, folder: str) -> list[tuple[str, int]]:
    if isinstance(root, str):
        return sorted((f"{folder}/{k}", n) for k, n in object_store.find(object_store.join(root, folder)).items())
    base = root / folder
    out: list[tuple[str, int]] = []
    if not base.is_dir() or base.is_symlink():
        return out
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            out.append((p.relative_to(root).as_posix(), p.stat().st_size))
    return out


def _job_or_404(db: Any, tenant_id: int, job_id: int) -> None:
    found = repo.get_job(db, tenant_id, job_id) is not None
    db.rollback()  # end the read: no transaction stays open while the disk is walked or a file streams
    if not found:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "job not found")


@router.get("/{job_id}/artifacts", response_model=Artifacts, operation_id="job_artifacts",
            summary="A job's artifacts", responses=responses(401, 403, 404))
def list_artifacts(job_id: JobId, request: Request, tenant: CurrentTenant, db: Db) -> Artifacts:
    """Checkpoints, the HF export and TensorBoard files the job wrote (paths relative to the job)."""
    _job_or_404(db, tenant.id, job_id)
    root = job_dir(request, job_id)
    items: list[ArtifactFile] = []
    truncated = False
    for folder, kind in KINDS.items():
        for rel, size in _files(root, folder):
            if len(items) >= LIST_MAX:
                truncated = True
                break
            items.append(ArtifactFile(path=rel, kind=kind, bytes=size))
    if isinstance(root, str):
        checkpoints = sorted(f"{CHECKPOINT_DIR}/{name}" for name, is_dir in
                             object_store.listdir(object_store.join(root, CHECKPOINT_DIR)) if is_dir)
        export = EXPORT_DIR if any(i.path == f"{EXPORT_DIR}/config.json" for i in items) else None
        board = TENSORBOARD_DIR if any(i.kind == "tensorboard" for i in items) else None
        return Artifacts(checkpoints=checkpoints, export=export, tensorboard=board, items=items, truncated=truncated)
    ck = root / CHECKPOINT_DIR
    checkpoints = sorted(f"{CHECKPOINT_DIR}/{p.name}" for p in ck.iterdir()
                         if p.is_dir() and not p.is_symlink()) if ck.is_dir() else []
    export = EXPORT_DIR if (root / EXPORT_DIR / "config.json").is_file() else None
    board = TENSORBOARD_DIR if any(i.kind == "tensorboard" for i in items) else None
    return Artifacts(checkpoints=checkpoints, export=export, tensorboard=board, items=items, truncated=truncated)


@router.get("/{job_id}/artifacts/{path:path}", operation_id="download_artifact", summary="Download an artifact",
            response_class=FileResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                    **responses(401, 403, 404)})
def download_artifact(job_id: JobId, path: ArtifactPath, request: Request, tenant: CurrentTenant, db: Db) -> Any:
    """One file of the job's artifacts (a path from the listing)."""
    _job_or_404(db, tenant.id, job_id)
    root = job_dir(request, job_id)
    missing = HTTPException(status.HTTP_404_NOT_FOUND, "no such artifact (a path from the job's artifact listing)")
    try:
        if path.startswith("shared:"):
            raise missing
        _, rel = split_path(path, DataArea(root=root) if isinstance(root, Path) else None)
    except DataPathError:
        raise missing from None
    if rel.split("/")[0] not in KINDS:
        raise missing
    if isinstance(root, str):  # a key under the job's prefix (the rule above allows nothing else): streamed
        return object_data.send(object_store.join(root, rel), missing.detail)
    real_root = root.resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(real_root) or not target.is_file():
        raise missing
    return FileResponse(target, media_type="application/octet-stream", filename=target.name)
