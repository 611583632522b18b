"""`GET /v1/subjects/{subject}/facts` (profile, as of valid time, as known at) and `.../events` (audit replay).

Times are strict RFC 3339 (a Unix number is 422 naming the parameter) and every time answered is spelled by
`producers.contract.rfc3339`, whatever offset the request used. A subject may contain `/`. The answers are
`api.reads.subject_facts` and `subject_log`, shared with the MCP `facts` tool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api import reads
from api.consistency import AfterQuery
from api.deps import DIGITS, CursorQuery, Named, ResourcesDep, TenantQuery, TenantsDep, Time
from api.requests import LIMIT, OFFSET, OFFSET_NOTE, SUBJECT
from api.routes._json import json_response
from api.schemas import EventsResponse, FactsResponse

router = APIRouter(prefix="/subjects", tags=["subjects"])

# blank is refused as the contract refuses it on a write: no subject is blank
Subject = Annotated[Named, Path(**SUBJECT, description="the subject (may contain /)")]
OptionalTime = Annotated[Time | None, Query(description="RFC 3339 time with seconds and an offset")]


@router.get("/{subject:text}/facts", response_model=FactsResponse)
async def facts(
    res: ResourcesDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    as_of: OptionalTime = None,
    known_at: OptionalTime = None,
    offset: Annotated[int, Query(description=OFFSET_NOTE, **OFFSET), DIGITS] = 0,
    limit: Annotated[
        int | None, Query(description="at most this many facts (default: every one)", **LIMIT), DIGITS
    ] = None,
    after: AfterQuery = None,
) -> Response:
    """The subject's facts at valid time `as_of` (default now), optionally only from events observed by `known_at`;
    a page of them with `offset`/`limit` (the answer's `page` says where it lies)."""
    answer = await reads.subject_facts(
        res, tenants, tenant, subject, as_of, known_at, after, offset=offset, limit=limit
    )
    return json_response(answer)


@router.get("/{subject:text}/events", response_model=EventsResponse)
async def events(
    res: ResourcesDep,
    subject: Subject,
    tenant: TenantQuery,
    tenants: TenantsDep,
    from_: Annotated[Time | None, Query(alias="from", description="observed_at >= from (RFC 3339)")] = None,
    to: Annotated[Time | None, Query(description="observed_at < to (RFC 3339)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000), DIGITS] = 10_000,
    after: AfterQuery = None,
    cursor: CursorQuery = None,
) -> Response:
    """The subject's events in ledger order (partition, offset), each with its partition and offset; with `more`,
    `next_cursor` asks for the events after these."""
    answer = await reads.subject_log(res, tenants, tenant, subject, from_, to, limit, after, cursor=cursor)
    return json_response(answer)
