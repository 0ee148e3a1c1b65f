"""Named crash points: an explicit test hook that kills this process with SIGKILL at a chosen step.

The crash tests need to kill the controller *between* two steps of an admission or a cancel (after
the attempt is persisted but before its supervisor exists, ...); a timer cannot hit that window
reliably. With ``ORTHOPLEX_CONTROLLER_CRASH_AT=<name>`` set, :func:`crash_point` sends the process
SIGKILL — a real ``kill -9``, no cleanup, no lease release — when the loop reaches ``<name>``. Unset
(always, outside tests) it does nothing.

Points: ``admit:persisted`` (attempt committed, supervisor not yet started), ``admit:started``
(supervisor started, ADMITTED → RUNNING not yet recorded), ``cancel:asked`` (``cancel()`` sent,
nothing recorded), ``events:pulled`` (a batch fetched from a supervisor, not yet stored).
"""

from __future__ import annotations

import os
import signal

ENV = "ORTHOPLEX_CONTROLLER_CRASH_AT"
POINTS = frozenset({"admit:persisted", "admit:started", "cancel:asked", "events:pulled"})


def crash_point(name: str) -> None:
    """SIGKILL this process if ``ORTHOPLEX_CONTROLLER_CRASH_AT`` names ``name``."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
