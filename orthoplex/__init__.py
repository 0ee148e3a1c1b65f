"""Orthoplex's Python SDK: ``from orthoplex import Client``.

:class:`Client` (and :class:`AsyncClient`) speak the service's REST API with the API's own
pydantic models (:mod:`orthoplex.models`) and raise the typed errors of :mod:`orthoplex.errors`.
See ``docs/sdk.md``.
"""

from orthoplex import models
from orthoplex._transport import Retry
from orthoplex.aio import AsyncClient, AsyncEventStream
from orthoplex.client import Client, EventStream
from orthoplex.errors import (
    Conflict,
    Invalid,
    JobFailed,
    NotFound,
    OrthoplexError,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    WaitTimeout,
)
from orthoplex.models import Event, Job, JobSpec, Metric

__all__ = [
    "AsyncClient",
    "AsyncEventStream",
    "Client",
    "Conflict",
    "Event",
    "EventStream",
    "Invalid",
    "Job",
    "JobFailed",
    "JobSpec",
    "Metric",
    "NotFound",
    "OrthoplexError",
    "RateLimited",
    "Retry",
    "ServerError",
    "ServiceUnavailable",
    "Unauthorized",
    "WaitTimeout",
    "models",
]
