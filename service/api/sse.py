"""Server-sent events for ``GET /v1/jobs/{id}/events``: the job's events as they are recorded,
``id:`` = the event id (a client resumes with ``since``), ending with ``event: end`` once the job is
in a terminal state and every event has been sent, or after ``sse_max_s``."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request

from service.api.schemas import EventPublic
from service.db.models import Event, Job
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


def _poll(app: FastAPI, job_id: int, since: int) -> tuple[list[dict[str, Any]], str | None]:
    import sqlalchemy as sa

    with app.state.sessions() as s:
        state = s.scalar(sa.select(Job.state).where(Job.id == job_id))
        rows = s.scalars(
            sa.select(Event).where(Event.job_id == job_id, Event.id > since).order_by(Event.id).limit(BATCH)
        ).all()
        return [EventPublic.model_validate(e).model_dump(mode="json") for e in rows], state


def _frame(event: str, data: dict[str, Any], id_: int | None = None) -> bytes:
    head = f"id: {id_}\n" if id_ is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def event_stream(app: FastAPI, job_id: int, since: int) -> AsyncIterator[bytes]:
    api = app.state.api
    started = last_sent = time.monotonic()
    cursor = since
    while True:
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
