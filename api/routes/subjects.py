"""`GET /v1/subjects/{subject}/facts` (profile, as of valid time, as known at) and `.../events` (audit replay).

`as_of`, `known_at`, `from`, `to` are strict RFC 3339 times (seconds, at most 6 fractional digits,
an offset, in range once the offset is applied: `producers.contract.Rfc3339`); anything else, a
Unix number included, is 422 naming the parameter. A subject may contain `/` (send it as is or as
`%2F`); a NUL anywhere is 422 `unstorable_text`. Every time in the answers (the facts' times and
`as_of`) is spelled by `producers.contract.rfc3339`: UTC, microseconds, `Z`, whatever offset the
request used.

The answers are `api.reads.subject_facts` and `api.reads.subject_log` (shared with the MCP `facts` tool).
`after` (a write's consistency token): answer once the projection has that write (api.consistency), else 503
`not_yet` naming `after`; the answer's `consistency` says which positions it reflects.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api import reads
from api.consistency import AfterQuery
from api.deps import ResourcesDep, Storable, TenantQuery, TenantsDep, Time
from api.requests import SUBJECT
from api.routes._json import json_response
from api.schemas import EventsResponse, FactsResponse

router = APIRouter(prefix="/subjects", tags=["subjects"])

Subject = Annotated[Storable, Path(**SUBJECT, description="the subject (may contain /)")]
OptionalTime = Annotated[Time | None, Query(description="RFC 3339 time with seconds and an offset")]


@router.get("/{subject:path}/facts", response_model=FactsResponse)
async def facts(
    res: ResourcesDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    as_of: OptionalTime = None,
    known_at: OptionalTime = None,
    after: AfterQuery = None,
) -> Response:
    """The subject's facts at valid time `as_of` (default now), optionally only from events observed by `known_at`."""
    return json_response(await reads.subject_facts(res, tenants, tenant, subject, as_of, known_at, after))


@router.get("/{subject:path}/events", response_model=EventsResponse)
async def events(
    res: ResourcesDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    from_: Annotated[Time | None, Query(alias="from", description="observed_at >= from (RFC 3339)")] = None,
    to: Annotated[Time | None, Query(description="observed_at < to (RFC 3339)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: AfterQuery = None,
) -> Response:
    """The subject's events in ledger order (partition, offset), each with its partition and offset."""
    return json_response(await reads.subject_log(res, tenants, tenant, subject, from_, to, limit, after))
