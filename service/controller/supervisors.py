"""The controller's side of the JobSupervisor actors: find, start, ask, tell, reap.

Supervisors are detached, named ``orthoplex-job-{job_id}-a{attempt}`` in namespace ``orthoplex``,
so a restarted controller finds them by name (``workers.runtime.supervision.launch.find_supervisor``). Every
call here is bounded by a timeout; the answers distinguish a supervisor that is *gone* (no actor by
that name, or Ray says it died) from one that is only *unreachable right now* (a timeout, a node
that is being declared dead): only the first may start a new attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.log import get_logger

log = get_logger("service.controller.supervisors")


class SupervisorGone(RuntimeError):
    """The attempt's supervisor does not exist any more (never started, died, or was killed)."""


class SupervisorUnreachable(RuntimeError):
    """The supervisor did not answer in time; try again next round."""


@dataclass(frozen=True)
class AttemptKey:
    job_id: int
    attempt: int

    @property
    def actor_name(self) -> str:
        return f"orthoplex-job-{self.job_id}-a{self.attempt}"


class Supervisors:
    """Handles of supervisors, cached per attempt, with bounded calls."""

    def __init__(self, call_timeout_s: float = 10.0) -> None:
        self.call_timeout_s = call_timeout_s
        self._handles: dict[AttemptKey, Any] = {}

    # -- lookup ------------------------------------------------------------------------------------
    def find(self, key: AttemptKey) -> Any | None:
        """The live handle for ``key`` (cached), or None when no actor has that name.

        Raises :class:`SupervisorUnreachable` when this process is not connected to Ray (a lookup
        would otherwise start a private local Ray instance and find nothing)."""
        import ray

        from workers.runtime.supervision.launch import find_supervisor

        if not ray.is_initialized():
            raise SupervisorUnreachable("not connected to Ray")
        handle = self._handles.get(key)
        if handle is not None:
            return handle
        handle = find_supervisor(key.job_id, key.attempt)
        if handle is not None:
            self._handles[key] = handle
        return handle

    def forget(self, key: AttemptKey) -> None:
        self._handles.pop(key, None)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, key: AttemptKey, spec: dict[str, Any]) -> Any:
        """Create the attempt's supervisor (or take the one a crashed controller already created)
        and make sure it runs. Idempotent per attempt: the actor name is the attempt."""
        from workers.runtime.supervision.launch import start_supervisor

        handle = self.find(key)
        if handle is None:
            handle = start_supervisor(key.job_id, key.attempt, spec)
            self._handles[key] = handle
            log.info("supervisor started", extra={"job_id": key.job_id, "attempt": key.attempt})
        return handle

    def kill(self, key: AttemptKey) -> bool:
        """Kill the attempt's supervisor if it exists (its placement group and workers go with it)."""
        import ray

        try:
            handle = self.find(key)
        except SupervisorUnreachable:
            return False
        self.forget(key)
        if handle is None:
            return False
        try:
            ray.kill(handle, no_restart=True)
        except Exception as exc:  # already dead: nothing to do
            log.debug("kill failed", extra={"actor": key.actor_name, "error": str(exc)})
            return False
        log.info("supervisor killed", extra={"job_id": key.job_id, "attempt": key.attempt})
        return True

    # -- calls -------------------------------------------------------------------------------------
    def call(self, key: AttemptKey, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """``handle.method(*args)`` and wait for the answer; raise Gone/Unreachable as above."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

        handle = self.find(key)
        if handle is None:
            raise SupervisorGone(f"no supervisor {key.actor_name}")
        try:
            ref = getattr(handle, method).remote(*args)
            return ray.get(ref, timeout=timeout_s or self.call_timeout_s)
        except ActorUnavailableError as exc:
            raise SupervisorUnreachable(f"{key.actor_name}: {exc}") from exc
        except (ActorDiedError, RayActorError) as exc:
            self.forget(key)
            raise SupervisorGone(f"{key.actor_name} died: {type(exc).__name__}") from exc
        except GetTimeoutError as exc:
            raise SupervisorUnreachable(f"{key.actor_name}: {method} timed out") from exc

    def tell(self, key: AttemptKey, method: str, *args: Any) -> bool:
        """Fire ``handle.method(*args)`` without waiting; False when the supervisor is gone."""
        handle = self.find(key)
        if handle is None:
            return False
        getattr(handle, method).remote(*args)
        return True

    def events(self, key: AttemptKey, since: int) -> list[dict[str, Any]]:
        """The attempt's events with ``seq > since`` (the runtime's contract), in seq order."""
        out = self.call(key, "events", since)
        return sorted(out or [], key=lambda e: int(e["seq"]))
