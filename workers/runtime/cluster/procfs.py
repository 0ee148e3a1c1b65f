"""What this project reads from Linux ``/proc/<pid>/stat``, in one place: a process's state, parent,
session and CPU time (``man 5 proc``). The command name (field 2) may hold spaces and parentheses,
so the fields are split after its last ``)``; :func:`stat_fields` returns them from field 3 (state) on.
Everything here answers ``None`` / empty for a process that is gone (or off Linux)."""

from __future__ import annotations

import os
from collections.abc import Iterator

STATE, PPID, PGRP, SESSION, UTIME, STIME = 0, 1, 2, 3, 11, 12  # indexes into stat_fields()


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from the state on; ``None`` if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pids() -> Iterator[int]:
    """The ids of every process now (a snapshot of ``/proc``; some may be gone when read)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    yield from (int(n) for n in names if n.isdigit())


def state(pid: int) -> str | None:
    """The process state letter (``R``, ``S``, ``Z``, ...); ``None`` if it is gone."""
    fields = stat_fields(pid)
    return fields[STATE] if fields else None


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    return state(pid) not in (None, "Z")


def cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds (all threads) from :func:`stat_fields`."""
    return (int(fields[UTIME]) + int(fields[STIME])) / os.sysconf("SC_CLK_TCK")


def children(parent: int) -> set[int]:
    """The direct children of ``parent``."""
    out = set()
    for pid in pids():
        fields = stat_fields(pid)
        if fields and fields[PPID] == str(parent):
            out.add(pid)
    return out


def in_sessions(sids: set[int]) -> list[int]:
    """The processes (other than this one) whose session id is in ``sids``."""
    out = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields and fields[SESSION].isdigit() and int(fields[SESSION]) in sids and pid != os.getpid():
            out.append(pid)
    return out
