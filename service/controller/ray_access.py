"""Whether the service may use its Ray cluster, and with which token: the rule of issue 43.

A Ray cluster that answers a client without a token runs anybody's code as the service (with its
storage, every tenant's checkpoints and the database credentials in reach), so the service refuses
one unless the operator opted out (``ORTHOPLEX_ALLOW_INSECURE_RAY=1`` / ``serve --allow-insecure-ray``).
The token the service sends comes from, in order: ``ORTHOPLEX_RAY_TOKEN_FILE``; Ray's own
``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``; the token file of the cluster ``orthoplex cluster up``
recorded, when its address is ``ORTHOPLEX_RAY_ADDRESS``. The token itself is never logged or shown.
The probe and the token plumbing are mechanism (``workers.runtime.cluster.ray_auth``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from service.log import get_logger
from service.settings import Settings
from workers.runtime.cluster import ray_auth

log = get_logger(__name__)

FIX = ("start the cluster with token auth (RAY_AUTH_MODE=token and a token on every node: `orthoplex cluster up` "
       "does this; see docs/security.md, \"Ray and inter-node sockets\") and give the service its token "
       "(ORTHOPLEX_RAY_TOKEN_FILE), or opt out with --allow-insecure-ray / ORTHOPLEX_ALLOW_INSECURE_RAY=1")
INSECURE_WARNING = ("ORTHOPLEX_ALLOW_INSECURE_RAY is set: the service accepts a Ray cluster that answers without a "
                    "token; anyone who reaches its ports can run code as the service")


class OpenClusterRefused(RuntimeError):
    """The cluster answers without a token and the operator did not opt out."""


@dataclass(frozen=True)
class RayAccess:
    address: str
    auth: str  # "token" | "open (allowed)" | "unknown (unreachable)"


def token_file_for(settings: Settings) -> Path | None:
    """The token file the service uses for ``settings.ray_address`` (see the module doc), or None."""
    if settings.ray_token_file is not None:
        return Path(settings.ray_token_file)
    if ray_auth.has_token_source():
        return Path(os.environ[ray_auth.TOKEN_PATH]) if os.environ.get(ray_auth.TOKEN_PATH) else None
    from workers.testbed.cluster_up import read_record

    rec = read_record(settings.storage_path.parent)
    if rec and rec.get("address") == settings.ray_address and rec.get("token_file"):
        return Path(rec["token_file"])
    return None


def use_cluster_token(settings: Settings) -> bool:
    """Make this process send the cluster's token (True), or leave Ray's own settings as they are
    (False: none is known here; a ``RAY_AUTH_TOKEN`` value, if set, still applies)."""
    path = token_file_for(settings)
    if path is not None:
        ray_auth.use_token_file(path)
        return True
    if os.environ.get(ray_auth.TOKEN):
        os.environ[ray_auth.MODE] = "token"
        return True
    return False


def check_cluster(settings: Settings) -> RayAccess:
    """Ask ``settings.ray_address`` without a token: an authenticating cluster refuses (fine); an open
    one answers (``OpenClusterRefused``, unless opted out: then logged as a warning). Unreachable: the
    verdict waits for the connection (``connect_ray`` checks again before it connects)."""
    address = str(settings.ray_address)
    try:
        open_ = ray_auth.probe_open(address)
    except ConnectionError as exc:
        log.warning("the Ray cluster did not answer the auth check", extra={"address": address, "error": str(exc)})
        return RayAccess(address, "unknown (unreachable)")
    if not open_:
        return RayAccess(address, "token")
    if not settings.allow_insecure_ray:
        raise OpenClusterRefused(f"the Ray cluster at {address} answers without a token: anyone who reaches it "
                                 f"can run code as this service. Fix: {FIX}")
    log.warning("the Ray cluster answers without a token (allowed by ORTHOPLEX_ALLOW_INSECURE_RAY)",
                extra={"address": address})
    return RayAccess(address, "open (allowed)")
