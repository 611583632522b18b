"""`/v1/dead-letters`: list a tenant's dead letters, open one, re-drive a corrected event or discard it.

Every action is an event published through the one door (api.dead_letters, api.writes.publish_one): nothing is
deleted from the log or the projection. The write routes answer as the door does (`effect: pending`,
`status_url`); the letter's `state` changes once the worker applied the event. 404 `not_found` for a position with
no dead letter of the tenant, 409 `dead_letter_resolved` for a letter re-driven or discarded already.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response
from pydantic import Field, WithJsonSchema

from api import dead_letters
from api.deps import DIGITS, ResourcesDep, TenantQuery, TenantsDep
from api.errors import ErrorBody
from api.requests import inline_refs
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import DeadLetterAction, DeadLetterRecord, DeadLettersResponse
from producers.contract import MemoryEvent

router = APIRouter(tags=["dead-letters"], route_class=OrjsonBodyRoute)

Partition = Annotated[
    int, Path(ge=0, le=2**31 - 1, description="the dead letter's partition of the ledger topic"), DIGITS
]
Offset = Annotated[int, Path(ge=0, le=2**63 - 1, description="the dead letter's offset in that partition"), DIGITS]
_CONFLICT = {409: {"model": ErrorBody, "description": "dead_letter_resolved: re-driven or discarded already"}}


class RedriveBody(dead_letters.RedriveParams):
    """The corrected event for the tenant's dead letter at (partition, offset)."""

    # an object, documented as the contract's event and judged by the door (api.writes.publish_one), field by field
    event: Annotated[dict[str, Any], WithJsonSchema(inline_refs(MemoryEvent.model_json_schema()))] = Field(
        description="the corrected event (its tenant defaults to the body's)"
    )


@router.get("/dead-letters", response_model=DeadLettersResponse)
async def list_dead_letters(
    res: ResourcesDep,
    tenants: TenantsDep,
    tenant: TenantQuery,
    state: Annotated[Literal["open", "redriven", "discarded"] | None, Query(description="only these")] = None,
    after: Annotated[str | None, Query(max_length=32, description="PARTITION:OFFSET: the previous page's next")] = None,
    limit: Annotated[int, Query(ge=1, le=dead_letters.MAX_PAGE), DIGITS] = 100,
) -> Response:
    """The tenant's dead letters in ledger order, each with its reason, position and state."""
    return json_response(await dead_letters.list_letters(res, tenants, tenant, state, after, limit))


@router.get("/dead-letters/{partition}/{offset}", response_model=DeadLetterRecord)
async def open_dead_letter(
    res: ResourcesDep, tenants: TenantsDep, tenant: TenantQuery, partition: Partition, offset: Offset
) -> Response:
    """One dead letter with its record's fields as far as they decode (sealed ones only if they open here)."""
    return json_response(await dead_letters.open_letter(res, tenants, tenant, partition, offset))


@router.post("/dead-letters/redrive", response_model=DeadLetterAction, responses=_CONFLICT)
async def redrive_dead_letter(res: ResourcesDep, tenants: TenantsDep, body: RedriveBody) -> Response:
    """Publish the corrected event linked to the dead letter (its `dead_letter` field)."""
    answer = await dead_letters.redrive_dead_letter(res, tenants, body.tenant, body.partition, body.offset, body.event)
    return json_response(answer)


@router.post("/dead-letters/discard", response_model=DeadLetterAction, responses=_CONFLICT)
async def discard_dead_letter(res: ResourcesDep, tenants: TenantsDep, body: dead_letters.DiscardParams) -> Response:
    """Publish `deadletter.discarded` with the reason for the dead letter."""
    answer = await dead_letters.discard_dead_letter(res, tenants, body.tenant, body.partition, body.offset, body.reason)
    return json_response(answer)
