"""`POST /v1/events`: publish 1..1000 events to the ledger, each accepted or refused on its own.

Body `{"events": [event, ...]}`. Every event is validated with the contract individually; the
valid ones are published even when others in the batch are not, and the response says exactly
which went through, in input order:

    {"results": [{"event_id", "accepted": true, "memory_id", "partition", "offset"},
                 {"event_id", "accepted": false, "error": {"code", "field", "message"}}]}

`error.field` is the full path (`events.2.tenant`); `event_id` is null for a refused event that
carried none (an accepted event always has one: the one given, or one generated here).

Status: 200 every event accepted; 207 some accepted, some not; 422 none accepted because every
one was invalid; 503 none accepted and the broker failed at least one. A retry is idempotent only
with the same event_ids: send your own, or resend the ids this response returned.
Whole-request problems are refused before anything is published: 422 naming `events` for a
missing, empty or oversized list, 401 without a known API key, 403 naming `events.N.tenant` if
any event names a tenant the key may not use.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep, TenantsDep, check_tenant
from producers.contract import InvalidEvent, MemoryEvent, from_dict
from producers.sdk import LedgerProducer, PublishError

router = APIRouter(tags=["events"])

MAX_EVENTS_PER_CALL = 1000
PRODUCER_TIMEOUT_S = 10.0  # an HTTP caller should hear about a broken broker in seconds, not minutes


class PublishRequest(BaseModel):
    """Events stay untyped here so that each one is judged by the contract on its own."""

    model_config = ConfigDict(extra="forbid")

    events: list[Any] = Field(min_length=1, max_length=MAX_EVENTS_PER_CALL)


def _producer(app: FastAPI, settings: Any) -> LedgerProducer:
    """The app's producer, created on first use (it connects lazily; the lifespan closes it)."""
    producer = getattr(app.state, "producer", None)
    if producer is None:
        producer = LedgerProducer(settings, timeout_s=PRODUCER_TIMEOUT_S)
        app.state.producer = producer
    return producer


def _refused(index: int, raw: Any, error: dict[str, Any]) -> dict[str, Any]:
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return {"event_id": event_id if isinstance(event_id, str) else None, "accepted": False, "error": error}


def _invalid(index: int, raw: Any, exc: InvalidEvent) -> dict[str, Any]:
    field = f"events.{index}.{exc.field}" if exc.field else f"events.{index}"
    return _refused(index, raw, {"code": exc.code, "field": field, "message": exc.message})


def _status(results: list[dict[str, Any]], broker_failed: bool) -> int:
    accepted = sum(1 for r in results if r["accepted"])
    if accepted == len(results):
        return 200
    if accepted:
        return 207
    return 503 if broker_failed else 422


@router.post(
    "/events",
    responses={
        207: {"description": "some events accepted, some refused (see each result)"},
        403: {"description": "an event names a tenant this API key may not use; nothing published"},
        422: {"description": "bad body, or no event valid (same body shape as 200)"},
        503: {"description": "the broker failed; nothing published, retrying the same events is safe"},
    },
)
async def publish_events(
    body: PublishRequest, request: Request, settings: SettingsDep, tenants: TenantsDep
) -> Response:
    """Validate each event, publish the valid ones, report every one."""
    for i, raw in enumerate(body.events):  # tenancy first: one foreign tenant and nothing is published
        if isinstance(raw, dict) and isinstance(raw.get("tenant"), str):
            check_tenant(raw["tenant"], tenants, field=f"events.{i}.tenant")

    results: list[dict[str, Any] | None] = [None] * len(body.events)
    valid: list[tuple[int, MemoryEvent]] = []
    for i, raw in enumerate(body.events):
        try:
            valid.append((i, from_dict(raw)))
        except InvalidEvent as exc:
            results[i] = _invalid(i, raw, exc)

    broker_failed = False
    if valid:
        producer = _producer(request.app, settings)
        outcomes = await run_in_threadpool(producer.send_many, [event for _, event in valid])
        for (i, event), outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, PublishError):
                broker_failed = True
                results[i] = _refused(i, body.events[i], {**outcome.as_dict(), "field": f"events.{i}"})
                results[i]["event_id"] = event.event_id
            else:
                results[i] = {
                    "event_id": event.event_id,
                    "accepted": True,
                    "memory_id": event.memory_id,
                    "partition": outcome.partition,
                    "offset": outcome.offset,
                }
    done: list[dict[str, Any]] = [r for r in results if r is not None]
    return Response(
        orjson.dumps({"results": done}),
        status_code=_status(done, broker_failed),
        media_type="application/json",
    )
