"""Server-sent events for ``GET /v1/jobs/{id}/events``: the job's events as they are recorded,
``id:`` = the event id (a client resumes with ``since``), ending with ``event: end`` once the job is
in a terminal state and every event has been sent, after ``sse_max_s``, or once the caller's token
is revoked or expired (re-checked every ``sse_recheck_s``; ``end`` then carries ``reason``).

No database session is held between polls: each poll is one short read. A tenant has at most
``sse_max_per_tenant`` streams open on one API process (:class:`StreamSlots`; the next one is 429).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from service.api.deps import token_valid
from service.api.schemas import EventPublic
from service.db.models import ApiToken, Event, Job
from workers.states import TERMINAL

KEEPALIVE_S = 15.0
# One server-sent event as OpenAPI 3.1 describes a ``text/event-stream`` item: ``event`` is the
# event's type (or ``end``), ``data`` its JSON (an event as the JSON list shows it, or the job's final
# state for ``end``), ``id`` the event id to resume from with ``since``.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
    },
}
BATCH = 500


def wants_stream(request: Request) -> bool:
    """``Accept: text/event-stream`` (the route's ``stream`` query parameter is the other way)."""
    return "text/event-stream" in request.headers.get("accept", "")


class StreamSlots:
    """Open event streams per tenant in this process, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[int, int] = {}
        self._lock = threading.Lock()

    def take(self, tenant_id: int) -> None:
        """Claim a slot or raise 429."""
        with self._lock:
            n = self._open.get(tenant_id, 0)
            if n >= self.limit:
                raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                    f"{self.limit} event streams already open for this tenant; close one",
                                    headers={"Retry-After": "5"})
            self._open[tenant_id] = n + 1

    def give(self, tenant_id: int) -> None:
        with self._lock:
            n = self._open.get(tenant_id, 0) - 1
            if n > 0:
                self._open[tenant_id] = n
            else:
                self._open.pop(tenant_id, None)

    def open_count(self, tenant_id: int) -> int:
        with self._lock:
            return self._open.get(tenant_id, 0)


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that gives its stream slot back however the stream ends."""

    def __init__(self, *args: Any, release: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def open_stream(app: FastAPI, tenant_id: int, token_id: int | None, job_id: int, since: int) -> StreamingResponse:
    """The SSE response for a job the caller may see (429 over the tenant's stream cap)."""
    slots: StreamSlots = app.state.streams
    slots.take(tenant_id)
    return SlotStreamingResponse(event_stream(app, job_id, since, token_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                 release=lambda: slots.give(tenant_id))


def _token_ok(app: FastAPI, token_id: int) -> bool:
    with app.state.sessions() as s:
        tok = s.get(ApiToken, token_id)
        return tok is not None and token_valid(tok)


def _poll(app: FastAPI, job_id: int, since: int) -> tuple[list[dict[str, Any]], str | None]:
    with app.state.sessions() as s:
        state = s.scalar(sa.select(Job.state).where(Job.id == job_id))
        rows = s.scalars(
            sa.select(Event).where(Event.job_id == job_id, Event.id > since).order_by(Event.id).limit(BATCH)
        ).all()
        return [EventPublic.model_validate(e).model_dump(mode="json") for e in rows], state


def _frame(event: str, data: dict[str, Any], id_: int | None = None) -> bytes:
    head = f"id: {id_}\n" if id_ is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def event_stream(app: FastAPI, job_id: int, since: int, token_id: int | None = None) -> AsyncIterator[bytes]:
    api = app.state.api
    started = last_sent = checked = time.monotonic()
    cursor = since
    while True:
        if token_id is not None and time.monotonic() - checked >= api.sse_recheck_s:
            if not await anyio.to_thread.run_sync(_token_ok, app, token_id):
                yield _frame("end", {"state": None, "last_id": cursor, "reason": "token revoked or expired"})
                return
            checked = time.monotonic()
        events, state = await anyio.to_thread.run_sync(_poll, app, job_id, cursor)
        for ev in events:
            cursor = ev["id"]
            yield _frame(ev["type"], ev, ev["id"])
            last_sent = time.monotonic()
        if len(events) == BATCH:
            continue
        if state is None or state in TERMINAL:
            yield _frame("end", {"state": state, "last_id": cursor})
            return
        now = time.monotonic()
        if now - started > api.sse_max_s:
            yield _frame("end", {"state": state, "last_id": cursor, "timeout": True})
            return
        if now - last_sent > KEEPALIVE_S:
            yield b": keep-alive\n\n"
            last_sent = now
        await anyio.sleep(api.sse_poll_s)
