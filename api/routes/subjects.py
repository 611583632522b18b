"""`GET /v1/subjects/{subject}/facts` (profile, as of valid time, as known at) and `.../events` (audit replay).

`as_of`, `known_at`, `from`, `to` are strict RFC 3339 times (seconds, at most 6 fractional digits,
an offset, in range once the offset is applied: `producers.contract.Rfc3339`); anything else, a
Unix number included, is 422 naming the parameter. A subject may contain `/` (send it as is or as
`%2F`); a NUL anywhere is 422 `unstorable_text`. Every time in the answers (the facts' times and
`as_of`) is spelled by `producers.contract.rfc3339`: UTC, microseconds, `Z`, whatever offset the
request used.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api.deps import PoolDep, Storable, TenantQuery, TenantsDep, Time, check_tenant
from api.errors import ApiError
from api.routes._json import json_response
from api.schemas import EventsResponse, FactsResponse
from producers.contract import rfc3339
from projections.postgres.queries import current_facts, subject_events

router = APIRouter(prefix="/subjects", tags=["subjects"])

Subject = Annotated[Storable, Path(min_length=1, max_length=256, description="the subject (may contain /)")]
OptionalTime = Annotated[Time | None, Query(description="RFC 3339 time with seconds and an offset")]


@router.get("/{subject:path}/facts", response_model=FactsResponse)
async def facts(
    pool: PoolDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    as_of: OptionalTime = None,
    known_at: OptionalTime = None,
) -> Response:
    """The subject's facts at valid time `as_of` (default now), optionally only from events observed by `known_at`."""
    check_tenant(tenant, tenants)
    t = as_of or datetime.now(UTC)
    async with pool.connection() as conn:
        rows = await current_facts(conn, tenant, subject, t, known_at)
    return json_response({"tenant": tenant, "subject": subject, "as_of": rfc3339(t), "facts": rows})


@router.get("/{subject:path}/events", response_model=EventsResponse)
async def events(
    pool: PoolDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    from_: Annotated[Time | None, Query(alias="from", description="observed_at >= from (RFC 3339)")] = None,
    to: Annotated[Time | None, Query(description="observed_at < to (RFC 3339)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> Response:
    """The subject's events in ledger order (partition, offset), each with its partition and offset."""
    check_tenant(tenant, tenants)
    if from_ is not None and to is not None and to < from_:
        raise ApiError(422, "invalid_range", "to is before from", "to")
    async with pool.connection() as conn:
        rows = await subject_events(conn, tenant, subject, from_, to, limit)
    return json_response({"tenant": tenant, "subject": subject, "events": rows})
