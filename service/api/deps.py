"""Request dependencies: the database session and who is calling.

The tenant comes from the bearer token only (never from the path or the body). A tenant token is
looked up by its sha256; revoked or expired tokens are 401 like unknown ones. The admin token
(``ORTHOPLEX_ADMIN_TOKEN``) is compared in constant time and has no tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.api.security import hash_token, is_admin_token
from service.db.models import ApiToken, Tenant, utcnow

bearer = HTTPBearer(auto_error=False, scheme_name="bearer", description="`Authorization: Bearer <token>`")


def get_db(request: Request) -> Iterator[Session]:
    """A session per request handler (rolled back if the handler did not commit). It is closed when
    the handler returns (``scope="function"``), before the response is sent: no transaction stays
    open while a response streams (on SQLite every transaction holds the write lock)."""
    with request.app.state.sessions() as session:
        yield session


Db = Annotated[Session, Depends(get_db, scope="function")]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin (``tenant is None``) or a tenant."""

    tenant: Tenant | None
    token_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def _unauthorized(msg: str = "missing or invalid bearer token") -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, msg, headers={"WWW-Authenticate": "Bearer"})


def get_principal(
    request: Request,
    db: Db,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if creds is None or not creds.credentials or len(creds.credentials) > 256:
        raise _unauthorized()
    token = creds.credentials
    if is_admin_token(token, request.app.state.settings.admin_token):
        return Principal(tenant=None)
    row = db.execute(
        sa.select(ApiToken, Tenant)
        .join(Tenant, Tenant.id == ApiToken.tenant_id)
        .where(ApiToken.token_hash == hash_token(token))
    ).one_or_none()
    if row is None:
        raise _unauthorized()
    tok, tenant = row
    if not token_valid(tok):
        raise _unauthorized("token revoked or expired")
    token_id = tok.id
    db.expunge(tenant)
    db.rollback()  # end the read: the handler opens its own short transactions
    return Principal(tenant=tenant, token_id=token_id)


def token_valid(tok: ApiToken) -> bool:
    """Not revoked and not expired (the one rule, also used mid-stream by ``service.api.sse``)."""
    return tok.revoked_at is None and (tok.expires_at is None or tok.expires_at > utcnow())


def require_tenant(principal: Annotated[Principal, Depends(get_principal)]) -> Tenant:
    if principal.tenant is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "the admin token has no tenant; use a tenant token")
    return principal.tenant


def require_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "admin token required")
    return principal


CurrentTenant = Annotated[Tenant, Depends(require_tenant)]
AnyPrincipal = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[Principal, Depends(require_admin)]
