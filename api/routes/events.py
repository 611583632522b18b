"""`POST /v1/events`: publish 1..1000 events to the ledger, each accepted or refused on its own.

Every event is judged alone, with whatever the worker would refuse refused here first, so the valid ones are
published even when others are not; `results` says what happened to each, in input order. Accepted means in the
ledger, not applied: `status_url` (`GET /v1/events/{event_id}?tenant=`) tells what it did, whoever published it.
Idempotency by (tenant, event_id): every door claims the id with its content's fingerprint in PostgreSQL before
publishing (projections.postgres.idempotency.claim_events; README.md, "Idempotency by (tenant, event_id)"); the
same id twice in one request is a duplicate of the first, or a conflict. If PostgreSQL cannot answer within
`pg_door_check_timeout_s`, publishing goes on unclaimed and `idempotency_checked: false` says so.

Status: 200 every event accepted; 207 some accepted, some not; 422 none accepted because every one was invalid;
503 none accepted and the broker failed at least one (422 and 503 also carry `detail`, the one error shape).
Whole-request problems are refused before anything is published: 422 naming `events` (or `body`), 401 without a
known API key, 403 naming `events.N.tenant`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from api import writes
from api.deps import Named, ResourcesDep, TenantQuery, TenantsDep
from api.errors import ErrorBody
from api.requests import EVENT_ID, inline_refs
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import EventStatus, PublishErrorBody, PublishResponse
from producers.contract import MemoryEvent

router = APIRouter(tags=["events"], route_class=OrjsonBodyRoute)

MAX_EVENTS_PER_CALL = writes.MAX_EVENTS_PER_CALL

# documented as the contract's event (so clients and schemathesis see its fields); validated as Any here,
# because each event is judged by the contract on its own and a bad one must not refuse the whole request
EventItem = Annotated[Any, WithJsonSchema(inline_refs(MemoryEvent.model_json_schema()))]


class PublishRequest(BaseModel):
    """Events stay untyped here so that each one is judged by the contract on its own."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventItem] = Field(min_length=1, max_length=MAX_EVENTS_PER_CALL)


@router.post(
    "/events",
    response_model=PublishResponse,
    responses={
        207: {"model": PublishResponse, "description": "some events accepted, some refused (see each result)"},
        403: {"model": ErrorBody, "description": "an event names a tenant this API key may not use; nothing published"},
        422: {"model": PublishErrorBody, "description": "bad body, or no event valid (detail and per-event results)"},
        503: {"model": PublishErrorBody, "description": "kafka failed; nothing published, retrying the same is safe"},
    },
)
async def publish_events(body: PublishRequest, tenants: TenantsDep, res: ResourcesDep) -> Response:
    """Validate each event, answer retries and conflicts from what is stored, publish the new valid ones."""
    status, payload = await writes.publish_events(res, tenants, body.events)  # api.writes: the door, shared with MCP
    return json_response(payload, status)


@router.get(
    "/events/{event_id:text}",
    response_model=EventStatus,
    responses={403: {"model": ErrorBody, "description": "the API key may not use this tenant"}},
)
async def event_status(
    res: ResourcesDep,
    event_id: Annotated[Named, Path(**EVENT_ID)],
    tenant: TenantQuery,
    tenants: TenantsDep,
) -> Response:
    """What became of one event: pending, applied (its effect and place), duplicate (erased), dead_lettered (why)."""
    return json_response(await writes.event_status(res, tenants, tenant, event_id))  # shared with MCP event_status
