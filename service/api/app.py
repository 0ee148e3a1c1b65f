"""The FastAPI application of the control plane: ``create_app(settings=None) -> FastAPI``.

The app owns one engine and sessionmaker (``app.state.engine`` / ``app.state.sessions``) for
``settings.database_url``; it does not migrate (``orthoplex serve`` does, before starting it).
Middleware, outermost first: latency histogram, security headers (``service.api.headers``), 1 MiB
body cap (413), full ``Allow`` on 405. ``/docs`` is Swagger UI served from this origin
(``service.api.docs``); ReDoc is not served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.api.attempts import AttemptLog
from service.api.config import ApiSettings
from service.api.data_ledger import Ledger
from service.api.docs import mount as mount_docs
from service.api.errors import AllowHeader, BodyLimit, install_handlers
from service.api.headers import SecurityHeaders
from service.api.metrics import LatencyMiddleware, make_registry
from service.api.repo import RATE_WINDOW_S
from service.api.routes import admin, artifacts, dashboard, data, jobs, nodes, system
from service.api.sse import StreamSlots
from service.db.session import make_engine, make_sessionmaker
from service.settings import Settings, get_settings
from service.ui import mount as mount_ui

DESCRIPTION = """\
Orthoplex control plane: submit declarative training jobs, follow them, cancel them.

Authenticate with `Authorization: Bearer <token>`: a tenant token (created by the admin) for
`/v1/jobs` and `/v1/plans`, the admin token for `/v1/tenants` and `/v1/tokens`. Errors: 401
without a valid token, 404 for objects of other tenants, 409 for illegal state changes, 413 for
bodies over 1 MiB, 422 naming the invalid field, 429 with `Retry-After` over the submission rate.
"""


def create_app(settings: Settings | None = None, api_settings: ApiSettings | None = None) -> FastAPI:
    """A ready-to-serve app bound to ``settings.database_url`` (schema must be migrated)."""
    settings = settings or get_settings()
    api = api_settings or ApiSettings()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(title="Orthoplex", version="1.0.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None,
                  openapi_tags=[{"name": "jobs", "description": "a tenant's jobs"},
                                {"name": "admin", "description": "tenants, tokens and node drains (admin token)"},
                                {"name": "system", "description": "health, metrics, planning, cluster"},
                                {"name": "dashboard", "description": "views of the web dashboard (/ui/)"}])
    app.state.settings = settings
    app.state.api = api
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.streams = StreamSlots(api.sse_max_per_tenant)
    app.state.attempts = AttemptLog(RATE_WINDOW_S)
    app.state.data_ledger = Ledger(settings.tenant_quota_bytes, settings.tenant_quota_entries,
                                   settings.upload_max_concurrent)
    registry, tenant_registry, latency = make_registry(sessions, api.metrics_cache_s)
    app.state.registry = registry
    app.state.tenant_registry = tenant_registry
    install_handlers(app)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(admin.router)
    app.include_router(data.router)
    app.include_router(system.router)
    app.include_router(nodes.router)
    app.include_router(dashboard.router)
    mount_ui(app)
    mount_docs(app)
    app.add_middleware(AllowHeader, router_app=app)
    app.add_middleware(BodyLimit, max_bytes=api.max_body_bytes, exempt=("/v1/data/",))
    app.add_middleware(SecurityHeaders)
    app.add_middleware(LatencyMiddleware, histogram=latency)
    return app
