"""Dependencies every route declares: settings, the PostgreSQL pool, the caller's tenants.

Tenancy: the caller presents an API key (`X-API-Key` header or `Authorization: Bearer`);
`settings.api_keys` binds each key to the tenants it may use. A request naming any other
tenant gets 403, whatever else it says.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from infra.settings import Settings


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def caller_tenants(
    settings: SettingsDep,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> frozenset[str]:
    """The tenants the presented API key may use; 401 without a known key."""
    key = x_api_key
    if key is None and authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    if not key:
        raise HTTPException(401, detail="missing API key: send X-API-Key or Authorization: Bearer")
    tenants = settings.api_keys.get(key)
    if tenants is None:
        raise HTTPException(401, detail="unknown API key")
    return frozenset(tenants)


TenantsDep = Annotated[frozenset[str], Depends(caller_tenants)]


def check_tenant(tenant: str, allowed: frozenset[str], field: str = "tenant") -> str:
    """Return tenant if the caller may use it, else 403 naming the field."""
    if tenant not in allowed:
        raise HTTPException(403, detail={"field": field, "message": f"this API key may not use tenant {tenant!r}"})
    return tenant
