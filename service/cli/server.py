"""``orthoplex serve`` and ``orthoplex admin create-tenant|create-token``.

``serve`` brings the schema to the newest migration, starts the controller loop in the background
(``service.controller.runner.run_in_background``, when that module is there; ``--no-controller``
to run the API alone), and serves the API with uvicorn. The ``admin`` commands talk to the
database directly (``ORTHOPLEX_DATABASE_URL`` or ``--database-url``) and print a token's secret
once. Exit codes: 0 done, 1 refused (e.g. the tenant exists), 2 bad input.
"""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import typer

admin_app = typer.Typer(help="Administration with direct database access.", no_args_is_help=True)


def _db_url(database_url: str | None) -> str:
    from service.settings import get_settings

    return database_url or get_settings().database_url


def _start_controller(settings: Any) -> Any:
    if importlib.util.find_spec("service.controller.runner") is None:
        typer.echo("serve: no controller in this build; serving the API only", err=True)
        return None
    from service.controller import runner

    return runner.run_in_background(settings)


#: ``--local-cluster`` limits: a laptop-sized cluster of simulated nodes (CPU torch underneath).
LOCAL_CLUSTER_MAX_NODES = 16
LOCAL_CLUSTER_MAX_GPUS = 16


def parse_cluster_shape(value: str) -> tuple[int, int]:
    """``"3x4"`` -> (3 nodes, 4 GPUs each); raises ``typer.BadParameter`` naming the option."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
    if m is None:
        raise typer.BadParameter(f"expected NODESxGPUS such as 3x4, got {value!r}", param_hint="--local-cluster")
    nodes, gpus = int(m.group(1)), int(m.group(2))
    if not (1 <= nodes <= LOCAL_CLUSTER_MAX_NODES and 1 <= gpus <= LOCAL_CLUSTER_MAX_GPUS):
        raise typer.BadParameter(
            f"nodes must be 1..{LOCAL_CLUSTER_MAX_NODES} and GPUs per node 1..{LOCAL_CLUSTER_MAX_GPUS}, got {value!r}",
            param_hint="--local-cluster",
        )
    return nodes, gpus


def serve(
    host: str | None = typer.Option(None, help="Interface to bind (default: ORTHOPLEX_HOST)."),
    port: int | None = typer.Option(None, min=1, max=65535, help="Port (default: ORTHOPLEX_PORT)."),
    controller: bool = typer.Option(True, "--controller/--no-controller", help="Run the controller loop too."),
    local_cluster: str | None = typer.Option(
        None, "--local-cluster", metavar="NODESxGPUS",
        help="Start a local Ray cluster of NODES simulated nodes with GPUS declared GPUs each (e.g. 3x4; "
             "CPU torch underneath) for this service, and stop it on exit. For trying Orthoplex on one machine.",
    ),
) -> None:
    """Migrate the database to the newest schema, then serve the API (and run the controller)."""
    import os

    import uvicorn

    from service.api.app import create_app
    from service.db import migrate
    from service.log import get_logger
    from service.settings import get_settings

    log = get_logger("service.cli.server")
    shape = parse_cluster_shape(local_cluster) if local_cluster is not None else None
    settings = get_settings()
    if shape is not None and settings.ray_address:
        typer.echo("error: --local-cluster: ORTHOPLEX_RAY_ADDRESS is set too; use one or the other", err=True)
        raise typer.Exit(2)
    migrate.upgrade(settings.database_url)
    log.info("schema at head", extra={"revision": migrate.current(settings.database_url)})
    cluster = None
    if shape is not None:
        from workers.testbed.local_cluster import InProcessCluster

        cluster = InProcessCluster(nodes=shape[0], gpus_per_node=shape[1]).start()
        os.environ["ORTHOPLEX_RAY_ADDRESS"] = cluster.address
        get_settings.cache_clear()
        settings = get_settings()
        log.info("local cluster up", extra={"nodes": shape[0], "gpus_per_node": shape[1], "address": cluster.address})
    handle = _start_controller(settings) if controller else None
    try:
        uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port,
                    log_level=settings.log_level.lower(), access_log=False, log_config=None,
                    timeout_graceful_shutdown=5)
    finally:
        if handle is not None:
            handle.stop()
        if cluster is not None:
            cluster.shutdown()
            log.info("local cluster stopped")


@admin_app.command("create-tenant")
def create_tenant(
    name: str = typer.Argument(..., help="Tenant name (lowercase letters, digits, . _ -)."),
    quota: int = typer.Option(0, "--quota", min=0, help="Guaranteed GPUs."),
    weight: float = typer.Option(1.0, "--weight", min=0.001, help="Fair-share weight."),
    max_jobs: int = typer.Option(100, "--max-jobs", min=1, help="Most unfinished jobs at once."),
    rate: int = typer.Option(60, "--rate", min=1, help="Job submissions per minute."),
    database_url: str | None = typer.Option(None, "--database-url", help="Default: ORTHOPLEX_DATABASE_URL."),
    as_json: bool = typer.Option(False, "--json", help="Print the tenant as JSON."),
) -> None:
    """Create a tenant (prints its id)."""
    import sqlalchemy as sa
    from pydantic import ValidationError

    from service.api.schemas import TenantCreate
    from service.db import migrate
    from service.db.models import Tenant
    from service.db.session import make_engine, make_sessionmaker

    try:
        body = TenantCreate(name=name, gpu_quota=quota, weight=weight, max_jobs=max_jobs, submit_per_minute=rate)
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(2) from None
    url = _db_url(database_url)
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as s:
            if s.scalar(sa.select(Tenant.id).where(Tenant.name == name)) is not None:
                typer.echo(f"error: tenant {name!r} exists", err=True)
                raise typer.Exit(1)
            tenant = Tenant(**body.model_dump())
            s.add(tenant)
            s.commit()
            if as_json:
                typer.echo(json.dumps({"id": tenant.id, "name": tenant.name, "gpu_quota": tenant.gpu_quota,
                                       "weight": tenant.weight, "max_jobs": tenant.max_jobs,
                                       "submit_per_minute": tenant.submit_per_minute}))
            else:
                typer.echo(f"tenant {tenant.name} id={tenant.id} quota={tenant.gpu_quota} weight={tenant.weight:g}")
    finally:
        engine.dispose()


@admin_app.command("create-token")
def create_token(
    tenant: str = typer.Argument(..., help="Tenant name or id."),
    name: str = typer.Option("cli", "--name", help="A label for the token."),
    expires_days: int = typer.Option(90, "--expires-days", min=0, help="Days until it expires; 0 = never."),
    database_url: str | None = typer.Option(None, "--database-url", help="Default: ORTHOPLEX_DATABASE_URL."),
    as_json: bool = typer.Option(False, "--json", help="Print the token (secret included) as JSON."),
) -> None:
    """Create an API token for a tenant and print the secret (shown this once only)."""
    import datetime as dt

    import sqlalchemy as sa

    from service.api.security import new_token
    from service.db import migrate
    from service.db.models import ApiToken, Tenant, utcnow
    from service.db.session import make_engine, make_sessionmaker

    url = _db_url(database_url)
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as s:
            cond = Tenant.name == tenant
            if tenant.isdigit():
                cond = sa.or_(cond, Tenant.id == int(tenant))
            row = s.scalars(sa.select(Tenant).where(cond).order_by(Tenant.id)).first()
            if row is None:
                typer.echo(f"error: no tenant {tenant!r}", err=True)
                raise typer.Exit(1)
            secret, prefix, digest = new_token()
            expires = utcnow() + dt.timedelta(days=expires_days) if expires_days else None
            s.add(ApiToken(tenant_id=row.id, name=name[:64], prefix=prefix, token_hash=digest, expires_at=expires))
            s.commit()
        if as_json:
            typer.echo(json.dumps({"token": secret, "tenant": row.name, "tenant_id": row.id, "prefix": prefix,
                                   "expires_at": expires.isoformat() if expires else None}))
            return
        typer.echo(secret)
        typer.echo(f"token for tenant {row.name} (prefix {prefix}, "
                   f"{'expires ' + expires.date().isoformat() if expires else 'never expires'}); "
                   "it is not shown again", err=True)
    finally:
        engine.dispose()


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``admin`` to ``app``."""
    app.command("serve")(serve)
    app.add_typer(admin_app, name="admin")
