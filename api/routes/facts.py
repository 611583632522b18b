"""`GET /v1/facts/{memory_id}/history`: a fact's version chain, oldest first (404 if the tenant has no such fact)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.deps import PoolDep, Storable, TenantQuery, TenantsDep, check_tenant
from api.errors import ApiError
from api.routes._json import json_response
from api.schemas import HistoryResponse
from projections.postgres.queries import fact_history

router = APIRouter(prefix="/facts", tags=["facts"])


@router.get("/{memory_id}/history", response_model=HistoryResponse)
async def history(
    pool: PoolDep,
    memory_id: Annotated[Storable, Path(min_length=1, max_length=256)],
    tenant: TenantQuery,
    tenants: TenantsDep,
) -> Response:
    check_tenant(tenant, tenants)
    async with pool.connection() as conn:
        versions = await fact_history(conn, tenant, memory_id)
    if not versions:
        raise ApiError(404, "not_found", f"no fact {memory_id!r} in tenant {tenant!r}", "memory_id")
    return json_response({"memory_id": memory_id, "tenant": tenant, "versions": versions})
