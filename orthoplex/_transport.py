"""What the sync and async clients share: settings, error mapping, the retry policy, the
server-sent-event parser, and each REST call as a :class:`Call` (method, path, parameters and how
to read the answer). The clients only send the calls; one place holds every rule."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from orthoplex.errors import (
    Conflict,
    Invalid,
    NotFound,
    OrthoplexError,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)

T = TypeVar("T")

#: statuses a retry may cure (a restarting service, a proxy in front of it, the planner busy)
RETRY_STATUSES = frozenset({502, 503, 504})
USER_AGENT = "orthoplex-python"


@dataclass(frozen=True)
class Retry:
    """``attempts`` tries in all for a call that may be repeated; waits ``base * 2**n`` seconds
    between them (at most ``cap``; a server's ``Retry-After`` instead, also at most ``cap``)."""

    attempts: int = 4
    base: float = 0.25
    cap: float = 5.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return float(min(max(retry_after, 0.0), self.cap))
        return float(min(self.base * 2**attempt, self.cap) * random.uniform(0.75, 1.0))


def settings(url: str | None, token: str | None) -> tuple[str, str | None]:
    """The base URL and token: the arguments, else ``ORTHOPLEX_API_URL`` / ``ORTHOPLEX_API_TOKEN``
    (the variables the CLI reads), else the service's default address and no token."""
    from service.settings import Settings  # the one home of the default address

    base = url or os.environ.get("ORTHOPLEX_API_URL") or str(Settings.model_fields["api_url"].default)
    return base.rstrip("/"), token or os.environ.get("ORTHOPLEX_API_TOKEN") or None


def headers(token: str | None) -> dict[str, str]:
    out = {"User-Agent": USER_AGENT}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def field_name(loc: Any, tagged: bool = False) -> str | None:
    """A validation error's ``loc`` as the user wrote the field: ``["body", "model", "hf"]`` ->
    ``model.hf``; ``tagged`` drops the branch pydantic names in a tagged union (``model.hf.hf``)."""
    parts = [str(p) for p in (loc or ()) if p not in ("body", "query", "header")]
    if parts[:1] == ["path"] and len(parts) > 1:
        parts = parts[1:]
    if tagged and len(parts) > 1 and parts[0] == "model" and parts[1] in ("preset", "shape", "hf"):
        parts.pop(1)
    return ".".join(parts) or None


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def error(resp: httpx.Response) -> OrthoplexError:
    """The typed error of an HTTP answer of 400 or more (its body must have been read)."""
    code = resp.status_code
    try:
        detail: Any = resp.json().get("detail")
    except (ValueError, AttributeError):
        detail = (resp.text or "")[:300] or resp.reason_phrase
    if isinstance(detail, list):
        errs = [(field_name(e.get("loc")), str(e.get("msg"))) for e in detail if isinstance(e, dict)]
        errs = errs or [(None, "invalid request")]
        return Invalid(errs[0][0], errs[0][1], status=code, errors=errs)
    message = str(detail)
    if code in (400, 413, 422):
        return Invalid(None, message, status=code)
    if code in (401, 403):
        return Unauthorized(message, status=code)
    if code == 404:
        return NotFound(message, status=code)
    if code == 409:
        return Conflict(message, status=code)
    if code == 429:
        return RateLimited(message, retry_after=_retry_after(resp), status=code)
    if code in RETRY_STATUSES:
        return ServiceUnavailable(message, status=code, retry_after=_retry_after(resp))
    if code >= 500:
        return ServerError(message, status=code)
    return OrthoplexError(message, status=code)


def unreachable(url: str, exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(f"cannot reach {url}: {type(exc).__name__}")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One REST call: what to send and how to read a successful answer. ``idempotent``: the
    client may send it again after a connection error or a 502/503/504."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    idempotent: bool
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Frame:
    """One server-sent event: ``event`` (the event's type, or ``end``), its JSON ``data``."""

    event: str
    data: dict[str, Any]


class SSEParser:
    """Lines of a ``text/event-stream`` in, :class:`Frame` objects out (comments and keep-alives
    ignored)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        if line.startswith(":"):
            return None
        if line == "":
            if not self._data:
                self._event = ""
                return None
            frame = Frame(self._event or "message", json.loads("\n".join(self._data)))
            self._event, self._data = "", []
            return frame
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None
