"""The environment of processes Orthoplex starts for Ray (raylets, and so every rank process):
the service's secrets are left out. In local mode the rank processes would otherwise inherit the
service's environment, admin token and database URL included, and a job could read them from
``/proc/self/environ``.

``minimal_env(base)`` drops every variable whose name marks a secret (:data:`SECRET`: tokens,
passwords, keys, credentials, database URLs), keeping what Ray, Python and torch need.
``without_secrets()`` applies it to ``os.environ`` for the duration of a block (for ``ray.init``
starting a local cluster, whose raylet copies ``os.environ``). ``RAY_AUTH_MODE`` is never set here:
an operator's setting is kept as is. The object store's credentials (:data:`STORAGE`) are kept: the
ranks write checkpoints there themselves (docs/storage.md).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: names of variables that carry secrets (matched case-insensitively anywhere in the name)
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|DATABASE_URL|DSN|_KEY$|^PG", re.I)
#: Ray's own auth token must reach the raylets when the operator turned token auth on
#: the object store's credentials: ranks read and write checkpoints under ``s3://`` storage themselves
STORAGE = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                     "GOOGLE_APPLICATION_CREDENTIALS"})
KEEP = frozenset({"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", *STORAGE})
_LOCK = threading.Lock()


def minimal_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) without the secret-carrying variables."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if k in KEEP or not SECRET.search(k)}


@contextmanager
def without_secrets() -> Iterator[None]:
    """Remove the secret variables from ``os.environ`` inside the block, restore them after."""
    with _LOCK:
        removed = {k: v for k, v in os.environ.items() if k not in KEEP and SECRET.search(k)}
        for k in removed:
            del os.environ[k]
        try:
            yield
        finally:
            os.environ.update(removed)
