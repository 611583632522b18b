"""`POST /v1/events`: publish 1..1000 events to the ledger, each accepted or refused on its own.

Body `{"events": [event, ...]}`. Every event is validated on its own, with everything the worker
would refuse refused here first (the contract's rules, the encoded size, clock skew beyond
`settings.max_future_skew_s`, a re-used event_id); the valid ones are published even when others
in the batch are not, and the response says exactly what happened to each, in input order:

    {"results": [{"event_id", "accepted": true, "duplicate": false, "memory_id", "version_id",
                  "partition", "offset"},
                 {"event_id", "accepted": false, "error": {"code", "field", "message"}}],
     "idempotency_checked": true}

`error.field` is the full path (`events.2.tenant`); `event_id` is null for a refused event that
carried none (an accepted event always has one: the one given, or one generated here).

Idempotency (keyed by (tenant, event_id)): before publishing, the ids the caller gave are looked
up among the events already applied in the caller's tenant (never another's):
- same content (fingerprint): `accepted, duplicate: true` with the stored event's partition and
  offset; nothing is published again (a retry is safe);
- different content: refused, code `event_id_conflict`, field `events.N.event_id`;
- the subject was erased since: `accepted, duplicate: true, erased: true`, nothing published
  (a retry never brings erased data back).
The same id twice in one request: the second is a duplicate of the first, or a conflict. Events
published but not applied yet are caught by the SDK's memory of this process and, last, by the
worker, which dead-letters a conflicting record. If PostgreSQL cannot answer within
`pg_door_check_timeout_s`, publishing goes on without the lookup: `idempotency_checked: false`
and `idempotency_note` say so (the worker still applies each (tenant, event_id) once).

Status: 200 every event accepted; 207 some accepted, some not; 422 none accepted because every
one was invalid; 503 none accepted and the broker failed at least one. Error statuses (422, 503)
also carry `detail` in the one error shape (api.errors) beside `results`.
Whole-request problems are refused before anything is published: 422 naming `events` for a
missing, empty or oversized list (or `body` for a body that is not JSON), 401 without a known API
key, 403 naming `events.N.tenant` if any event names a tenant the key may not use.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from api.deps import ResourcesDep, SettingsDep, TenantsDep, check_tenant
from api.errors import ErrorBody, store_unavailable
from api.resources import Resources
from api.routes._json import json_response
from api.schemas import PublishErrorBody, PublishResponse
from producers.contract import EventType, InvalidEvent, MemoryEvent, from_dict
from producers.sdk import PublishError
from producers.settings import Settings
from projections.postgres.idempotency import Known, known_events

log = logging.getLogger(__name__)

router = APIRouter(tags=["events"])

MAX_EVENTS_PER_CALL = 1000
DOOR_CHECK_BACKOFF_S = 5.0  # after PostgreSQL failed the lookup, publish without it for this long


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with its `$defs` references inlined (it is embedded in the OpenAPI spec as it is)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                return resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


# documented as the contract's event (so clients and schemathesis see its fields); validated as Any here,
# because each event is judged by the contract on its own and a bad one must not refuse the whole request
EventItem = Annotated[Any, WithJsonSchema(_inlined(MemoryEvent.model_json_schema()))]


class PublishRequest(BaseModel):
    """Events stay untyped here so that each one is judged by the contract on its own."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventItem] = Field(min_length=1, max_length=MAX_EVENTS_PER_CALL)


def _refused(index: int, raw: Any, error: dict[str, Any]) -> dict[str, Any]:
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return {"event_id": event_id if isinstance(event_id, str) else None, "accepted": False, "error": error}


def _invalid(index: int, raw: Any, exc: InvalidEvent) -> dict[str, Any]:
    field = f"events.{index}.{exc.field}" if exc.field else f"events.{index}"
    return _refused(index, raw, {"code": exc.code, "field": field, "message": exc.message})


def _accepted(event: MemoryEvent, partition: int | None, offset: int | None, **flags: bool) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "accepted": True,
        "duplicate": flags.get("duplicate", False),
        **({"erased": True} if flags.get("erased") else {}),
        "memory_id": event.memory_id if event.type is not EventType.ERASED else None,
        "version_id": event.version_id if event.type is EventType.ASSERTED else None,
        "partition": partition,
        "offset": offset,
    }


def _status(results: list[dict[str, Any]], broker_failed: bool) -> int:
    accepted = sum(1 for r in results if r["accepted"])
    if accepted == len(results):
        return 200
    if accepted:
        return 207
    return 503 if broker_failed else 422


async def _known(
    res: Resources, settings: Settings, wanted: dict[str, list[str]]
) -> tuple[dict[tuple[str, str], Known], str | None]:
    """{(tenant, event_id): Known} for the ids the caller gave, and why the lookup was skipped (None: it was not).

    Each lookup names the caller's own tenant (tenancy was checked first): no answer depends on
    another tenant's ids. A PostgreSQL failure never blocks publishing.
    """
    if not wanted:
        return {}, None
    if res.door_check.active():
        return {}, "postgres failed a moment ago: ids were not looked up"
    found: dict[tuple[str, str], Known] = {}
    try:
        async with res.pool.connection(timeout=settings.pg_door_check_timeout_s) as conn:
            for tenant, ids in wanted.items():
                for event_id, known in (await known_events(conn, tenant, ids)).items():
                    found[(tenant, event_id)] = known
    except psycopg.ProgrammingError as exc:  # no projection tables (yet), or an older schema: cannot tell
        log.warning("POST /v1/events: idempotency lookup skipped: %s: %s", type(exc).__name__, exc)
        return {}, f"the projection cannot answer ({type(exc).__name__}): ids were not looked up"
    except psycopg.OperationalError as exc:  # includes PoolTimeout
        res.door_check.trip(DOOR_CHECK_BACKOFF_S)
        log.warning("POST /v1/events: idempotency lookup skipped: %s: %s", type(exc).__name__, exc)
        return {}, f"postgres unavailable ({type(exc).__name__}): ids were not looked up"
    return found, None


def _conflict(index: int, event: MemoryEvent, where: str) -> dict[str, Any]:
    message = (
        f"event_id {event.event_id!r} already names a different event in tenant {event.tenant!r} ({where}); "
        "resend the same event to retry, or use a new event_id"
    )
    return {
        "event_id": event.event_id,
        "accepted": False,
        "error": {"code": "event_id_conflict", "field": f"events.{index}.event_id", "message": message},
    }


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
async def publish_events(
    body: PublishRequest, settings: SettingsDep, tenants: TenantsDep, res: ResourcesDep
) -> Response:
    """Validate each event, answer retries and conflicts from what is stored, publish the new valid ones."""
    for i, raw in enumerate(body.events):  # tenancy first: one foreign tenant and nothing is published
        if isinstance(raw, dict) and isinstance(raw.get("tenant"), str):
            check_tenant(raw["tenant"], tenants, field=f"events.{i}.tenant")

    skew, now = timedelta(seconds=settings.max_future_skew_s), datetime.now(UTC)
    results: list[dict[str, Any] | None] = [None] * len(body.events)
    valid: list[tuple[int, MemoryEvent]] = []
    given: dict[str, list[str]] = {}  # tenant -> event_ids the caller chose (generated ones are new by construction)
    for i, raw in enumerate(body.events):
        try:
            event = from_dict(raw, now=now, max_future_skew=skew)
        except InvalidEvent as exc:
            results[i] = _invalid(i, raw, exc)
            continue
        valid.append((i, event))
        if isinstance(raw.get("event_id"), str):
            given.setdefault(event.tenant, []).append(event.event_id)

    known, skipped = await _known(res, settings, given)
    to_send: list[tuple[int, MemoryEvent]] = []
    first: dict[tuple[str, str], tuple[int, MemoryEvent]] = {}  # the first occurrence of each id in this request
    repeats: list[tuple[int, MemoryEvent, int]] = []  # (index, event, index of its first occurrence)
    for i, event in valid:
        key = (event.tenant, event.event_id)
        stored = known.get(key)
        if key in first:
            j, earlier = first[key]
            if earlier.fingerprint == event.fingerprint:
                repeats.append((i, event, j))
            else:
                results[i] = _conflict(i, event, f"events.{j} of this request")
        elif stored is not None and stored.erased:
            results[i] = _accepted(event, stored.partition, stored.offset, duplicate=True, erased=True)
        elif stored is not None and stored.fingerprint not in (None, event.fingerprint):
            results[i] = _conflict(i, event, f"applied at partition {stored.partition}, offset {stored.offset}")
        elif stored is not None:  # a retry of an applied event (no fingerprint: stored before fingerprints)
            results[i] = _accepted(event, stored.partition, stored.offset, duplicate=True)
        else:
            to_send.append((i, event))
        first.setdefault(key, (i, event))

    broker_failure: PublishError | None = None
    if to_send:
        outcomes = await run_in_threadpool(res.producer.send_many, [e for _, e in to_send], report_invalid=True)
        for (i, event), outcome in zip(to_send, outcomes, strict=True):
            if isinstance(outcome, InvalidEvent):  # too large, or an id this process sent with other content
                results[i] = _invalid(i, body.events[i], outcome)
                results[i]["event_id"] = event.event_id
            elif isinstance(outcome, PublishError):
                broker_failure = outcome
                results[i] = _refused(i, body.events[i], {**outcome.as_dict(), "field": f"events.{i}"})
                results[i]["event_id"] = event.event_id
            else:
                results[i] = _accepted(event, outcome.partition, outcome.offset)
    for i, event, j in repeats:  # the same event twice in one request: published once, both answered alike
        earlier = results[j]
        assert earlier is not None  # every first occurrence was answered above
        if earlier["accepted"]:
            results[i] = {**earlier, "duplicate": True}
        else:
            error = earlier["error"]
            field = f"events.{i}" + (error["field"] or "")[len(f"events.{j}") :]
            results[i] = {**earlier, "event_id": event.event_id, "error": {**error, "field": field}}
    done: list[dict[str, Any]] = [r for r in results if r is not None]
    status = _status(done, broker_failure is not None)
    payload: dict[str, Any] = {"results": done, "idempotency_checked": skipped is None}
    if skipped is not None:
        payload["idempotency_note"] = skipped + "; the worker still applies each (tenant, event_id) once"
    if status >= 400:
        if status == 503 and broker_failure is not None:
            detail = [store_unavailable("kafka", broker_failure.reason).item()]
        else:
            detail = [r["error"] for r in done if not r["accepted"]]
        payload = {"detail": detail, **payload}
    return json_response(payload, status)
