"""`GET /v1/subjects/{subject}/facts` (profile, as of valid time, as known at) and `.../events` (audit replay).

`as_of`, `known_at`, `from`, `to` are RFC 3339 times with an offset; anything else is 422 naming the field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import AwareDatetime

from api.deps import TenantsDep, check_tenant
from api.routes._json import json_response
from projections.postgres.queries import current_facts, subject_events

router = APIRouter(prefix="/subjects", tags=["subjects"])

Tenant = Annotated[str, Query(min_length=1, max_length=128, description="the tenant to read (must be the key's)")]
Time = Annotated[AwareDatetime | None, Query(description="RFC 3339 time with a timezone offset")]


@router.get("/{subject:path}/facts")
async def facts(
    request: Request,
    subject: str,
    tenant: Tenant,
    tenants: TenantsDep,
    as_of: Time = None,
    known_at: Time = None,
) -> Response:
    """The subject's facts at valid time `as_of` (default now), optionally only from events observed by `known_at`."""
    check_tenant(tenant, tenants)
    t = as_of or datetime.now(UTC)
    async with request.app.state.pg.connection() as conn:
        rows = await current_facts(conn, tenant, subject, t, known_at)
    return json_response({"tenant": tenant, "subject": subject, "as_of": t.isoformat(), "facts": rows})


@router.get("/{subject:path}/events")
async def events(
    request: Request,
    subject: str,
    tenant: Tenant,
    tenants: TenantsDep,
    from_: Annotated[AwareDatetime | None, Query(alias="from", description="observed_at >= from")] = None,
    to: Annotated[AwareDatetime | None, Query(description="observed_at < to")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> Response:
    """The subject's events in ledger order (partition, offset), each with its partition and offset."""
    check_tenant(tenant, tenants)
    if from_ is not None and to is not None and to < from_:
        raise HTTPException(422, detail=[{"field": "to", "code": "invalid_range", "message": "to is before from"}])
    async with request.app.state.pg.connection() as conn:
        rows = await subject_events(conn, tenant, subject, from_, to, limit)
    return json_response({"tenant": tenant, "subject": subject, "events": rows})
