"""The object-store half of ``/v1/data``: a tenant's area is the prefix ``<storage>/tenants/<id>/data``
when ``ORTHOPLEX_STORAGE_PATH`` is ``s3://...`` (``service.api.routes.data`` calls these for a
string root; the path rules, the 4xx answers and the quotas stay there).

An upload streams the request body into a multipart upload of the target key, one part (8 MiB) in
memory at a time; the object appears whole when the last part is in, and an upload cut short (over
its size or quota, a dropped connection) is aborted, leaving the previous object as it was. A
download streams the object in 1 MiB chunks. Every key is built from the tenant's own prefix and
a path the data-area rule accepted (relative, no ``..``), so no request reaches another prefix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import anyio
from fastapi import HTTPException, status
from fastapi.responses import StreamingResponse

from workers import object_store

#: temporary names inside an area: never listed, never counted (the filesystem's upload folder)
HIDDEN = ".uploads"


def iter_files(root: str, after: str | None = None) -> Iterator[tuple[str, int]]:
    """``(relative key, bytes)`` under ``root`` in byte order, after the key ``after``."""
    for rel, size in sorted(object_store.find(root).items()):
        if rel.split("/", 1)[0] == HIDDEN or (after is not None and rel <= after):
            continue
        yield rel, size


def usage(root: str) -> tuple[int, int]:
    """``(bytes, entries)``: the objects and the folders their keys imply."""
    used, folders, files = 0, set(), 0
    for rel, size in iter_files(root):
        used += size
        files += 1
        parts = rel.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return used, files + len(folders)


def _folders(root: str, url: str) -> list[str]:
    """The folders between ``root`` and the key ``url`` (nearest first)."""
    rel = url[len(root.rstrip("/")) + 1:].split("/")[:-1]
    return [object_store.join(root, *rel[:i]) for i in range(len(rel), 0, -1)]


def missing_entries(root: str, url: str) -> int:
    """Entries an upload to ``url`` creates: the file if new, and the folders no key implies yet."""
    n = 0 if object_store.file_size(url) is not None else 1
    for folder in _folders(root, url):
        if is_folder(folder):
            break
        n += 1
    return n


def empty_folders(root: str, url: str) -> int:
    """Folders above ``url`` that no key implies any more (after a delete)."""
    n = 0
    for folder in _folders(root, url):
        if is_folder(folder):
            break
        n += 1
    return n


def file_size(url: str) -> int | None:
    return object_store.file_size(url)


def is_folder(url: str) -> bool:
    return bool(object_store.find(url))


async def receive(url: str, body: AsyncIterator[bytes], check: Callable[[int], None]) -> int:
    """Stream ``body`` into the object ``url``; ``check(size so far)`` runs before each chunk is
    written and raises to refuse it (the upload is then aborted). Returns the bytes written."""
    size = 0
    writer = object_store.writing(url)
    f = await anyio.to_thread.run_sync(writer.__enter__)
    try:
        async for chunk in body:
            size += len(chunk)
            check(size)
            await anyio.to_thread.run_sync(f.write, chunk)
    except BaseException as exc:
        await anyio.to_thread.run_sync(writer.__exit__, type(exc), exc, exc.__traceback__)
        raise
    await anyio.to_thread.run_sync(writer.__exit__, None, None, None)
    return size


def send(url: str, missing: str) -> StreamingResponse:
    """The object streamed; 404 with ``missing`` when there is none."""
    size = object_store.file_size(url)
    if size is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, missing)
    return StreamingResponse(object_store.iter_chunks(url), media_type="application/octet-stream",
                             headers={"Content-Length": str(size),
                                      "Content-Disposition": f'attachment; filename="{object_store.name(url)}"'})


def delete(url: str, missing: str) -> int:
    """Delete the object ``url``; its bytes. 409 for a folder that holds objects, 404 for nothing."""
    size = object_store.file_size(url)
    if size is None:
        if is_folder(url):
            raise HTTPException(status.HTTP_409_CONFLICT, "the directory is not empty")
        raise HTTPException(status.HTTP_404_NOT_FOUND, missing)
    object_store.remove(url)
    return size
