"""``/v1/data``: the caller's data area (``workers.data_area``): upload, list, download, delete.

``PUT /v1/data/{path}`` streams the request body to a temporary file inside the area and renames
it into place (atomic: a reader sees the old file or the whole new one), refusing bodies over
``ORTHOPLEX_UPLOAD_MAX_BYTES`` (413), uploads that would take the area over
``ORTHOPLEX_TENANT_QUOTA_BYTES`` or ``ORTHOPLEX_TENANT_QUOTA_ENTRIES`` (files plus directories, 413),
paths nested deeper than ``ORTHOPLEX_DATA_MAX_DEPTH`` directories (422) and more than
``ORTHOPLEX_UPLOAD_MAX_CONCURRENT`` uploads of one tenant at once (429). Each chunk's bytes are
reserved before they are written (``service.api.data_ledger``), so concurrent uploads cannot pass
the quota together. ``GET /v1/data`` lists one page (``limit``, ``cursor``: paths in byte order).
``DELETE`` removes a file or an empty directory, and the directories it leaves empty. Paths follow
the job-spec rule (relative, no ``..``, no symlink out of the area); no database transaction is
open while a body streams. On ``s3://`` storage the area is an object-store prefix
(``service.api.object_data``: the body streamed into a multipart upload, downloads by ranged GETs).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from service.api import object_data
from service.api.data_ledger import UPLOADS, Ledger, QuotaExceeded, TooManyUploads, WalkBudget, iter_files
from service.api.deps import CurrentTenant
from service.api.errors import responses
from service.settings import data_area
from workers import object_store
from workers.data_area import DataArea, DataPathError, split_path

router = APIRouter(prefix="/v1/data", tags=["data"])
LIST_MAX = 1000
DataPath = Annotated[str, PathParam(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9._/-]+$",
                                    description="path inside your data area (names of letters, digits, . _ -)")]


class DataFile(BaseModel):
    path: str = Field(description="relative to your data area")
    bytes: int


class DataList(BaseModel):
    items: list[DataFile] = Field(description="one page of files, in the byte order of their paths")
    used_bytes: int
    quota_bytes: int
    used_entries: int = Field(description="files and directories in the area")
    quota_entries: int
    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; null on the last")
    truncated: bool = Field(default=False, description="true when there are more pages (next_cursor is set)")


def ledger(request: Request) -> Ledger:
    """The process's data ledger (``app.state.data_ledger``, made by ``create_app``)."""
    return request.app.state.data_ledger


def _bad_path(msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("path", "path"), "msg": msg, "type": "value_error"}])


def _target(area: DataArea, raw: str, max_depth: int | None = None) -> Path | str:
    """The file ``raw`` names inside the area (422 naming ``path`` otherwise; never a glob)."""
    try:
        if raw.startswith("shared:"):
            raise DataPathError(None, "shared roots are read-only")
        if any(c in raw for c in "*?["):
            raise DataPathError(None, "must name one file (no glob characters)")
        root, rel = split_path(raw, area)
        if rel == "." or rel.split("/")[0] == UPLOADS:
            raise DataPathError(None, "must name a file inside your data area")
        if max_depth is not None and rel.count("/") > max_depth:
            raise DataPathError(None, f"nests {rel.count('/')} directories deep (at most {max_depth})")
    except DataPathError as exc:
        raise _bad_path(exc.msg) from None
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


@router.get("", response_model=DataList, operation_id="list_data", summary="List your data area",
            responses=responses(401, 403))
def list_data(
    request: Request,
    tenant: CurrentTenant,
    cursor: Annotated[str | None, Query(max_length=1024, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_MAX, description="files per page")] = LIST_MAX,
) -> DataList:
    """One page of the files in your data area, with what the area holds against its quotas."""
    settings = request.app.state.settings
    root = data_area(settings, tenant.id).root
    used, entries = ledger(request).usage(tenant.id, root)
    items: list[DataFile] = []
    more = False
    budget = WalkBudget(max(limit, settings.tenant_quota_entries) * 2)  # an area over its entry quota
    for rel, size in iter_files(root, cursor, budget):
        if len(items) == limit:
            more = True
            break
        items.append(DataFile(path=rel, bytes=size))
    more = more or (budget.spent and bool(items))  # stopped early: the next page goes on from here
    return DataList(items=items, used_bytes=used, quota_bytes=settings.tenant_quota_bytes, used_entries=entries,
                    quota_entries=settings.tenant_quota_entries, next_cursor=items[-1].path if more else None,
                    truncated=more)


def _missing_entries(root: Path | str, target: Path | str) -> int:
    """Entries an upload to ``target`` creates: its missing directories, and the file if new."""
    if isinstance(root, str) or isinstance(target, str):
        return object_data.missing_entries(str(root), str(target))
    root = root.resolve()
    n = 0 if target.exists() else 1
    parent = target.parent
    while parent != root and not parent.exists():
        n += 1
        parent = parent.parent
    return n


@router.put("/{path:path}", response_model=DataFile, status_code=201, operation_id="upload_data",
            summary="Upload a file into your data area", responses=responses(400, 401, 403, 409, 413, 429))
async def upload_data(path: DataPath, request: Request, tenant: CurrentTenant) -> DataFile:
    """The request body (any bytes) becomes the file; an existing file is replaced atomically."""
    settings = request.app.state.settings
    area = data_area(settings, tenant.id)
    target = _target(area, path, settings.data_max_depth)
    limit = settings.upload_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"upload over {limit} bytes")
    book = ledger(request)

    def begin() -> Any:
        if isinstance(target, str):
            if object_data.is_folder(target):
                raise HTTPException(status.HTTP_409_CONFLICT, "path is a folder")
            replaces = object_data.file_size(target) or 0
        else:
            replaces = target.stat().st_size if target.is_file() else 0
        ticket = book.begin(tenant.id, area.root, _missing_entries(area.root, target), replaces)
        if declared is not None and declared.isdigit():
            try:  # the announced size is reserved before any byte streams
                book.reserve(ticket, int(declared))
            except QuotaExceeded:
                book.finish(ticket, placed=False)
                raise
        return ticket

    try:
        ticket = await anyio.to_thread.run_sync(begin)
    except TooManyUploads as exc:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(exc), headers={"Retry-After": "1"}) from None
    except QuotaExceeded as exc:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, str(exc)) from None

    def check(size: int) -> None:
        if size > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"upload over {limit} bytes")
        try:
            if size > ticket.reserved:  # beyond what was announced: reserved before it is written
                book.reserve(ticket, size - ticket.reserved)
        except QuotaExceeded as exc:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, str(exc)) from None

    if isinstance(target, str):
        return await _upload_object(str(area.root), target, request, book, ticket, check)
    assert isinstance(area.root, Path)
    tmp_dir = area.root / UPLOADS
    tmp = tmp_dir / uuid.uuid4().hex
    size = 0
    placed, created = False, 0
    try:
        await anyio.to_thread.run_sync(lambda: tmp_dir.mkdir(parents=True, exist_ok=True))
        with open(tmp, "wb") as f:
            async for chunk in request.stream():
                size += len(chunk)
                check(size)
                await anyio.to_thread.run_sync(f.write, chunk)
            await anyio.to_thread.run_sync(os.fsync, f.fileno())

        def place() -> int:
            new = _missing_entries(area.root.resolve(), target)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
            except OSError:  # a component of the path is a file
                raise HTTPException(status.HTTP_409_CONFLICT, "a parent of path is a file, not a folder") from None
            if target.is_dir():
                raise HTTPException(status.HTTP_409_CONFLICT, "path is a folder")
            if not target.parent.resolve().is_relative_to(area.root.resolve()):
                raise _bad_path("resolves outside your data area")
            os.replace(tmp, target)
            return new

        created = await anyio.to_thread.run_sync(place)
        placed = True
    finally:
        book.finish(ticket, placed, created, size)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return DataFile(path=target.relative_to(area.root.resolve()).as_posix(), bytes=size)


async def _upload_object(root: str, url: str, request: Request, book: Ledger, ticket: Any,
                         check: Any) -> DataFile:
    """``upload_data`` on an object store: the body streamed into the object under the same checks."""
    size, placed, created = 0, False, 0
    try:
        created = await anyio.to_thread.run_sync(object_data.missing_entries, root, url)
        size = await object_data.receive(url, request.stream(), check)
        placed = True
    finally:
        book.finish(ticket, placed, created, size)
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


@router.delete("/{path:path}", status_code=204, operation_id="delete_data",
               summary="Delete a file or an empty directory of your data area", responses=responses(401, 403, 404, 409))
def delete_data(path: DataPath, request: Request, tenant: CurrentTenant) -> Response:
    """Removes the file (or the empty directory) and then every directory above it that it left
    empty; 409 for a directory that still holds something."""
    area = data_area(request.app.state.settings, tenant.id)
    target = _target(area, path)
    if isinstance(target, str):
        nbytes = object_data.delete(target, "no such file in your data area")
        ledger(request).removed(tenant.id, nbytes, 1 + object_data.empty_folders(str(area.root), target))
        return Response(status_code=204)
    assert isinstance(area.root, Path)
    root = area.root.resolve()
    nbytes, entries = 0, 0
    if target.is_symlink() or target.is_file():
        nbytes = target.lstat().st_size
        target.unlink()
    elif target.is_dir():
        try:
            target.rmdir()
        except OSError:
            raise HTTPException(status.HTTP_409_CONFLICT, "the directory is not empty") from None
    else:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file in your data area")
    entries = 1
    parent = target.parent
    while parent != root and parent.is_relative_to(root):
        try:
            parent.rmdir()  # only an empty directory goes
        except OSError:
            break
        entries += 1
        parent = parent.parent
    ledger(request).removed(tenant.id, nbytes, entries)
    return Response(status_code=204)
