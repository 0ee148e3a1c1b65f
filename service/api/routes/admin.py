"""Admin routes (the admin token of ``ORTHOPLEX_ADMIN_TOKEN`` only): tenants and their tokens."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from service.api.deps import Admin, Db
from service.api.errors import responses
from service.api.schemas import (
    TenantCreate,
    TenantList,
    TenantPublic,
    TenantUpdate,
    TokenCreate,
    TokenCreated,
)
from service.api.security import new_token
from service.db.models import ApiToken, Tenant, utcnow

router = APIRouter(tags=["admin"])

TenantId = Annotated[int, Path(ge=1, le=2**31 - 1, description="tenant id")]
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="token id")]

_TENANT_LINKS = {
    "GetTenant": {"operationId": "get_tenant", "parameters": {"tenant_id": "$response.body#/id"}},
    "UpdateTenant": {"operationId": "update_tenant", "parameters": {"tenant_id": "$response.body#/id"}},
    "CreateToken": {"operationId": "create_token", "parameters": {"tenant_id": "$response.body#/id"}},
}


def _tenant(db: Db, tenant_id: int) -> Tenant:
    tenant = db.get(Tenant, tenant_id)
    if tenant is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "tenant not found")
    return tenant


@router.post("/v1/tenants", status_code=201, response_model=TenantPublic, operation_id="create_tenant",
             summary="Create a tenant",
             responses={201: {"description": "created", "links": _TENANT_LINKS}, **responses(400, 401, 403, 409, 413)})
def create_tenant(body: TenantCreate, _: Admin, db: Db) -> TenantPublic:
    """409 when the name is taken."""
    if db.scalar(sa.select(Tenant.id).where(Tenant.name == body.name)) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, "a tenant with this name exists")
    tenant = Tenant(**body.model_dump(), created_at=utcnow())
    db.add(tenant)
    db.commit()
    return TenantPublic.model_validate(tenant)


@router.get("/v1/tenants", response_model=TenantList, operation_id="list_tenants", summary="List tenants",
            responses=responses(401, 403))
def list_tenants(
    _: Admin,
    db: Db,
    cursor: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
) -> TenantList:
    q = sa.select(Tenant).order_by(Tenant.id).limit(limit)
    if cursor is not None:
        q = q.where(Tenant.id > cursor)
    rows = db.scalars(q).all()
    return TenantList(items=[TenantPublic.model_validate(t) for t in rows],
                      next_cursor=rows[-1].id if len(rows) == limit else None)


@router.get("/v1/tenants/{tenant_id}", response_model=TenantPublic, operation_id="get_tenant",
            summary="Get a tenant", responses=responses(401, 403, 404))
def get_tenant(tenant_id: TenantId, _: Admin, db: Db) -> TenantPublic:
    return TenantPublic.model_validate(_tenant(db, tenant_id))


@router.patch("/v1/tenants/{tenant_id}", response_model=TenantPublic, operation_id="update_tenant",
              summary="Change a tenant's quota, weight or limits", responses=responses(400, 401, 403, 404, 413))
def update_tenant(tenant_id: TenantId, body: TenantUpdate, _: Admin, db: Db) -> TenantPublic:
    tenant = _tenant(db, tenant_id)
    for key, value in body.model_dump(exclude_none=True).items():
        setattr(tenant, key, value)
    db.commit()
    return TenantPublic.model_validate(tenant)


@router.post("/v1/tenants/{tenant_id}/tokens", status_code=201, response_model=TokenCreated,
             operation_id="create_token", summary="Create an API token for a tenant (the secret is shown once)",
             responses={
                 201: {"description": "created",
                       "links": {"RevokeToken": {"operationId": "revoke_token",
                                                 "parameters": {"token_id": "$response.body#/id"}}}},
                 **responses(400, 401, 403, 404, 413),
             })
def create_token(tenant_id: TenantId, body: TokenCreate, _: Admin, db: Db) -> TokenCreated:
    _tenant(db, tenant_id)
    secret, prefix, digest = new_token()
    now = utcnow()
    expires = now + dt.timedelta(days=body.expires_in_days) if body.expires_in_days else None
    tok = ApiToken(tenant_id=tenant_id, name=body.name, prefix=prefix, token_hash=digest, created_at=now,
                   expires_at=expires)
    db.add(tok)
    db.commit()
    return TokenCreated(id=tok.id, tenant_id=tenant_id, name=tok.name, prefix=prefix, token=secret,
                        created_at=tok.created_at, expires_at=tok.expires_at)


@router.delete("/v1/tokens/{token_id}", status_code=204, operation_id="revoke_token", summary="Revoke a token",
               response_class=Response, responses=responses(401, 403, 404))
def revoke_token(token_id: TokenId, _: Admin, db: Db) -> Response:
    """The token stops working at once; 404 when there is no such token or it is already revoked."""
    res = db.execute(
        sa.update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    db.commit()
    if res.rowcount != 1:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "token not found")
    return Response(status_code=204)
