"""Structured logging for every part of Orthoplex.

``configure_logging()`` installs one handler on the root logger: human-readable lines on a
terminal (``console``) or one JSON object per line (``json``) for machines. Extra fields passed as
``logger.info("msg", extra={"job_id": 3})`` or through :func:`get_logger` bindings appear as keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg and every extra field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class ConsoleFormatter(logging.Formatter):
    """``12:00:01 INFO  service.api  message  key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")
        )
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<5} {record.name}  {record.getMessage()}"
        if extras:
            line += "  " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


#: Libraries that log every request or file lock at INFO: kept at WARNING unless asked for (``-v``).
CHATTY_LIBRARIES = ("httpx", "httpcore", "urllib3", "filelock", "asyncio", "multipart", "python_multipart",
                    "alembic.runtime.plugins")


def configure_logging(level: str | None = None, fmt: str | None = None, stream: Any = None,
                      verbosity: int = 0) -> None:
    """Install the Orthoplex handler on the root logger (idempotent).

    ``verbosity`` is the command line's ``-v`` count: 0 keeps :data:`CHATTY_LIBRARIES` at WARNING,
    1 lets them log at the chosen level, 2 or more sets every logger to DEBUG."""
    from service.settings import get_settings

    settings = get_settings()
    level = (level or settings.log_level).upper()
    fmt = fmt or settings.log_format
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_orthoplex", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._orthoplex = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root.addHandler(handler)
    root.setLevel("DEBUG" if verbosity >= 2 else level)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbosity >= 1 else logging.WARNING)


class BoundLogger(logging.LoggerAdapter):
    """A logger that adds fixed fields (job, attempt, rank, ...) to every record."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs

    def bind(self, **fields: Any) -> BoundLogger:
        return BoundLogger(self.logger, {**(self.extra or {}), **fields})


def get_logger(name: str, **fields: Any) -> BoundLogger:
    """A structured logger named ``name`` carrying ``fields`` on every record."""
    return BoundLogger(logging.getLogger(name), fields)
