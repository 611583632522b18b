"""`POST /v1/recall`: deterministic-first recall over one tenant's memories.

The handler only validates (`api.requests.RecallBody`) and calls `api.reads.recall`, which checks
tenancy and asks `projections.search.recall.RecallEngine`: the app's one engine (api.resources: the
vocabulary cache, the embedder loaded in the background at start-up), so the event loop never runs
the model. The MCP tools `recall` and `recall_at` call the same function. `known_at` (optional): the
answer as the ledger knew it at that transaction time (api.reads): each hit, its explanation, the episodes
grouped with it, its context turns, the listed candidates, none of them logged later, and no access recorded
later in the ranking. `after` (a write's consistency token): answer once the search index has that write
(api.consistency), else 503 `not_yet`; `trace.consistency` says which positions the answer reflects. The body
is `api.schemas.RecallResponse`.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from api import reads
from api.deps import ResourcesDep, TenantsDep
from api.requests import Filters, RecallBody
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import RecallResponse

__all__ = ["Filters", "RecallBody", "router"]  # the request models live in api.requests (shared with api.mcp)

router = APIRouter(tags=["recall"], route_class=OrjsonBodyRoute)


@router.post("/recall", response_model=RecallResponse)
async def recall(body: RecallBody, res: ResourcesDep, tenants: TenantsDep) -> Response:
    """Hits (exact first, then keyword/semantic), the cues extracted from the query, and a per-stage trace."""
    return json_response(await reads.recall(res, tenants, body))
