"""`POST /v1/events`: publish 1..1000 events to the ledger, each accepted or refused on its own.

Body `{"events": [event, ...]}`. Every event is validated on its own, with everything the worker
would refuse refused here first (the contract's rules, the encoded size, clock skew beyond
`settings.max_future_skew_s`, a re-used event_id); the valid ones are published even when others
in the batch are not, and the response says exactly what happened to each, in input order:

    {"results": [{"event_id", "accepted": true, "duplicate": false, "memory_id", "version_id",
                  "partition", "offset", "effect": "pending", "status_url"},
                 {"event_id", "accepted": false, "error": {"code", "field", "message"}}],
     "idempotency_checked": true}

`error.field` is the full path (`events.2.tenant`); `event_id` is null for a refused event that
carried none (an accepted event always has one: the one given, or one generated here). Accepted
means in the ledger, not applied: `effect` is `pending` (`applied` for a retry of an applied event),
and `status_url` (`GET /v1/events/{event_id}?tenant=`) says what it did once applied.

Idempotency (keyed by (tenant, event_id)): before publishing, every event's id is claimed in
PostgreSQL with its content's fingerprint, in one statement for the request
(projections.postgres.idempotency.claim_events). The claim is shared by every door the ledger runs
(each API process, the MCP server), so one id names one content whichever door it comes through,
even while the first is published and not applied yet. In the caller's tenant (never another's):
- same content as an applied event: `accepted, duplicate: true` with the stored event's partition
  and offset; nothing is published again (a retry is safe);
- same content as an event published a moment ago and not applied yet: accepted and published
  again (the worker applies an id once);
- different content than an applied, claimed or erased event of that id: refused, code
  `event_id_conflict`, field `events.N.event_id`;
- the subject was erased since and the content is the same: `accepted, duplicate: true, erased:
  true`, nothing published (a retry never brings erased data back).
An id stays claimed by its content even if publishing it failed: retry the same event. The same
id twice in one request: the second is a duplicate of the first, or a conflict. If PostgreSQL
cannot answer within `pg_door_check_timeout_s`, publishing goes on without the claim:
`idempotency_checked: false` and `idempotency_note` say so (the worker still applies each
(tenant, event_id) once, and dead-letters other content under an applied id as `event_id_conflict`:
`GET /v1/events/{event_id}` tells what became of an event).

`GET /v1/events/{event_id}?tenant=` answers what became of one event, whoever published it (a door,
or a producer that writes to Kafka itself): `status` pending | applied | duplicate | dead_lettered |
unknown (api.writes.event_status says what each carries; always 200, `unknown` also for another
tenant's id).

Status: 200 every event accepted; 207 some accepted, some not; 422 none accepted because every
one was invalid; 503 none accepted and the broker failed at least one. Error statuses (422, 503)
also carry `detail` in the one error shape (api.errors) beside `results`.
Whole-request problems are refused before anything is published: 422 naming `events` for a
missing, empty or oversized list (or `body` for a body that is not JSON), 401 without a known API
key, 403 naming `events.N.tenant` if any event names a tenant the key may not use.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from api import writes
from api.deps import ResourcesDep, Storable, TenantQuery, TenantsDep
from api.errors import ErrorBody
from api.requests import EVENT_ID, inline_refs
from api.routes._json import json_response
from api.schemas import EventStatus, PublishErrorBody, PublishResponse
from producers.contract import MemoryEvent

router = APIRouter(tags=["events"])

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
    "/events/{event_id:path}",
    response_model=EventStatus,
    responses={403: {"model": ErrorBody, "description": "the API key may not use this tenant"}},
)
async def event_status(
    res: ResourcesDep,
    event_id: Annotated[Storable, Path(**EVENT_ID)],
    tenant: TenantQuery,
    tenants: TenantsDep,
) -> Response:
    """What became of one event: pending, applied (its effect and place), duplicate (erased), dead_lettered (why)."""
    return json_response(await writes.event_status(res, tenants, tenant, event_id))  # shared with MCP event_status
