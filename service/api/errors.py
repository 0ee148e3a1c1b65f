"""Error bodies, exception handlers and the request-body size cap.

Bad input never becomes a 500: validation errors are 422 with the field in ``loc`` (FastAPI's
shape, also used for planner refusals), database integrity errors 409, values the database cannot
store 422, an unreachable database 503. ``BodyLimit`` answers 413 for bodies over the cap, whether
``Content-Length`` announces them or they arrive chunked.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import exc as sa_exc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.log import get_logger

log = get_logger("service.api")


class ErrorOut(BaseModel):
    detail: str


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error codes an operation can answer."""
    text = {
        400: "malformed request (a body that cannot be decoded)",
        401: "missing, invalid, revoked or expired token",
        403: "the token may not use this operation (admin vs tenant)",
        404: "no such object (or it belongs to another tenant)",
        409: "illegal state change or conflicting request",
        413: "request body over the size cap (1 MiB)",
        429: "submission rate, job limit or open-stream limit exceeded; see Retry-After",
        503: "a dependency is not reachable, or the planner is busy; see Retry-After",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorOut, "description": text[code]}
        if code in (429, 503):
            entry["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
        out[code] = entry
    return out


def field_error(loc: list[str | int], msg: str, type_: str = "value_error") -> RequestValidationError:
    """A 422 naming ``loc`` (e.g. ``["body", "max_gpus"]``), shaped like FastAPI's own."""
    return RequestValidationError([{"loc": tuple(loc), "msg": msg, "type": type_}])


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 shape, without echoing the input (it may be huge, secret or not JSON: NaN)."""
    assert isinstance(exc, RequestValidationError)
    detail = [
        {"loc": [p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
         "msg": str(e.get("msg", "invalid"))[:500], "type": str(e.get("type", "value_error"))}
        for e in exc.errors()[:50]
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _integrity(_: Request, exc: Exception) -> JSONResponse:
    log.info("integrity error", extra={"error": str(getattr(exc, "orig", exc))[:200]})
    return JSONResponse({"detail": "conflicting request"}, status_code=status.HTTP_409_CONFLICT)


async def _data(_: Request, exc: Exception) -> JSONResponse:
    msg = str(getattr(exc, "orig", exc)).splitlines()[0][:200]
    return JSONResponse({"detail": [{"loc": ["body"], "msg": f"value cannot be stored: {msg}",
                                     "type": "value_error"}]}, status_code=422)


async def _db_down(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable", extra={"error": str(exc)[:200]})
    return JSONResponse({"detail": "database unavailable"}, status_code=503, headers={"Retry-After": "2"})


async def _limit(_: Request, exc: Exception) -> JSONResponse:
    from service.api.repo import LimitExceeded

    assert isinstance(exc, LimitExceeded)
    return JSONResponse({"detail": str(exc)}, status_code=429, headers={"Retry-After": str(exc.retry_after)})


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse({"detail": "internal error"}, status_code=500)


def install_handlers(app: FastAPI) -> None:
    from service.api.repo import LimitExceeded

    app.add_exception_handler(LimitExceeded, _limit)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(sa_exc.IntegrityError, _integrity)
    app.add_exception_handler(sa_exc.DataError, _data)
    app.add_exception_handler(sa_exc.OperationalError, _db_down)
    app.add_exception_handler(sa_exc.InterfaceError, _db_down)
    app.add_exception_handler(Exception, _unexpected)


class BodyLimit:
    """Pure ASGI middleware: buffer a request body up to ``max_bytes``; above that answer 413.
    Paths under ``exempt`` (uploads, which stream to disk with their own limit) pass through."""

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS")
                or (self.exempt and scope["method"] == "PUT" and scope["path"].startswith(self.exempt))):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _send_json(send, 400, {"detail": "invalid Content-Length"})
                return
            if size > self.max_bytes:
                await _send_json(send, 413, {"detail": f"request body over {self.max_bytes} bytes"})
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await _send_json(send, 413, {"detail": f"request body over {self.max_bytes} bytes"})
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_json(send: Send, code: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class AllowHeader:
    """Pure ASGI middleware: a 405 lists in ``Allow`` every method the path supports (Starlette
    names only the methods of the first route that matched the path)."""

    def __init__(self, app: ASGIApp, router_app: FastAPI) -> None:
        self.app = app
        self.router_app = router_app

    def _allowed(self, path: str) -> str:
        methods: set[str] = set()
        for route in self.router_app.router.routes:
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                methods |= set(getattr(route, "methods", None) or ())
        methods.discard("HEAD")
        return ", ".join(sorted(methods))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def fixed(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                headers.append((b"allow", self._allowed(scope["path"]).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, fixed)
