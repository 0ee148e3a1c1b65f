"""Run the controller: in a background thread of ``orthoplex serve``, or alone (``python -m
service.controller``).

``run_in_background(settings)`` connects to Ray (``settings.ray_address``; unset = a local Ray), makes
an engine for ``settings.database_url``, and runs :meth:`Controller.run` in a daemon thread. It
returns a :class:`ControllerHandle` whose ``stop()`` ends the loop and releases the lease, so another
replica takes over at once. Any number of replicas may run it: only the lease holder acts.

Knobs not in :class:`~service.settings.Settings` come from the environment:
``ORTHOPLEX_CONTROLLER_TICK_S`` (1.0), ``ORTHOPLEX_CONTROLLER_LEASE_TTL_S`` (10),
``ORTHOPLEX_CONTROLLER_MAX_ATTEMPTS`` (3), ``ORTHOPLEX_CONTROLLER_CANCEL_GRACE_S`` (30),
``ORTHOPLEX_CONTROLLER_HOLDER`` (a random id), ``ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES`` (JSON merged
into every supervisor spec, e.g. shorter runtime timeouts in tests).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

import sqlalchemy as sa

from service.controller.context import ControllerConfig
from service.controller.loop import Controller
from service.db.session import make_engine
from service.log import get_logger
from service.settings import Settings, get_settings
from workers.runtime.cluster.rank_env import without_secrets

log = get_logger("service.controller.runner")


def config_from_env(settings: Settings) -> ControllerConfig:
    """The controller's knobs: ``settings.storage_path`` plus the ``ORTHOPLEX_CONTROLLER_*`` variables."""
    env = os.environ
    overrides = json.loads(env.get("ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES") or "{}")
    if not isinstance(overrides, dict):
        raise ValueError("ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES must be a JSON object")
    return ControllerConfig(
        tick_s=float(env.get("ORTHOPLEX_CONTROLLER_TICK_S", 1.0)),
        lease_ttl_s=float(env.get("ORTHOPLEX_CONTROLLER_LEASE_TTL_S", 10.0)),
        max_attempts=int(env.get("ORTHOPLEX_CONTROLLER_MAX_ATTEMPTS", 3)),
        cancel_grace_s=float(env.get("ORTHOPLEX_CONTROLLER_CANCEL_GRACE_S", 30.0)),
        runtime_resizes=env.get("ORTHOPLEX_CONTROLLER_RESIZES", "1").strip().lower() in ("1", "true", "yes", "on"),
        storage_path=settings.storage_path,
        shared_data_roots=dict(settings.shared_data_roots),
        data_max_files=settings.data_max_files,
        data_max_bytes=settings.data_max_bytes,
        mlflow_tracking_uri=settings.mlflow_tracking_uri,
        spec_overrides=overrides,
    )


def connect_ray(settings: Settings) -> bool:
    """Connect this process to Ray (once); False, logged, when it cannot — the API keeps serving
    and the controller idles (an unavailable cluster view) until a later call succeeds."""
    import ray

    if ray.is_initialized():
        return True
    # an operator's RAY_AUTH_MODE is kept as set; unset, a local Ray started here listens on
    # 127.0.0.1 only (token auth: set RAY_AUTH_MODE=token, see docs/security.md)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    local = not settings.ray_address
    try:
        # a local Ray started here copies os.environ into its raylet (and so every rank process):
        # start it without the service's secrets; an operator's RAY_AUTH_MODE is kept as set
        with without_secrets():
            ray.init(
                address=settings.ray_address or "local",
                namespace=settings.ray_namespace,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **({"_node_ip_address": "127.0.0.1"} if local else {}),
            )
    except Exception as exc:
        log.warning("could not connect to Ray", extra={"address": settings.ray_address, "error": repr(exc)})
        return False
    warn_if_no_gpus(settings)
    return True


NO_GPUS_HINT = (
    "the Ray cluster declares no GPUs: every job will wait until nodes with GPUs join. On one machine, "
    "try `orthoplex serve --local-cluster 3x4` (simulated nodes with declared GPUs); on a real cluster, "
    "start the nodes with `ray start --num-gpus=N` and point ORTHOPLEX_RAY_ADDRESS at it"
)


def warn_if_no_gpus(settings: Settings) -> bool:
    """Say at start, in the service log, when the cluster has no GPUs; True when it has some."""
    import ray

    try:
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
    except Exception as exc:  # the cluster answers later; the controller's view says so then
        log.debug("cluster resources unknown", extra={"error": repr(exc)})
        return True
    if gpus <= 0:
        log.warning(NO_GPUS_HINT, extra={"address": settings.ray_address or "local"})
        return False
    log.info("Ray cluster connected", extra={"address": settings.ray_address or "local", "gpus": int(gpus)})
    return True


@dataclass
class ControllerHandle:
    """A controller running in a background thread; ``stop()`` ends it (idempotent)."""

    controller: Controller
    thread: threading.Thread
    stop_event: threading.Event
    engine: sa.Engine

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout=timeout_s)
        self.engine.dispose()


def run_in_background(
    settings: Settings | None = None,
    config: ControllerConfig | None = None,
    *,
    connect: bool = True,
) -> ControllerHandle:
    """Start the controller loop in a daemon thread (see the module docstring)."""
    settings = settings or get_settings()
    config = config or config_from_env(settings)
    if connect:
        connect_ray(settings)
    engine = make_engine(settings.database_url)
    controller = Controller(
        engine,
        config,
        holder=os.environ.get("ORTHOPLEX_CONTROLLER_HOLDER") or None,
        connect=(lambda: connect_ray(settings)) if connect else None,
    )
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), name="orthoplex-controller", daemon=True)
    thread.start()
    log.info("controller started", extra={"holder": controller.lease.holder, "tick_s": config.tick_s})
    return ControllerHandle(controller, thread, stop, engine)


def main() -> None:
    """``python -m service.controller``: the controller alone, in the foreground, until SIGTERM/SIGINT."""
    import signal

    from service.log import configure_logging

    configure_logging()
    settings = get_settings()
    handle = run_in_background(settings)

    def _stop(signum: int, _frame: object) -> None:
        log.info("stopping controller", extra={"signal": signum})
        handle.stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while handle.alive:
        handle.thread.join(timeout=0.5)
    handle.engine.dispose()
