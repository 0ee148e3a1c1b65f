"""Ray token authentication (Ray >= 2.52, ``RAY_AUTH_MODE=token``) for every cluster Orthoplex starts
and every process that connects to one.

How Ray 2.60 takes it (``ray/_private/authentication``, docs.ray.io "Ray token authentication"):
``RAY_AUTH_MODE=token`` on every node and client turns it on; the token comes from ``RAY_AUTH_TOKEN``
(the value), else ``RAY_AUTH_TOKEN_PATH`` (a file; unreadable or empty aborts), else
``~/.ray/auth_token``. ``ray start``, ``ray.init``, ``ray.cluster_utils.Cluster``, the job submission
client and the Ray client read the same variables, and the processes a raylet spawns (the supervisor,
every rank) inherit them. Orthoplex always passes the file (``RAY_AUTH_TOKEN_PATH``), never the value,
so the token is in no command line, no environment listing and no log line.

Mechanism only: a token file (fresh per cluster, ``0600``), the environment that uses it, and a probe
that asks a cluster's GCS for its nodes *without* a token (an open cluster answers; an authenticating
one refuses with ``UNAUTHENTICATED``). Whether an open cluster is acceptable is the service's decision.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path

MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
#: the GCS method the probe calls: any GCS answers it, and an empty request is a valid one
PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"


class OpenClusterError(RuntimeError):
    """The cluster answered a client that sent no token."""


def new_token_file(path: Path) -> Path:
    """Write a fresh 256-bit token to ``path`` (created ``0600``; an old file there is replaced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.replace(tmp, path)
    return path


def private_token_file(prefix: str = "orthoplex-ray-") -> Path:
    """A fresh token in a new private (``0700``) temp directory: for clusters that live as long as
    their process (tests, ``serve --local-cluster``, the demo, ``orthoplex run``)."""
    return new_token_file(Path(tempfile.mkdtemp(prefix=prefix)) / "ray_token")


def read_token(path: Path) -> str:
    """The token in ``path`` (stripped); raises ``OSError`` / ``ValueError`` when unreadable or empty."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"the Ray token file {path} is empty")
    return token


def token_env(path: Path, env: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Set token auth with the token in ``path`` on ``env`` (default ``os.environ``); returns it. A
    ``RAY_AUTH_TOKEN`` value there is dropped: it would win over the file."""
    env = os.environ if env is None else env
    env[MODE] = "token"
    env[TOKEN_PATH] = str(Path(path).resolve())
    env.pop(TOKEN, None)
    return env


def use_token_file(path: Path) -> None:
    """Make this process (and what it starts from now on) use token auth with ``path``; Ray's cached
    config and token are reloaded when Ray is already loaded here."""
    token_env(path)
    _reload_ray_auth()


def saved_env() -> dict[str, str | None]:
    """This process's Ray auth variables now, for :func:`restore_env`."""
    return {k: os.environ.get(k) for k in (MODE, TOKEN, TOKEN_PATH)}


def restore_env(saved: Mapping[str, str | None]) -> None:
    """Put back what :func:`saved_env` returned (and reload Ray's cached config)."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _reload_ray_auth()


def auth_enabled(env: Mapping[str, str] | None = None) -> bool:
    """``RAY_AUTH_MODE`` says token in ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    return env.get(MODE, "").lower() == "token"


def has_token_source(env: Mapping[str, str] | None = None) -> bool:
    """``env`` names a token (value or file) for Ray to send."""
    env = os.environ if env is None else env
    return bool(env.get(TOKEN) or env.get(TOKEN_PATH))


def _reload_ray_auth() -> None:
    import sys

    if "ray._raylet" not in sys.modules:
        return  # Ray reads the environment when it loads
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def probe_open(address: str, *, timeout_s: float = 10.0) -> bool:
    """True when the GCS at ``address`` (host:port) answers a request that carries no token (an open
    cluster); False when it refuses it as unauthenticated. Raises ``ConnectionError`` when nothing
    answers (down, wrong address)."""
    import grpc

    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary(PROBE_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return False
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ConnectionError(f"no Ray GCS answers at {address}: {exc.details()}") from None
            raise ConnectionError(f"the Ray GCS at {address} answered {code.name}: {exc.details()}") from None
        return True
    finally:
        channel.close()
