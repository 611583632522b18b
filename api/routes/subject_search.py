"""`GET /v1/subjects?tenant=&prefix=&limit=`: a tenant's subjects by prefix (the audit console's finder).

Bounded: at most `limit` (1..200) subjects, found by a walk of the index `events_subject_c`
(projections.postgres.subject_search) whose cost grows with `limit`, not with the tenant's size;
`more` says whether the prefix has further subjects, and `next_cursor` asks for them. A subject is listed once it has an
event, an erased one included (its timeline shows the erasure). Another tenant is 403 like everywhere.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import (
    DIGITS,
    ListCursorQuery,
    PoolDep,
    Storable,
    TenantQuery,
    TenantsDep,
    check_tenant,
    list_cursor,
    list_place,
)
from api.routes._json import json_response
from api.schemas import SubjectsResponse
from projections import shapes
from projections.postgres.subject_search import search_subjects

router = APIRouter(prefix="/subjects", tags=["subjects"])

MAX_LIMIT = 200


@router.get("", response_model=SubjectsResponse)
async def find_subjects(
    pool: PoolDep,
    tenant: TenantQuery,
    tenants: TenantsDep,
    prefix: Annotated[Storable, Query(max_length=256, description="subjects starting with it (case-sensitive)")] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many subjects"), DIGITS] = 50,
    cursor: ListCursorQuery = None,
) -> Response:
    """The tenant's subjects that start with `prefix`, in code point order, at most `limit` of them; with `more`,
    `next_cursor` asks for the ones after these."""
    check_tenant(tenant, tenants)
    after = None if cursor is None else list_place(cursor, 1)[0]
    async with pool.connection() as conn:
        subjects, more = await search_subjects(conn, tenant, prefix, limit, after)
    next_cursor = list_cursor(subjects[-1]) if more else None
    body = shapes.SubjectsResponse(tenant=tenant, prefix=prefix, subjects=subjects, more=more, next_cursor=next_cursor)
    return json_response(body)
