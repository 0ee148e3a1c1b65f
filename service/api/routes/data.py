"""``/v1/data``: the caller's data area (``workers.data_area``): upload, list, download, delete.

``PUT /v1/data/{path}`` streams the request body to a temporary file inside the area and renames
it into place (atomic: a reader sees the old file or the whole new one), refusing bodies over
``ORTHOPLEX_UPLOAD_MAX_BYTES`` (413) and uploads that would take the area over
``ORTHOPLEX_TENANT_QUOTA_BYTES`` (413). Paths follow the job-spec rule (relative, no ``..``, no
symlink out of the area); no database transaction is open while a body streams. On ``s3://``
storage the area is an object-store prefix (``service.api.object_data``: streamed both ways).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from service.api import object_data
from service.api.deps import CurrentTenant
from service.api.errors import responses
from service.settings import data_area
from workers import object_store
from workers.data_area import DataArea, DataPathError, split_path

router = APIRouter(prefix="/v1/data", tags=["data"])
UPLOADS = ".uploads"  # temporary files, inside the area (same file system: rename is atomic)
LIST_MAX = 10_000
DataPath = Annotated[str, PathParam(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9._/-]+$",
                                    description="path inside your data area (names of letters, digits, . _ -)")]


class DataFile(BaseModel):
    path: str = Field(description="relative to your data area")
    bytes: int


class DataList(BaseModel):
    items: list[DataFile]
    used_bytes: int
    quota_bytes: int
    truncated: bool = False


def _target(area: DataArea, raw: str) -> Path | str:
    """The file ``raw`` names inside the area (422 naming ``path`` otherwise; never a glob)."""
    try:
        if raw.startswith("shared:"):
            raise DataPathError(None, "shared roots are read-only")
        if any(c in raw for c in "*?["):
            raise DataPathError(None, "must name one file (no glob characters)")
        root, rel = split_path(raw, area)
        if rel == "." or rel.split("/")[0] == UPLOADS:
            raise DataPathError(None, "must name a file inside your data area")
    except DataPathError as exc:
        raise RequestValidationError([{"loc": ("path", "path"), "msg": exc.msg, "type": "value_error"}]) from None
    if isinstance(root, str):  # a key under the tenant's prefix (the rule above allows nothing else)
        return object_store.join(root, rel)
    root = root.resolve()
    target = root / rel
    parent = target.parent.resolve()
    if not (parent == root or parent.is_relative_to(root)) or (target.is_symlink() and
                                                                 not target.resolve().is_relative_to(root)):
        raise RequestValidationError([{"loc": ("path", "path"), "msg": "resolves outside your data area",
                                       "type": "value_error"}])
    return target


def _usage(root: Path) -> tuple[list[DataFile], int, bool]:
    files: list[DataFile] = []
    used = 0
    truncated = False
    if not root.is_dir():
        return files, used, truncated
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != UPLOADS or Path(dirpath) != root)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            used += st.st_size
            if len(files) < LIST_MAX:
                files.append(DataFile(path=p.relative_to(root).as_posix(), bytes=st.st_size))
            else:
                truncated = True
    return files, used, truncated


@router.get("", response_model=DataList, operation_id="list_data", summary="List your data area",
            responses=responses(401, 403))
def list_data(request: Request, tenant: CurrentTenant) -> DataList:
    settings = request.app.state.settings
    root = data_area(settings, tenant.id).root
    if isinstance(root, str):
        found = list(object_data.iter_files(root))
        files = [DataFile(path=rel, bytes=n) for rel, n in found[:LIST_MAX]]
        used, truncated = sum(n for _, n in found), len(found) > LIST_MAX
    else:
        files, used, truncated = _usage(root)
    return DataList(items=files, used_bytes=used, quota_bytes=settings.tenant_quota_bytes, truncated=truncated)


@router.put("/{path:path}", response_model=DataFile, status_code=201, operation_id="upload_data",
            summary="Upload a file into your data area", responses=responses(400, 401, 403, 409, 413))
async def upload_data(path: DataPath, request: Request, tenant: CurrentTenant) -> DataFile:
    """The request body (any bytes) becomes the file; an existing file is replaced atomically."""
    settings = request.app.state.settings
    area = data_area(settings, tenant.id)
    target = _target(area, path)
    limit = settings.upload_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"upload over {limit} bytes")
    if isinstance(target, str):
        return await _upload_object(str(area.root), target, request, limit, settings.tenant_quota_bytes)
    assert isinstance(area.root, Path)
    _, used, _ = await anyio.to_thread.run_sync(_usage, area.root)
    room = settings.tenant_quota_bytes - used + (target.stat().st_size if target.is_file() else 0)
    tmp_dir = area.root / UPLOADS
    await anyio.to_thread.run_sync(lambda: tmp_dir.mkdir(parents=True, exist_ok=True))
    tmp = tmp_dir / uuid.uuid4().hex
    size = 0
    try:
        with open(tmp, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"upload over {limit} bytes")
                if size > room:
                    raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                        f"the data area quota ({settings.tenant_quota_bytes} bytes) would be exceeded")
                await anyio.to_thread.run_sync(f.write, chunk)
            await anyio.to_thread.run_sync(os.fsync, f.fileno())

        def place() -> None:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError:  # a component of the path is a file
                raise HTTPException(status.HTTP_409_CONFLICT, "a parent of path is a file, not a folder") from None
            if target.is_dir():
                raise HTTPException(status.HTTP_409_CONFLICT, "path is a folder")
            if not target.parent.resolve().is_relative_to(area.root.resolve()):
                raise RequestValidationError([{"loc": ("path", "path"), "msg": "resolves outside your data area",
                                               "type": "value_error"}])
            os.replace(tmp, target)

        await anyio.to_thread.run_sync(place)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return DataFile(path=target.relative_to(area.root.resolve()).as_posix(), bytes=size)


async def _upload_object(root: str, url: str, request: Request, limit: int, quota: int) -> DataFile:
    """``upload_data`` on an object store: the same limits, the body streamed into the object."""
    if await anyio.to_thread.run_sync(object_data.is_folder, url):
        raise HTTPException(status.HTTP_409_CONFLICT, "path is a folder")
    used, _ = await anyio.to_thread.run_sync(object_data.usage, root)
    room = quota - used + (await anyio.to_thread.run_sync(object_data.file_size, url) or 0)

    def check(size: int) -> None:
        if size > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"upload over {limit} bytes")
        if size > room:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                f"the data area quota ({quota} bytes) would be exceeded")

    size = await object_data.receive(url, request.stream(), check)
    return DataFile(path=url[len(root) + 1:], bytes=size)


@router.get("/{path:path}", operation_id="download_data", summary="Download a file of your data area",
            response_class=FileResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                    **responses(401, 403, 404)})
def download_data(path: DataPath, request: Request, tenant: CurrentTenant) -> Any:
    area = data_area(request.app.state.settings, tenant.id)
    target = _target(area, path)
    if isinstance(target, str):
        return object_data.send(target, "no such file in your data area")
    if not target.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file in your data area")
    return FileResponse(target.resolve(), media_type="application/octet-stream", filename=target.name)


@router.delete("/{path:path}", status_code=204, operation_id="delete_data", summary="Delete a file of your data area",
               responses=responses(401, 403, 404))
def delete_data(path: DataPath, request: Request, tenant: CurrentTenant) -> Response:
    area = data_area(request.app.state.settings, tenant.id)
    target = _target(area, path)
    if isinstance(target, str):
        object_data.delete(target, "no such file in your data area")
        return Response(status_code=204)
    if not (target.is_file() or target.is_symlink()):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file in your data area")
    target.unlink()
    return Response(status_code=204)
