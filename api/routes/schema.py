"""`GET /v1/schema/event`: the event contract as a JSON Schema, for producers in other languages (no API key).

The body is the checked-in producers/schemas/memory-event.schema.json, byte for byte. Unauthenticated, like
/v1/health: it is a public contract, not tenant data, and a producer in another language writes to Kafka with no
API key, yet its build should be able to fetch the contract it validates against.
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, Response

from api.schemas import EventSchemaDocument
from producers.event_schema import SCHEMA_ID, checked_in

router = APIRouter(prefix="/schema", tags=["schema"])


@functools.cache
def _document() -> bytes:
    return checked_in()  # read once per process: the file changes only with a new release


@router.get(
    "/event",
    response_model=EventSchemaDocument,
    responses={200: {"description": f"the JSON Schema (draft 2020-12) of one ledger event, $id {SCHEMA_ID}"}},
)
async def event_schema() -> Response:
    """The JSON Schema every event on the ledger topic must satisfy (its descriptions: what else the door checks)."""
    return Response(_document(), media_type="application/json")  # bytes as checked in, not re-encoded
