"""The write side of the API as functions: the publish door (`POST /v1/events`) and erasure (`DELETE /v1/subjects/..`).

Each function takes the process's `api.resources.Resources`, the tenants the caller's API key may use
(api.deps.tenants_for_key) and validated parameters, and returns the body the HTTP route answers
(raising `api.errors.ApiError` for a refusal). The routes (api.routes.events, api.routes.erasure) and
the MCP tools (api.mcp: remember, forget) call these, so both front ends run the same door: the
contract's validation, the idempotency lookup by (tenant, event_id), conflicts, tenancy.

`publish_events` is documented in api.routes.events (statuses, per-event results, idempotency).
`publish_one` is the same door for one event, its refusal raised as an ApiError whose field is
relative to the event (`value.notes.2`, not `events.0.value.notes.2`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from starlette.concurrency import run_in_threadpool

from api.deps import check_tenant
from api.errors import ApiError, store_unavailable
from api.requests import ForgetParams
from api.resources import Resources
from producers.contract import EventType, InvalidEvent, MemoryEvent, from_dict
from producers.sdk import PublishError
from producers.settings import Settings
from projections.postgres.idempotency import Known, known_events

__all__ = ["DOOR_CHECK_BACKOFF_S", "MAX_EVENTS_PER_CALL", "erase_subject", "forget", "publish_events", "publish_one"]

log = logging.getLogger(__name__)

MAX_EVENTS_PER_CALL = 1000
DOOR_CHECK_BACKOFF_S = 5.0  # after PostgreSQL failed the lookup, publish without it for this long


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


async def publish_events(res: Resources, tenants: frozenset[str], events: list[Any]) -> tuple[int, dict[str, Any]]:
    """(status, body) of `POST /v1/events` for these raw events: validate each, answer retries and conflicts from
    what is stored, publish the new valid ones. 403 (raised) if any names a tenant the key may not use."""
    settings = res.settings
    for i, raw in enumerate(events):  # tenancy first: one foreign tenant and nothing is published
        if isinstance(raw, dict) and isinstance(raw.get("tenant"), str):
            check_tenant(raw["tenant"], tenants, field=f"events.{i}.tenant")

    skew, now = timedelta(seconds=settings.max_future_skew_s), datetime.now(UTC)
    results: list[dict[str, Any] | None] = [None] * len(events)
    valid: list[tuple[int, MemoryEvent]] = []
    given: dict[str, list[str]] = {}  # tenant -> event_ids the caller chose (generated ones are new by construction)
    for i, raw in enumerate(events):
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
                results[i] = _invalid(i, events[i], outcome)
                results[i]["event_id"] = event.event_id
            elif isinstance(outcome, PublishError):
                broker_failure = outcome
                results[i] = _refused(i, events[i], {**outcome.as_dict(), "field": f"events.{i}"})
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
    return status, payload


def _relative(field: str | None) -> str | None:
    """`events.0.value.x` -> `value.x`; `events.0` -> None (the event as a whole)."""
    if field is None or not field.startswith("events.0"):
        return field
    return field.removeprefix("events.0").removeprefix(".") or None


async def publish_one(res: Resources, tenants: frozenset[str], event: dict[str, Any]) -> dict[str, Any]:
    """One event through the door of `publish_events`: its result (accepted, duplicate, ids, position), or the
    refusal raised as an ApiError (422 naming the event's field, 403 for the tenant, 503 naming kafka)."""
    try:
        status, payload = await publish_events(res, tenants, [event])
    except ApiError as exc:
        raise ApiError(exc.status, exc.code, exc.message, _relative(exc.field), headers=exc.headers) from None
    result = payload["results"][0]
    if result["accepted"]:
        return {k: v for k, v in result.items() if k != "accepted"} | (
            {"idempotency_note": payload["idempotency_note"]} if "idempotency_note" in payload else {}
        )
    error = result["error"]
    if status == 503:
        raise store_unavailable("kafka", error["message"])
    raise ApiError(422, error["code"], error["message"], _relative(error["field"]))


async def erase_subject(
    res: Resources, tenants: frozenset[str], tenant: str, subject: str, reason: str | None = None
) -> dict[str, Any]:
    """Publish `subject.erased` for (tenant, subject) (`DELETE /v1/subjects/{subject}`): its event_id and position."""
    check_tenant(tenant, tenants)
    try:
        result = await run_in_threadpool(res.producer.erase_subject, tenant, subject, reason)
    except InvalidEvent as exc:  # e.g. a blank subject: the contract names the field
        raise ApiError(422, exc.code, exc.message, exc.field or "subject") from exc
    except PublishError as exc:
        raise store_unavailable("kafka", exc.reason) from exc
    return {
        "event_id": result.event_id,
        "type": "subject.erased",
        "tenant": tenant,
        "subject": subject,
        "partition": result.partition,
        "offset": result.offset,
    }


async def forget(res: Resources, tenants: frozenset[str], p: ForgetParams) -> dict[str, Any]:
    """Retract a fact (a `memory.retracted` through the door; `target_version`: only that version) or erase the
    subject (`erase_subject`); `{"action": "retracted"|"erased", ...the door's or the erasure's answer}`."""
    check_tenant(p.tenant, tenants)
    if p.erase_subject:
        if p.key is not None or p.target_version is not None:
            field = "key" if p.key is not None else "target_version"
            raise ApiError(422, "invalid_value", f"{field} retracts one fact: leave it out to erase the subject", field)
        return {"action": "erased", **await erase_subject(res, tenants, p.tenant, p.subject, p.reason)}
    if p.key is None:
        raise ApiError(422, "missing_field", "key is required to retract a fact (or set erase_subject)", "key")
    event: dict[str, Any] = {
        "type": EventType.RETRACTED.value,
        "tenant": p.tenant,
        "subject": p.subject,
        "key": p.key,
        "scope": p.scope,
        "target_version": p.target_version,
        "reason": p.reason,
        "event_id": p.event_id,
    }
    return {"action": "retracted", **await publish_one(res, tenants, event)}
