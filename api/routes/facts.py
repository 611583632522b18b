"""`GET /v1/facts/{memory_id}/history`: a fact's version chain, oldest first (404 if the tenant has no such fact).

The answer is `api.reads.history` (shared with the MCP `fact_history` tool). `after` (a write's consistency token):
answer once the projection has that write (api.consistency), else 503 `not_yet`; the answer's `consistency` says
which positions it reflects.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api import reads
from api.consistency import AfterQuery
from api.deps import DIGITS, Named, ResourcesDep, TenantQuery, TenantsDep
from api.requests import LIMIT, MEMORY_ID, OFFSET, OFFSET_NOTE
from api.routes._json import json_response
from api.schemas import HistoryResponse

router = APIRouter(prefix="/facts", tags=["facts"])


@router.get("/{memory_id}/history", response_model=HistoryResponse)
async def history(
    res: ResourcesDep,
    memory_id: Annotated[Named, Path(**MEMORY_ID)],
    tenant: TenantQuery,
    tenants: TenantsDep,
    offset: Annotated[int, Query(description=OFFSET_NOTE, **OFFSET), DIGITS] = 0,
    limit: Annotated[
        int | None, Query(description="at most this many versions (default: every one)", **LIMIT), DIGITS
    ] = None,
    after: AfterQuery = None,
) -> Response:
    return json_response(await reads.history(res, tenants, tenant, memory_id, after, offset=offset, limit=limit))
