"""Object-store locations (``s3://bucket/prefix``, ``gs://...``) and the fsspec filesystem behind them.

One home for: which strings are object-store URLs, how one is checked, joined and listed, and how
its filesystem is built. The endpoint and credentials come from the standard variables of the store's
own client (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION`` for ``s3://``, read by botocore itself); nothing here stores a secret.

Listings are never cached (``use_listings_cache=False``): other processes (the ranks of a gang, the
service) write the same prefixes, and a stale listing would hide a commit marker or show a deleted
checkpoint. Every helper takes and returns full URLs (``s3://bucket/key``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("orthoplex.storage")

#: URL schemes served through fsspec, and the package that provides each
SCHEMES: dict[str, str] = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
#: bytes one read of a streamed object asks for (a ranged GET each)
CHUNK = 4 << 20
#: bytes an open object buffers (the part size of a multipart upload; S3's minimum part is 5 MiB)
BLOCK = 8 << 20


class ObjectStoreError(ValueError):
    """An object-store URL that is malformed, or whose store cannot be used."""


def is_url(path: object) -> bool:
    """True for ``s3://...``/``gs://...`` (a string; ``Path`` objects are local by construction)."""
    return isinstance(path, str) and path.split("://", 1)[0].lower() in SCHEMES and "://" in path


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def check_url(url: str) -> str:
    """``url`` normalised (no trailing ``/``), or :class:`ObjectStoreError` naming what is wrong."""
    if not is_url(url):
        raise ObjectStoreError(f"{url!r} is not an object-store URL ({', '.join(s + '://' for s in SCHEMES)})")
    rest = url.split("://", 1)[1].rstrip("/")
    bucket = rest.split("/", 1)[0]
    if not bucket:
        raise ObjectStoreError(f"{url!r} names no bucket (want {scheme(url)}://BUCKET/PREFIX)")
    parts = rest.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\0" in rest:
        raise ObjectStoreError(f"{url!r}: empty, '.' or '..' path segments are not allowed")
    if importlib.util.find_spec(SCHEMES[scheme(url)]) is None:
        raise ObjectStoreError(f"{url!r}: {scheme(url)}:// needs the {SCHEMES[scheme(url)]} package installed")
    return f"{scheme(url)}://{rest}"


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a URL (no ``..`` handling: callers join names they built or checked)."""
    out = base.rstrip("/")
    for p in parts:
        p = str(p).strip("/")
        if p:
            out = f"{out}/{p}"
    return out


def name(url: str) -> str:
    """The last path segment."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


@functools.cache
def _filesystem(proto: str) -> Any:
    from fsspec import filesystem

    return filesystem(proto, use_listings_cache=False, skip_instance_cache=True)


def filesystem(url: str) -> Any:
    """The (uncached-listing) fsspec filesystem for ``url``'s scheme, one per process and scheme."""
    return _filesystem(scheme(url))


def storage_options() -> dict[str, Any]:
    """What Orthoplex passes to fsspec for every object-store filesystem (DCP's readers and writers too)."""
    return {"use_listings_cache": False}


def _key(url: str) -> str:
    return url.split("://", 1)[1]


def exists(url: str) -> bool:
    return bool(filesystem(url).exists(_key(url)))


def bucket_exists(url: str) -> bool:
    """Whether ``url``'s bucket exists and can be listed with the credentials at hand."""
    fs = filesystem(url)
    bucket = _key(url).split("/", 1)[0]
    try:
        fs.ls(bucket, detail=False)
        return True
    except (FileNotFoundError, PermissionError, OSError):
        return False


def listdir(url: str) -> list[tuple[str, bool]]:
    """``(name, is_prefix)`` of the direct children of ``url`` (empty when there are none)."""
    fs = filesystem(url)
    try:
        entries = fs.ls(_key(url), detail=True)
    except FileNotFoundError:
        return []
    base = _key(url).rstrip("/")
    out = []
    for e in entries:
        key = str(e["name"]).rstrip("/")
        if key == base:
            continue
        out.append((key.rsplit("/", 1)[-1], e.get("type") == "directory"))
    return sorted(out)


def find(url: str) -> dict[str, int]:
    """Every object under ``url`` as ``{relative key: size}``."""
    fs = filesystem(url)
    base = _key(url).rstrip("/") + "/"
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    return {k[len(base):]: int(v.get("size") or 0) for k, v in found.items()
            if k.startswith(base) and v.get("type") != "directory"}


def size(url: str) -> int:
    return int(filesystem(url).info(_key(url))["size"])


def file_size(url: str) -> int | None:
    """The size of the object ``url``; ``None`` when there is none (nothing, or only keys below it)."""
    try:
        info = filesystem(url).info(_key(url))
    except FileNotFoundError:
        return None
    return int(info["size"]) if info.get("type") == "file" else None


def read_bytes(url: str) -> bytes:
    return bytes(filesystem(url).cat_file(_key(url)))


def write_bytes(url: str, data: bytes) -> None:
    """One PUT: the object appears whole or not at all (readers never see a part of it)."""
    filesystem(url).pipe_file(_key(url), data)


def open_read(url: str) -> IO[bytes]:
    """A streaming reader without a read-ahead cache: each ``read(n)`` is one ranged GET of ``n``
    bytes, so a reader holds what it asked for and nothing more."""
    return filesystem(url).open(_key(url), "rb", block_size=BLOCK, cache_type="none")


def open_write(url: str) -> IO[bytes]:
    """A streaming writer: parts of ``BLOCK`` bytes go up as they fill (a multipart upload); the
    object appears whole on ``close``, and not at all when the writer is discarded."""
    return filesystem(url).open(_key(url), "wb", block_size=BLOCK)


@contextlib.contextmanager
def writing(url: str) -> Iterator[IO[bytes]]:
    """A streaming writer of ``url`` (:func:`open_write`) that publishes the object only when the
    block ends normally; on an exception the upload is aborted and nothing appears (an object that
    was there before stays as it was)."""
    f: Any = open_write(url)
    try:
        yield f
    except BaseException:
        f.discard()
        f.closed = True
        raise
    f.close()


def upload(local: str | os.PathLike[str], url: str) -> None:
    """Copy a local file to ``url``, streamed (multipart for large files; never read whole)."""
    filesystem(url).put_file(os.fspath(local), _key(url))


def download(url: str, local: str | os.PathLike[str]) -> None:
    """Copy ``url`` into a local file, streamed, through a temporary name (readers of ``local`` see
    nothing or the whole file)."""
    tmp = f"{os.fspath(local)}.part-{os.getpid()}"
    filesystem(url).get_file(_key(url), tmp)
    os.replace(tmp, local)


def stage(url: str, cache_root: str | os.PathLike[str] | None = None) -> Path:
    """A node-local copy of the object ``url`` (readers that need a file: memory-mapped token files,
    tokenizers): downloaded streamed once, reused while the object's ETag is the same. Objects of
    one prefix land in one directory, so a file and its sidecar stay next to each other."""
    info = filesystem(url).info(_key(url))
    tag = str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("size"))
    where = Path(cache_root or tempfile.gettempdir()) / "orthoplex-objects"
    local = where / hashlib.sha256(parent(url).encode()).hexdigest()[:24] / name(url)
    marker = local.with_name(f".{local.name}.etag")
    if local.is_file() and marker.is_file() and marker.read_text() == tag:
        return local
    local.parent.mkdir(parents=True, exist_ok=True)
    log.info("staging %s (%s bytes) in %s", url, info.get("size"), local)
    download(url, local)
    marker.write_text(tag)
    return local


def iter_chunks(url: str, chunk: int = CHUNK) -> Iterator[bytes]:
    with open_read(url) as f:
        while data := f.read(chunk):
            yield data


def sha256(url: str) -> str:
    h = hashlib.sha256()
    for data in iter_chunks(url):
        h.update(data)
    return h.hexdigest()


def remove(url: str) -> None:
    """Delete one object (no error when it is gone already)."""
    with contextlib.suppress(FileNotFoundError):
        filesystem(url).rm_file(_key(url))


def remove_tree(url: str) -> None:
    """Delete every object under ``url/`` (no error when there is none)."""
    fs = filesystem(url)
    keys = list(find(url))
    if keys:
        fs.rm([f"{_key(url).rstrip('/')}/{k}" for k in keys])


def location_problem(where: str) -> str | None:
    """Why ``where`` cannot hold Orthoplex's files (``None`` when it can, or when it is a local path):
    a malformed object-store URL, or one whose bucket does not exist or cannot be listed with the
    credentials at hand."""
    if not is_url(where):
        return None
    try:
        url = check_url(where)
    except ObjectStoreError as e:
        return str(e)
    if not bucket_exists(url):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        return (f"bucket {bucket!r} does not exist or cannot be listed with the credentials at hand "
                "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    return None


def under(base: str | os.PathLike[str], *names: str) -> Path | str:
    """``base/name/...``: a URL (a string) under an object-store URL, a ``Path`` under anything else."""
    if is_url(base):
        return join(str(base), *names)
    return Path(base).joinpath(*names)


def local_resolved(where: str) -> str:
    """An object-store URL as it is; a local path made absolute."""
    return where if is_url(where) else str(Path(where).resolve())


def join_location(base: str, name: str) -> str:
    """``base/name`` as a string, for a local path or an object-store URL."""
    return str(under(base, name))
