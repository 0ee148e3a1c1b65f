"""The SDK's typed errors: each keeps the server's status, message and (for a 422) the field.

``OrthoplexError`` is the base of all. An HTTP error maps by its status: 400, 413 and 422 are
:class:`Invalid` (the field named as ``model.hf``, ``max_gpus``: the path in the request body or
the path parameter), 401 and 403 :class:`Unauthorized`, 404 :class:`NotFound`, 409
:class:`Conflict`, 429 :class:`RateLimited` (``retry_after`` seconds), 502/503/504 and a service
that cannot be reached :class:`ServiceUnavailable`, any other 5xx :class:`ServerError`.
:class:`JobFailed` and :class:`WaitTimeout` are what :meth:`orthoplex.Client.wait` raises.
"""

from __future__ import annotations

from typing import Any


class OrthoplexError(Exception):
    """Base of every SDK error. ``status`` is the HTTP status of the server's answer (None when
    the client found the problem before sending, or no answer came)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return f"{self.status} {self.message}" if self.status is not None else self.message


class Invalid(OrthoplexError):
    """The request was refused as invalid (422, 400, 413). ``field`` names the first offending
    field as the API reports it (``max_gpus``, ``model.hf``, ``path``; ``None`` when the whole
    body is at fault); ``errors`` holds every ``(field, message)`` pair."""


    def __init__(self, field: str | None, message: str, status: int | None = None,
                 errors: list[tuple[str | None, str]] | None = None) -> None:
        self.field = field
        self.errors = errors if errors is not None else [(field, message)]
        self.text = "; ".join(f"{f}: {m}" if f else m for f, m in self.errors)
        super().__init__(message, status)

    def __str__(self) -> str:
        return f"{self.status} {self.text}" if self.status is not None else self.text


class Unauthorized(OrthoplexError):
    """A missing, invalid, revoked or expired token (401), or one that may not use the call (403)."""



class NotFound(OrthoplexError):
    """No such job, file, tenant or token (or it belongs to another tenant)."""



class Conflict(OrthoplexError):
    """The call conflicts with the object's state: cancelling an ended job, a tenant name in use,
    an ``Idempotency-Key`` used before for another spec."""



class RateLimited(OrthoplexError):
    """Over the tenant's submission rate, job limit or open-stream limit. ``retry_after``: seconds."""


    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class ServiceUnavailable(OrthoplexError):
    """The service could not be reached, or answered 502/503/504, after the client's retries."""


    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class ServerError(OrthoplexError):
    """The service failed (a 5xx other than 502/503/504)."""



class JobFailed(OrthoplexError):
    """The job :meth:`~orthoplex.Client.wait` waited for ended without succeeding (FAILED or
    CANCELLED); ``job`` is its final state, ``reason`` the server's reason."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.state: str = job.state
        self.reason: str = job.reason
        super().__init__(f"job {job.id} ended {job.state}: {job.reason}".rstrip(": "))


class WaitTimeout(OrthoplexError, TimeoutError):
    """:meth:`~orthoplex.Client.wait` gave up after its ``timeout``; ``job`` is the job as last seen."""

    def __init__(self, job: Any, timeout: float) -> None:
        self.job = job
        super().__init__(f"job {job.id} still {job.state} after {timeout:g} s")
