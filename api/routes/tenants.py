"""`GET /v1/tenants`: the tenants the presented API key may use (the audit console's tenant picker).

Answered from the key alone (`settings.api_keys`), no store asked: it lists exactly what
`check_tenant` lets this key name, so a client never has to guess a tenant and collect 403s.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import TenantsDep
from api.routes._json import json_response
from api.schemas import TenantsResponse
from projections import shapes

router = APIRouter(tags=["tenants"])


@router.get("/tenants", response_model=TenantsResponse)
async def tenants(allowed: TenantsDep) -> Response:
    """The tenants this API key may use, sorted."""
    return json_response(shapes.TenantsResponse(tenants=sorted(allowed)))
