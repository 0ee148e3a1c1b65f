"""What each tenant's data area holds and what its uploads in flight have reserved, in this API
process: the accounting behind the quotas of ``/v1/data`` (bytes, and entries: files plus
directories).

An upload is admitted (:meth:`Ledger.begin`) only while the tenant has fewer than
``upload_max_concurrent`` uploads in flight (else :class:`TooManyUploads`, 429) and the entries it
would create (the file and its missing directories) fit the entry quota; it then reserves each chunk's
bytes before writing it (:meth:`Ledger.reserve`), against the bytes on disk plus every other
upload's reservation, so concurrent uploads cannot together pass the byte quota. The area is
walked (bounded) whenever the tenant has no upload in flight; in between, placements and deletions
update the counts. Another API process's uploads are seen at the next walk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from service.api import object_data

#: the temporary folder of uploads, inside the area (not counted, not listed)
UPLOADS = ".uploads"


class QuotaExceeded(Exception):
    """The upload would take the area over a quota (413)."""


class TooManyUploads(Exception):
    """The tenant has as many uploads in flight as allowed (429)."""


@dataclass
class _Area:
    used: int = 0
    entries: int = 0
    reserved: int = 0
    reserved_entries: int = 0
    uploads: int = 0


@dataclass
class Ticket:
    """One admitted upload: what it reserved (release it with :meth:`Ledger.finish`)."""

    tenant_id: int
    entries: int
    replaces: int
    reserved: int = 0


def walk(root: Path | str, limit: int) -> tuple[int, int]:
    """``(bytes, entries)`` of files and directories under ``root`` (the upload folder left out);
    stops counting past ``limit`` entries (the area is over its quota then anyway). An object-store
    root (``s3://``): its keys and the folders they imply."""
    if isinstance(root, str):
        return object_data.usage(root)
    used = entries = 0
    if not root.is_dir():
        return 0, 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d != UPLOADS]
        entries += len(dirnames) + len(filenames)
        for name in filenames:
            try:
                used += (Path(dirpath) / name).lstat().st_size
            except OSError:
                continue
        if entries > limit:
            break
    return used, entries


class WalkBudget:
    """How many directory entries a listing may look at (``spent`` past ``limit``: it stopped early)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    @property
    def spent(self) -> bool:
        return self.seen > self.limit


def iter_files(root: Path | str, after: str | None = None,
               budget: WalkBudget | None = None) -> Iterator[tuple[str, int]]:
    """``(relative path, bytes)`` of the files under ``root`` in the byte order of their paths,
    starting after the path ``after``; subtrees wholly before ``after`` are not entered. Stops once
    ``budget`` is spent."""
    def key(e: os.DirEntry[str]) -> str:
        return e.name + "/" if e.is_dir(follow_symlinks=False) else e.name

    def visit(d: Path, prefix: str) -> Iterator[tuple[str, int]]:
        try:
            entries = sorted(os.scandir(d), key=key)
        except OSError:
            return
        for e in entries:
            if budget is not None:
                budget.seen += 1
                if budget.spent:
                    return
            rel = prefix + e.name
            if not prefix and e.name == UPLOADS:
                continue
            if e.is_dir(follow_symlinks=False):
                if after is not None and rel + "/" < after and not after.startswith(rel + "/"):
                    continue
                yield from visit(Path(e.path), rel + "/")
            elif after is None or rel > after:
                try:
                    yield rel, e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue

    if isinstance(root, str):  # an object-store area: its keys, already in byte order
        for rel, size in object_data.iter_files(root, after):
            if budget is not None:
                budget.seen += 1
                if budget.spent:
                    return
            yield rel, size
    elif root.is_dir():
        yield from visit(root, "")


class Ledger:
    """Per tenant: bytes and entries on disk, and the reservations of its uploads in flight."""

    def __init__(self, quota_bytes: int, quota_entries: int, max_concurrent: int) -> None:
        self.quota_bytes = quota_bytes
        self.quota_entries = quota_entries
        self.max_concurrent = max_concurrent
        self._areas: dict[int, _Area] = {}
        self._lock = threading.Lock()
        self._gen = 0  # bumped by every change of the counts (a walk in progress then defers to them)

    def _area(self, tenant_id: int, root: Path | str) -> _Area:
        """The tenant's counts, read from the disk again when it has no upload in flight. Called
        with the lock held; the walk itself runs without it (uploads of other tenants, and this
        tenant's ``reserve`` calls on the event loop, never wait for a walk)."""
        st = self._areas.get(tenant_id)
        if st is not None and st.uploads:
            return st
        gen = self._gen
        self._lock.release()
        try:
            used, entries = walk(root, 10 * self.quota_entries)
        finally:
            self._lock.acquire()
        st = self._areas.get(tenant_id)
        if st is not None and (st.uploads or self._gen != gen):
            return st  # changed while we walked: the counts kept up to date in between win
        st = self._areas[tenant_id] = _Area(used=used, entries=entries)
        return st

    def usage(self, tenant_id: int, root: Path | str) -> tuple[int, int]:
        """``(bytes, entries)`` the area holds now (uploads in flight not included)."""
        with self._lock:
            st = self._area(tenant_id, root)
            return st.used, st.entries

    def begin(self, tenant_id: int, root: Path | str, new_entries: int, replaces: int) -> Ticket:
        """Admit an upload that creates ``new_entries`` entries and replaces a file of ``replaces``
        bytes; :class:`TooManyUploads` or :class:`QuotaExceeded` otherwise."""
        with self._lock:
            st = self._area(tenant_id, root)
            if st.uploads >= self.max_concurrent:
                raise TooManyUploads(f"{self.max_concurrent} uploads of yours are in progress; retry when one ends")
            if st.entries + st.reserved_entries + new_entries > self.quota_entries:
                raise QuotaExceeded(f"the data area quota ({self.quota_entries} files and directories) "
                                    "would be exceeded; delete some first")
            st.uploads += 1
            st.reserved_entries += new_entries
            return Ticket(tenant_id, new_entries, replaces)

    def reserve(self, ticket: Ticket, n: int) -> None:
        """Reserve ``n`` more bytes for ``ticket`` before they are written; :class:`QuotaExceeded`."""
        with self._lock:
            st = self._areas[ticket.tenant_id]
            if st.used + st.reserved + n - ticket.replaces > self.quota_bytes:
                raise QuotaExceeded(f"the data area quota ({self.quota_bytes} bytes) would be exceeded")
            st.reserved += n
            ticket.reserved += n

    def finish(self, ticket: Ticket, placed: bool, created: int = 0, size: int = 0) -> None:
        """Release ``ticket``; when its file of ``size`` bytes was ``placed`` (creating ``created``
        entries), count it."""
        with self._lock:
            st = self._areas[ticket.tenant_id]
            st.reserved -= ticket.reserved
            st.reserved_entries -= ticket.entries
            st.uploads -= 1
            self._gen += 1
            if placed:
                st.used += size - ticket.replaces
                st.entries += created

    def removed(self, tenant_id: int, nbytes: int, entries: int) -> None:
        """A deletion of ``entries`` entries holding ``nbytes`` bytes."""
        with self._lock:
            self._gen += 1
            st = self._areas.get(tenant_id)
            if st is not None:
                st.used = max(0, st.used - nbytes)
                st.entries = max(0, st.entries - entries)
