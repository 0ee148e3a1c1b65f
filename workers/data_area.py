"""A tenant's data area: where a job spec's ``data.paths`` may point, and the one rule that
resolves them (used by the API at submission and again by the engine where it reads).

Layout under the storage path (``tenant_area``): ``tenants/<tenant id>/data`` is the tenant's area
(uploads land there); checkpoints live under ``jobs/<job id>/checkpoints``, outside every tenant's
area. The admin may declare read-only shared roots by name (``ORTHOPLEX_SHARED_DATA_ROOTS``).

A path is either relative to the tenant's area (``corpus/a.txt``, ``corpus``, ``corpus/**/*.txt``)
or ``shared:<name>/<relative path>``. Absolute paths, ``~``, ``..``, URL schemes (a tenant names
paths in its area, never a bucket) and NUL are refused before the disk is touched. An area (or a
shared root) may itself live on an object store (``s3://...``, ``ORTHOPLEX_STORAGE_PATH``): its
files are then the keys under its prefix, selected by the same rules and bounds, and a key outside
the prefix cannot be named (no ``..``, nothing absolute). Every file is resolved
with symlinks followed and must lie inside its root. Globs are matched by walking the root
without following symlinked directories, with a bound on the entries visited, the files matched
and their total bytes. Error messages name the path as the tenant wrote it and never say anything
about files outside the area (no existence or size oracle).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from workers import object_store

SHARED_PREFIX = "shared:"
DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_BYTES = 16 << 30
#: directory entries a glob or directory expansion may visit (bounds the walk, matches or not)
VISITS_PER_FILE = 20
_GLOB = re.compile(r"[*?\[]")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class DataPathError(ValueError):
    """A data path the tenant may not use: ``index`` in ``data.paths`` (None: the whole list)."""

    def __init__(self, index: int | None, msg: str) -> None:
        super().__init__(msg if index is None else f"data.paths[{index}]: {msg}")
        self.index = index
        self.msg = msg


@dataclass(frozen=True)
class DataArea:
    """Where one tenant's job may read: its own area and the shared roots, with the bounds."""

    root: Path | str  # a str: an object-store prefix (s3://...)
    shared: Mapping[str, Path | str] = field(default_factory=dict)
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES

    def to_dict(self) -> dict[str, Any]:
        """What the controller hands the engine (``data.area`` of the runtime spec)."""
        return {"root": str(self.root), "shared": {k: str(v) for k, v in self.shared.items()},
                "max_files": self.max_files, "max_bytes": self.max_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DataArea:
        return cls(root=_root(d["root"]), shared={str(k): _root(v) for k, v in dict(d.get("shared") or {}).items()},
                   max_files=int(d.get("max_files", DEFAULT_MAX_FILES)),
                   max_bytes=int(d.get("max_bytes", DEFAULT_MAX_BYTES)))


def _root(v: Any) -> Path | str:
    return object_store.check_url(v) if object_store.is_url(v) else Path(v)


def tenant_area(storage_path: str | os.PathLike[str], tenant_id: int) -> Path | str:
    """The tenant's data area under the storage path (not created here; a prefix on an object store)."""
    return object_store.under(storage_path, "tenants", str(int(tenant_id)), "data")


def checkpoint_root(storage_path: str | os.PathLike[str]) -> Path | str:
    """Where job checkpoints live: outside every tenant area (a URL under an ``s3://`` storage path)."""
    return object_store.under(storage_path, "jobs")


def split_path(raw: str, area: DataArea | None, index: int | None = None) -> tuple[Path | str, str]:
    """``(root, relative posix path)`` for a path as a tenant writes it; :class:`DataPathError` when
    its syntax is not allowed (checked before the disk is touched). ``area=None`` checks the syntax
    only (any shared root name passes; the root returned is meaningless)."""
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise DataPathError(index, "must be a non-empty path")
    root: Path | str = area.root if area is not None else Path(".")
    rel = raw
    if raw.startswith(SHARED_PREFIX):
        name, _, rel = raw[len(SHARED_PREFIX):].partition("/")
        if area is not None:
            if name not in area.shared:
                known = ", ".join(sorted(area.shared)) or "none are configured"
                raise DataPathError(index, f"names no shared data root (shared roots: {known})")
            root = area.shared[name]
        rel = rel or "."
    elif raw.lower().startswith(("s3://", "gs://")):
        raise DataPathError(index, "s3:// and gs:// are not supported; upload the data into your data area")
    elif _SCHEME.match(raw) and "://" in raw:
        raise DataPathError(index, "URL schemes are not supported; use a path inside your data area")
    if rel.startswith(("/", "~", "\\")) or "\\" in rel:
        raise DataPathError(index, "must be relative to your data area (no absolute paths or '~')")
    parts = PurePosixPath(rel).parts
    if ".." in parts:
        raise DataPathError(index, "must stay inside your data area (no '..')")
    if len(rel.encode()) > 1024 or any(len(p.encode()) > 255 for p in parts):
        raise DataPathError(index, "too long (a name is at most 255 bytes, a path 1024)")
    return root, PurePosixPath(*parts).as_posix() if parts else "."


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _pattern(rel: str) -> re.Pattern[str]:
    """A glob over posix relative paths: ``**`` spans directories, ``*``/``?``/``[..]`` one name."""
    out = []
    parts = rel.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        j, buf = 0, []
        while j < len(part):
            c = part[j]
            if c == "*":
                buf.append("[^/]*")
            elif c == "?":
                buf.append("[^/]")
            elif c == "[":
                k = part.find("]", j + 2)
                if k < 0:
                    buf.append(re.escape(c))
                else:
                    body = part[j + 1:k].replace("\\", "\\\\")
                    buf.append("[^/]" if not body else f"[{'^' + body[1:] if body[0] == '!' else body}]")
                    j = k
            else:
                buf.append(re.escape(c))
            j += 1
        out.append("".join(buf) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


class _Budget:
    def __init__(self, area: DataArea, index: int | None) -> None:
        self.area = area
        self.index = index
        self.files = 0
        self.bytes = 0
        self.visits = 0

    def visit(self) -> None:
        self.visits += 1
        if self.visits > self.area.max_files * VISITS_PER_FILE:
            raise DataPathError(self.index, f"walks more than {self.area.max_files * VISITS_PER_FILE} entries; "
                                            "name a smaller directory or a narrower pattern")

    def take(self, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.files > self.area.max_files:
            raise DataPathError(self.index, f"selects more than {self.area.max_files} files")
        if self.bytes > self.area.max_bytes:
            raise DataPathError(self.index, f"selects more than {self.area.max_bytes} bytes")


def _file(path: Path, root: Path, budget: _Budget) -> Path | None:
    """The resolved regular file at ``path`` if it is one inside ``root``; raises when it escapes."""
    real = path.resolve()
    if not _inside(real, root):
        raise DataPathError(budget.index, "resolves outside your data area")
    try:
        st = real.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    budget.take(st.st_size)
    return real


def _walk(start: Path, root: Path, budget: _Budget, match: re.Pattern[str] | None,
          suffixes: Sequence[str] | None) -> list[Path]:
    """Regular files under ``start`` (symlinked directories are not entered), sorted by relative path."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            budget.visit()
            p = Path(dirpath) / name
            rel = p.relative_to(start).as_posix()
            if match is not None and not match.match(rel):
                continue
            if suffixes is not None and not name.endswith(tuple(suffixes)):
                continue
            real = _file(p, root, budget)
            if real is not None:
                found.append((rel, real))
        for _ in dirnames:
            budget.visit()
    return [p for _, p in sorted(found)]


def _object_files(root: str, rel: str, budget: _Budget, suffixes: Sequence[str] | None) -> list[tuple[str, int]]:
    """``resolve_data_paths`` for one path in an object-store root: ``(URL, size)`` of the keys it
    selects under the root's prefix (names starting with ``.`` skipped, as on disk), sorted."""
    glob = bool(_GLOB.search(rel))
    lit: list[str] = []
    for part in rel.split("/") if rel != "." else []:
        if glob and _GLOB.search(part):
            break
        lit.append(part)
    base = object_store.join(root, *lit)
    if not glob and rel != ".":
        size = object_store.file_size(base)
        if size is not None:  # one object
            budget.take(size)
            return [(base, size)]
    match = _pattern("/".join(rel.split("/")[len(lit):])) if glob else None
    found: list[tuple[str, int]] = []
    for key, size in sorted(object_store.find(base).items()):
        budget.visit()
        name = key.rsplit("/", 1)[-1]
        if any(p.startswith(".") or p == "__pycache__" for p in key.split("/")):
            continue
        if match is not None and not match.match(key):
            continue
        if match is None and suffixes is not None and not name.endswith(tuple(suffixes)):
            continue
        budget.take(size)
        found.append((object_store.join(base, key), size))
    return found


def resolve_data_paths(paths: Sequence[str], area: DataArea,
                       suffixes: Sequence[str] | None = None) -> list[Path | str]:
    """The files ``paths`` select, resolved, each inside its root, in order, bounded by the area's
    ``max_files`` / ``max_bytes`` in total; :class:`DataPathError` (naming the index) otherwise.
    A directory contributes its files (``suffixes`` only, when given), a glob its matches. In an
    object-store root the files are URLs (``s3://...``) of keys under its prefix."""
    total = _Budget(area, None)
    out: list[Path | str] = []
    seen: set[Path | str] = set()
    for i, raw in enumerate(paths):
        root, rel = split_path(raw, area, i)
        budget = _Budget(area, i)
        if isinstance(root, str):
            objects = _object_files(root, rel, budget, suffixes)
            if not objects:
                raise DataPathError(i, "matches no file in your data area")
            for url, size in objects:
                if url not in seen:
                    seen.add(url)
                    out.append(url)
                    total.take(size)
            continue
        root = root.resolve()
        if _GLOB.search(rel):
            # the literal directory prefix of the pattern, then a bounded walk below it
            lit = []
            for part in rel.split("/"):
                if _GLOB.search(part):
                    break
                lit.append(part)
            base = (root / "/".join(lit)).resolve() if lit else root
            if not _inside(base, root):
                raise DataPathError(i, "resolves outside your data area")
            rest = rel.split("/")[len(lit):]
            files = _walk(base, root, budget, _pattern("/".join(rest)), None) if base.is_dir() else []
        else:
            target = root / rel
            real = target.resolve()
            if not _inside(real, root):
                raise DataPathError(i, "resolves outside your data area")
            if real.is_dir():
                files = _walk(real, root, budget, None, suffixes)
            else:
                f = _file(target, root, budget)
                files = [f] if f is not None else []
        if not files:
            raise DataPathError(i, "matches no file in your data area")
        for f in files:
            if f not in seen:
                seen.add(f)
                out.append(f)
                total.take(f.stat().st_size)
    return out


def resolve_path(raw: str, area: DataArea, *, want: str = "any") -> Path:
    """One file or directory a tenant names (an HF checkpoint directory, a tokenizer), resolved with
    symlinks followed and inside its root; no globs. ``want``: ``"file"``, ``"dir"`` or ``"any"``.
    :class:`DataPathError` (``index`` None) otherwise, never saying anything about the outside."""
    root, rel = split_path(raw, area)
    if _GLOB.search(rel):
        raise DataPathError(None, "must name one file or directory (no patterns)")
    if isinstance(root, str):
        raise DataPathError(None, "model and tokenizer directories cannot be read from object storage yet; "
                                  "use a data area on a shared file system (docs/storage.md)")
    root = root.resolve()
    real = (root / rel).resolve()
    if not _inside(real, root):
        raise DataPathError(None, "resolves outside your data area")
    if not real.exists():
        raise DataPathError(None, "matches no file in your data area")
    if want == "dir" and not real.is_dir():
        raise DataPathError(None, "is not a directory in your data area")
    if want == "file" and not real.is_file():
        raise DataPathError(None, "is not a file in your data area")
    return real


class TenantFileError(ValueError):
    """A file inside a tenant's area that cannot be used (a path it names breaks the rule below, or
    its content is malformed): the message names the file as the tenant knows it and what is wrong,
    never anything about files outside the area."""


def _syntax_ok(ref: str) -> bool:
    if not ref or "\x00" in ref or "\\" in ref or ref.startswith(("/", "~")) or _SCHEME.match(ref):
        return False
    parts = PurePosixPath(ref).parts
    return ".." not in parts and len(ref.encode()) <= 1024 and all(len(p.encode()) <= 255 for p in parts)


def referenced_path(base: str | os.PathLike[str], ref: object, where: str, *, want: str = "file",
                    required: bool = True) -> Path | None:
    """The one rule for every path a tenant's file names (an HF index's ``weight_map`` values, the
    fixed names a reader looks for next to a file: ``config.json``, ``tokenizer_config.json``, a
    sidecar, and any later format): ``ref`` is a relative posix path without ``..``, and resolved
    with symlinks followed it lies inside ``base``, the directory that referenced it.

    ``where`` says who names it (``"model.safetensors.index.json: weight_map['x']"``), for messages.
    Returns the resolved path; ``None`` when ``required`` is false and nothing (not even a symlink)
    is there. ``want``: ``"file"``, ``"dir"`` or ``"any"``. :class:`TenantFileError` otherwise; the
    escape check comes before anything is looked at on disk, so an escaping path gets the same
    message whether or not its target exists."""
    if not isinstance(ref, str) or not _syntax_ok(ref):
        shown = ref if isinstance(ref, str) else type(ref).__name__
        raise TenantFileError(f"{where}: {str(shown)[:120]!r} must be a relative path inside its directory "
                              "(no absolute path, '~', '..' or URL)")
    root = Path(base).resolve()
    entry = root / ref
    real = entry.resolve()
    if not _inside(real, root):
        raise TenantFileError(f"{where}: {ref[:120]!r} resolves outside its directory")
    if not entry.is_symlink() and not real.exists():
        if not required:
            return None
        raise TenantFileError(f"{where}: {ref[:120]!r} does not exist")
    if want == "file" and not real.is_file():
        raise TenantFileError(f"{where}: {ref[:120]!r} is not a file")
    if want == "dir" and not real.is_dir():
        raise TenantFileError(f"{where}: {ref[:120]!r} is not a directory")
    return real
