"""The write side of the API as functions: the publish door (`POST /v1/events`) and erasure (`DELETE /v1/subjects/..`).

The HTTP routes and the MCP tools call these, so both front ends run the same door: the contract's validation,
the idempotency claim by (tenant, event_id) in PostgreSQL shared by every process, conflicts and tenancy.
`publish_one` is the door for one event, its refusal's field relative to the event. Every write answers a
`consistency_token` a read can wait for (api.consistency).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psycopg
from starlette.concurrency import run_in_threadpool

from api.client import path_segment
from api.consistency import wait_after
from api.deps import check_tenant
from api.errors import ApiError, store_unavailable
from api.judging import conflict, invalid, judge, refused
from api.requests import ForgetParams
from api.resources import Position, Publishes, Resources
from producers.consistency import token_of
from producers.contract import (
    LETTER_ID_PREFIX,
    EventType,
    InvalidEvent,
    MemoryEvent,
    memory_id_for,
    rfc3339,
    version_id_for,
    well_formed_tenant,
)
from producers.sdk import PublishError
from producers.settings import Settings
from projections.postgres.dead_letters import dead_letter
from projections.postgres.idempotency import Claim, Fate, claim_events, erased_sql, event_fate, release_claims
from projections.postgres.positions import stored_positions_async
from projections.postgres.queries import event_effect, look_alike_subjects

__all__ = [
    "DOOR_CHECK_BACKOFF_S",
    "MAX_EVENTS_PER_CALL",
    "effect_pending",
    "erase_subject",
    "event_status",
    "forget",
    "publish_events",
    "publish_one",
]

log = logging.getLogger(__name__)

MAX_EVENTS_PER_CALL = 1000
DOOR_CHECK_BACKOFF_S = 5.0  # after PostgreSQL failed the lookup, publish without it for this long
# more events than this are judged in a child process: ~0.1 ms of CPU each, so a hundred are worth a round trip
JUDGED_IN_A_CHILD = 100


def _memory_id_at_the_door(event: MemoryEvent) -> str | None:
    """The fact an accepted event is about, as the door knows it: none for an erasure or a letter's discard (no fact
    is), nor for a retraction naming its target_version (the worker files it under the target's fact when that is
    an episode or no key is named, which only the projection knows)."""
    if event.type in (EventType.ERASED, EventType.DISCARDED) or (
        event.type is EventType.RETRACTED and event.target_version is not None
    ):
        return None
    return event.memory_id


def _accepted(event: MemoryEvent, partition: int | None, offset: int | None, **flags: bool) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "accepted": True,
        "duplicate": flags.get("duplicate", False),
        **({"erased": True} if flags.get("erased") else {}),
        "memory_id": _memory_id_at_the_door(event),
        "version_id": event.version_id if event.type is EventType.ASSERTED else None,
        "partition": partition,
        "offset": offset,
        **effect_pending(
            event.tenant, event.event_id, applied=flags.get("applied", False), erased=flags.get("erased", False)
        ),
    }


def _status(results: list[dict[str, Any]], broker_failed: bool) -> int:
    accepted = sum(1 for r in results if r["accepted"])
    if accepted == len(results):
        return 200
    if accepted:
        return 207
    return 503 if broker_failed else 422


async def _answer_others(
    res: Resources,
    settings: Settings,
    others: list[tuple[int, MemoryEvent, int]],
    claims: dict[tuple[str, str], Claim],
    results: list[dict[str, Any] | None],
) -> None:
    """Answer each event whose id came earlier in the request with other content: a conflict with that one, unless
    the ledger holds the id (applied or erased) and refused the earlier one, and holds this one's content: then a
    retry of it, a duplicate wherever it stands in the request. Two reads whatever their number (at most one content
    of an id is the ledger's), and no claim; PostgreSQL failing leaves them conflicts."""
    refused = {k for k, c in claims.items() if c.state == "conflict" and c.holder in ("applied", "erased")}
    asked = [e for _, e, _ in others if (e.tenant, e.event_id) in refused]
    stored: dict[tuple[str, str], tuple[str, int, int]] = {}  # (tenant, id) -> (fingerprint, partition, offset)
    erased: set[tuple[str, str, str]] = set()  # (tenant, id, fingerprint) an erasure kept
    if asked:
        tenants, ids, fps = [e.tenant for e in asked], [e.event_id for e in asked], [e.fingerprint for e in asked]
        try:
            async with res.pool.connection(timeout=settings.pg_door_check_timeout_s) as conn:
                cur = await conn.execute(
                    'SELECT tenant, event_id, fingerprint, "partition", "offset" FROM events '
                    "WHERE (tenant, event_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))",
                    (tenants, ids),
                )
                stored = {(t, i): (fp, p, o) for t, i, fp, p, o in await cur.fetchall()}
                cur = await conn.execute(erased_sql(with_fingerprints=True), (tenants, ids, fps))
                erased = {(tenants[n - 1], ids[n - 1], fps[n - 1]) for n, same in await cur.fetchall() if same}
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            log.warning("POST /v1/events: a repeated id's content was not looked up: %s: %s", type(exc).__name__, exc)
    for i, event, j in others:
        key = (event.tenant, event.event_id)
        if key in stored and stored[key][0] == event.fingerprint:
            results[i] = _accepted(event, *stored[key][1:], duplicate=True, applied=True)
        elif key in refused and key not in stored and (*key, event.fingerprint) in erased:
            results[i] = _accepted(event, None, None, duplicate=True, erased=True)
        else:
            results[i] = conflict(i, event, f"events.{j} of this request")


async def _claims(
    res: Resources, settings: Settings, ids: list[tuple[str, str, str]]
) -> tuple[dict[tuple[str, str], Claim], str | None]:
    """{(tenant, event_id): Claim} for the events about to be published, given as (tenant, event_id, fingerprint)
    (each id once), claimed in PostgreSQL in one statement (projections.postgres.idempotency.claim_events), and
    why the claim was skipped (None: it was not).

    The claim is what every door (each API process, MCP) shares: the same id with other content, published a
    moment ago by another door and not applied yet, is a conflict here. Each event names a tenant the caller may
    use (tenancy was checked first): no answer depends on another tenant's ids. A PostgreSQL failure never blocks
    publishing.
    """
    if not ids:
        return {}, None
    if res.door_check.active():
        return {}, "postgres failed a moment ago: ids were not claimed"
    try:
        async with res.pool.connection(timeout=settings.pg_door_check_timeout_s) as conn:
            claims = await claim_events(conn, ids)
    except psycopg.ProgrammingError as exc:  # no projection tables (yet), or an older schema: cannot tell
        log.warning("POST /v1/events: idempotency claim skipped: %s: %s", type(exc).__name__, exc)
        return {}, f"the projection cannot answer ({type(exc).__name__}): ids were not claimed"
    except psycopg.OperationalError as exc:  # includes PoolTimeout
        res.door_check.trip(DOOR_CHECK_BACKOFF_S)
        log.warning("POST /v1/events: idempotency claim skipped: %s: %s", type(exc).__name__, exc)
        return {}, f"postgres unavailable ({type(exc).__name__}): ids were not claimed"
    return {(tenant, event_id): c for (tenant, event_id, _), c in zip(ids, claims, strict=True)}, None


async def _release(res: Resources, settings: Settings, events: list[MemoryEvent]) -> None:
    """Release the claims of events the producer refused before sending (a failure only leaves them claimed)."""
    try:
        async with res.pool.connection(timeout=settings.pg_door_check_timeout_s) as conn:
            await release_claims(conn, [(e.tenant, e.event_id, e.fingerprint) for e in events])
    except (psycopg.ProgrammingError, psycopg.OperationalError) as exc:
        log.warning("POST /v1/events: claims of unsent events kept: %s: %s", type(exc).__name__, exc)


_HELD_BY = {  # a conflict's `where`, by what holds the id (idempotency.Claim.holder)
    "claimed": "published a moment ago, not applied yet",
    "erased": "an event of a subject erased since",
}


async def publish_events(
    res: Resources, tenants: frozenset[str], events: list[Any], *, resolutions: bool = False
) -> tuple[int, dict[str, Any]]:
    """(status, body) of `POST /v1/events` for these raw events: validate each, answer retries and conflicts from
    what is stored, publish the new valid ones. 403 (raised) if any names a tenant the key may not use.
    `resolutions`: the dead-letter workflow's call (api.dead_letters), which checked and claimed the letter an
    event names; any other refuses an event naming one (422 on its `dead_letter`)."""
    settings = res.settings
    for i, raw in enumerate(events):  # tenancy first: one foreign tenant and nothing is published
        tenant = raw.get("tenant") if isinstance(raw, dict) else None
        if isinstance(tenant, str) and well_formed_tenant(tenant):  # a malformed one: the contract's 422 names it
            check_tenant(tenant, tenants, field=f"events.{i}.tenant")

    skew, now = timedelta(seconds=settings.max_future_skew_s), datetime.now(UTC)
    # up to 1000 events judged by the contract and fingerprinted: CPU work, never on the event loop; a large
    # request's in a child process (res.offload), a small one's in a worker thread (less than a round trip there)
    in_a_child = len(events) > JUDGED_IN_A_CHILD
    judged = await (res.offload.run if in_a_child else run_in_threadpool)(judge, events, now, skew, resolutions)
    results, first, fingerprints, repeats = judged.results, judged.first, judged.fingerprints, judged.repeats

    # every id is claimed, generated ones too: GET /v1/events/{event_id} then says `pending` until it is applied
    claims, skipped = await _claims(res, settings, [(*key, fp) for key, fp in fingerprints.items()])
    # an event not applied yet that this process publishes or published: answered its position, not sent again
    published, mine = await _published_here(res.publishes, first, claims, fingerprints)

    def answer_and_publish() -> tuple[PublishError | None, list[MemoryEvent]]:
        """Answer each id from its claim and publish the new ones (the broker's failure, the events the producer
        refused before sending): up to 1000 answers and the producer's waits, in a worker thread."""
        to_send: list[tuple[int, MemoryEvent]] = []
        for key, (i, event) in first.items():
            claim = claims.get(key)
            if key in published:
                results[i] = _accepted(event, *published[key], duplicate=True)  # published, still pending
            elif claim is None or claim.state in ("new", "claimed"):  # "claimed": another process's, applied once
                to_send.append((i, event))
            elif claim.state == "applied":  # a retry of an applied event: nothing published again
                results[i] = _accepted(event, claim.partition, claim.offset, duplicate=True, applied=True)
            elif claim.state == "erased":  # a retry of an erased event: never published again
                results[i] = _accepted(event, None, None, duplicate=True, erased=True)
            elif claim.holder == "applied":
                results[i] = conflict(i, event, f"applied at partition {claim.partition}, offset {claim.offset}")
            else:
                results[i] = conflict(i, event, _HELD_BY[claim.holder or "claimed"])

        broker_failure: PublishError | None = None
        unsent: list[MemoryEvent] = []  # refused by the producer before sending: their claims are released
        if to_send:
            outcomes = res.producer.send_many([e for _, e in to_send], report_invalid=True)
            for (i, event), outcome in zip(to_send, outcomes, strict=True):
                if isinstance(outcome, InvalidEvent):  # too large, or an id this process sent with other content
                    results[i] = invalid(i, events[i], outcome)
                    results[i]["event_id"] = event.event_id
                    if outcome.code != "event_id_conflict":
                        unsent.append(event)
                elif isinstance(outcome, PublishError):
                    broker_failure = outcome
                    results[i] = refused(events[i], {**outcome.as_dict(), "field": f"events.{i}"})
                    results[i]["event_id"] = event.event_id
                else:
                    results[i] = _accepted(event, outcome.partition, outcome.offset)
        return broker_failure, unsent

    try:
        broker_failure, unsent = await run_in_threadpool(answer_and_publish)
    finally:  # what waits for these publishes learns their positions, or that they failed and are its to send
        for key in mine:
            i, _event = first[key]
            done = results[i]
            sent = done is not None and done["accepted"] and done.get("partition") is not None
            res.publishes.finish((*key, fingerprints[key]), (done["partition"], done["offset"]) if sent else None)
    if unsent and skipped is None:
        await _release(res, settings, unsent)
    await _answer_others(res, settings, judged.others, claims, results)
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
    written = [(r["partition"], r["offset"]) for r in done if r["accepted"] and r.get("partition") is not None]
    payload: dict[str, Any] = {
        "results": done,
        "idempotency_checked": skipped is None,
        "consistency_token": token_of(written),  # what a read passes as `after` to see these writes
    }
    if skipped is not None:
        payload["idempotency_note"] = skipped + "; the worker still applies each (tenant, event_id) once"
    if status >= 400:
        if status == 503 and broker_failure is not None:
            detail = [store_unavailable(broker_failure.store, broker_failure.reason).item()]
        else:
            detail = [r["error"] for r in done if not r["accepted"]]
        payload = {"detail": detail, **payload}
    return status, payload


async def _published_here(
    publishes: Publishes,
    first: dict[tuple[str, str], tuple[int, MemoryEvent]],
    claims: dict[tuple[str, str], Any],
    fingerprints: dict[tuple[str, str], str],
) -> tuple[dict[tuple[str, str], Position], list[tuple[str, str]]]:
    """Of the events to publish (no claim, or claimed and not applied): the positions of those this process
    published with the same content, after waiting for those it is publishing, and the keys of the rest, now this
    request's to publish (`Publishes.start`ed: the caller `finish`es each). It waits holding none of its own, and
    starts its own with no wait between look-up and start, so two requests never wait for each other."""
    to_publish = [key for key, _ in first.items() if claims.get(key) is None or claims[key].state in ("new", "claimed")]
    for key in to_publish:
        if claims.get(key) is not None and claims[key].letters:  # the record this process sent was refused since:
            publishes.forget((*key, fingerprints[key]), claims[key].letters)  # a new one is sent
    waits = {key: f for key in to_publish if (f := publishes.get((*key, fingerprints[key]))) is not None}
    for future in waits.values():
        await asyncio.shield(future)
    published: dict[tuple[str, str], Position] = {}
    mine: list[tuple[str, str]] = []
    for key in to_publish:
        future = publishes.get((*key, fingerprints[key]))
        if future is not None and future.done() and future.result() is not None:
            published[key] = future.result()  # type: ignore[assignment]
        elif future is None:
            publishes.start((*key, fingerprints[key]))
            mine.append(key)
        # else: started by another request while this one waited: published again, applied once
    return published, mine


def _relative(field: str | None) -> str | None:
    """`events.0.value.x` -> `value.x`; `events.0` -> None (the event as a whole)."""
    if field is None or not field.startswith("events.0"):
        return field
    return field.removeprefix("events.0").removeprefix(".") or None


async def publish_one(
    res: Resources, tenants: frozenset[str], event: dict[str, Any], *, resolutions: bool = False
) -> dict[str, Any]:
    """One event through the door of `publish_events`: its result (accepted, duplicate, ids, position), or the
    refusal raised as an ApiError (422 naming the event's field, 403 for the tenant, 503 naming the store)."""
    try:
        status, payload = await publish_events(res, tenants, [event], resolutions=resolutions)
    except ApiError as exc:
        raise ApiError(exc.status, exc.code, exc.message, _relative(exc.field), headers=exc.headers) from None
    result = payload["results"][0]
    if result["accepted"]:
        return (
            {k: v for k, v in result.items() if k != "accepted"}
            | {"consistency_token": payload["consistency_token"]}
            | ({"idempotency_note": payload["idempotency_note"]} if "idempotency_note" in payload else {})
        )
    error = result["error"]
    if status == 503:  # the store that failed, as publish_events named it
        item = payload["detail"][0]
        raise ApiError(503, item["code"], item["message"], item["field"])
    raise ApiError(422, error["code"], error["message"], _relative(error["field"]))


async def event_status(res: Resources, tenants: frozenset[str], tenant: str, event_id: str) -> dict[str, Any]:
    """What became of the tenant's event `event_id` (`GET /v1/events/{event_id}`, MCP `event_status`), one of:

    - `applied`: its `type`, `memory_id`, `version_id` (an assertion's), `partition`, `offset` and `effect` (what
      it does now in its fact's chain, as the audit replay says: `{effect, version_id, detail}`);
    - `duplicate` with `erased: true`: it was applied, or refused, and its subject erased since (nothing else of
      it is kept; re-sending it has no effect);
    - `dead_lettered`: the worker refused the record that carried the id: `reason` `{code, field, message}`, and
      the record's `partition`, `offset`;
    - `pending`: a door claimed the id (it was published) and the worker has not applied it yet (`since`), also
      when the id was refused before and published again since (a re-drive under the same id);
    - `unpublished`: a door claimed the id, its publish cannot be delivered any more (the producer's delivery bound
      has passed) and the worker has read the whole log without meeting it: the record never reached the ledger
      (the broker refused it or did not answer), so the same event is to be sent again;
    - `unknown`: no door claimed it and the worker has not seen it (yet: a record written straight to Kafka is
      unknown until the worker reaches it), or it is another tenant's (nothing tells one tenant about another); a
      letter's id whose letter an event of another id resolved reads so too (the letter says by which).

    `dead_letters` (when any) lists every refused record that carried the id, e.g. a conflicting re-use of an
    applied id. A key not bound to `tenant` is a 403 (check_tenant).
    """
    check_tenant(tenant, tenants)
    async with res.pool.connection() as conn:
        fate = await event_fate(conn, tenant, event_id, res.settings.topic)
        if (
            fate.applied is None
            and fate.claimed_at is not None
            and await _resolved_by_another(res, conn, tenant, event_id)
        ):
            fate = dataclasses.replace(fate, claimed_at=None)
        unpublished = await _never_delivered(res, conn, fate, tenant, event_id)
        if unpublished is not None:
            fate = unpublished
        applied = fate.applied
        effect = None
        if applied is not None:
            effect = await event_effect(conn, tenant, applied["subject"], event_id, applied["type"])
    body: dict[str, Any] = {"tenant": tenant, "event_id": event_id}
    if applied is not None:
        asserted = applied["type"] == EventType.ASSERTED.value
        body |= {
            "status": "applied",
            "type": applied["type"],
            "memory_id": applied["memory_id"],
            "version_id": version_id_for(tenant, event_id) if asserted else None,
            "partition": applied["partition"],
            "offset": applied["offset"],
            "effect": effect,
        }
    elif fate.erased:
        body |= {"status": "duplicate", "erased": True}
    elif fate.dead_letters and not fate.claimed_since_refused:
        last = fate.dead_letters[-1]
        reason = {k: last[k] for k in ("code", "field", "message")}
        body |= {"status": "dead_lettered", "reason": reason, "partition": last["partition"], "offset": last["offset"]}
    elif fate.claimed_at is not None:
        body |= {"status": "unpublished" if unpublished else "pending", "since": rfc3339(fate.claimed_at)}
    else:
        body["status"] = "unknown"
    if fate.dead_letters:
        body["dead_letters"] = fate.dead_letters
    return {k: v for k, v in body.items() if v is not None}


_LETTER_ID = re.compile(re.escape(LETTER_ID_PREFIX) + r"([0-9]{1,9}):([0-9]{1,19})")


async def _resolved_by_another(res: Resources, conn: psycopg.AsyncConnection, tenant: str, event_id: str) -> bool:
    """`event_id` is a letter's id whose letter an event of another id resolved: a re-drive under an id of its own
    claims the letter's id beside its own, and the claim stays (it refuses a second action), but nothing is pending
    under that id."""
    named = _LETTER_ID.fullmatch(event_id)
    if named is None:
        return False
    found = await dead_letter(conn, tenant, res.settings.topic, int(named[1]), int(named[2]))
    return found is not None and found[0]["state"] != "open"


# after its claim, a door's record reaches the broker within the producer's delivery bound or never (the SDK's
# delivery_timeout_ms; the margin as the SDK's own wait for it)
_DELIVERY_MARGIN_S = 5.0


async def _never_delivered(
    res: Resources, conn: psycopg.AsyncConnection, fate: Fate, tenant: str, event_id: str
) -> Fate | None:
    """The fate read again if the claimed event's record never reached the ledger, else None: the claim is older
    than any delivery could take, and the worker's positions, read first, are at the log's end offsets, read last,
    so a record written at any time would have been applied or refused before the fate read between them."""
    settings = res.settings
    bound = max(settings.api_kafka_timeout_s, settings.producer_timeout_s) + _DELIVERY_MARGIN_S
    pending = fate.applied is None and not fate.erased and fate.claimed_at is not None
    if not pending or (fate.dead_letters and not fate.claimed_since_refused):
        return None
    assert fate.claimed_at is not None
    if datetime.now(UTC) - fate.claimed_at < timedelta(seconds=bound):
        return None
    positions = await stored_positions_async(conn, settings.processor_group, settings.topic)
    again = await event_fate(conn, tenant, event_id, settings.topic)
    moved = again.claimed_at != fate.claimed_at or len(again.dead_letters) != len(fate.dead_letters)
    if moved or again.applied is not None or again.erased:
        return None  # it moved meanwhile: the answer is the read's own, next time
    try:
        ends = await asyncio.to_thread(res.offsets.read)
    except Exception:  # noqa: BLE001 - the broker does not answer: it cannot be told, so it stays pending
        return None
    caught_up = all(positions.get(p, 0) >= end for p, end in ends.items())
    return again if caught_up and ends else None


async def _refuse_a_look_alike(res: Resources, tenant: str, subject: str) -> None:
    """The look-alike check of `erase_subject`; skipped, as the door's claims are, while PostgreSQL cannot answer
    (an erasure must still be publishable then)."""
    if res.door_check.active():
        return
    try:
        async with res.pool.connection(timeout=res.settings.pg_door_check_timeout_s) as conn:
            meant = await look_alike_subjects(conn, tenant, subject)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:  # OperationalError includes PoolTimeout
        log.warning("erasure: the look-alike check skipped: %s: %s", type(exc).__name__, exc)
        return
    if meant:
        raise ApiError(
            422,
            "invalid_value",
            f"the subject {subject!r} has no record, and the tenant's {', '.join(map(repr, meant))} reads the same "
            "(case, width, Unicode form, white space at its ends, invisible characters or a dash's kind aside): "
            "erase that one by its own spelling, or "
            f"set literal=true to erase {subject!r} itself (its events may not be applied yet)",
            "subject",
        )


async def erase_subject(
    res: Resources,
    tenants: frozenset[str],
    tenant: str,
    subject: str,
    reason: str | None = None,
    event_id: str | None = None,
    *,
    literal: bool = False,
) -> dict[str, Any]:
    """Publish `subject.erased` for (tenant, subject) (`DELETE /v1/subjects/{subject}`): its event_id and position.

    It goes through the one door (`publish_one`), so its id is claimed like any other and its status reads
    `pending` until the worker has applied it. Unless `literal`, a subject with no record while another of the
    tenant reads the same (`USER:42`, ` user:42`, a fullwidth digit, another Unicode form of an accent) is a 422
    naming the ones it may mean: an erasure that purges nothing while its caller believes the subject gone is the
    one mistake an erasure must not make."""
    check_tenant(tenant, tenants)
    if not literal:
        await _refuse_a_look_alike(res, tenant, subject)
    event = {"type": EventType.ERASED.value, "tenant": tenant, "subject": subject, "reason": reason}
    if event_id is not None:  # the caller's id: a retry of the same erasure is a duplicate
        event["event_id"] = event_id
    result = await publish_one(res, tenants, event)
    duplicate = bool(result.get("duplicate"))  # a retry: nothing published again (applied, or a moment ago)
    return {
        "event_id": result["event_id"],
        "type": "subject.erased",
        "tenant": tenant,
        "subject": subject,
        "partition": result["partition"],
        "offset": result["offset"],
        **({"duplicate": True} if duplicate else {}),
        **effect_pending(tenant, result["event_id"], applied=result["effect"] == "applied"),
        "consistency_token": result["consistency_token"],
    }


def effect_pending(tenant: str, event_id: str, *, applied: bool = False, erased: bool = False) -> dict[str, Any]:
    """What a write answers of its effect: only what is known when it answers.

    The event is in the ledger; the projection applies it moments later (`pending`, also for a retry of one
    published a moment ago), or had applied it already when this was a retry (`applied`; `erased` when its subject
    was erased since, so it does nothing now). What it did (or why it did nothing, a dead letter) is the event's
    status.
    """
    path = f"/v1/events/{path_segment(event_id)}?tenant={quote(tenant, safe='')}"
    return {"effect": "erased" if erased else "applied" if applied else "pending", "status_url": path}


def _retraction(p: ForgetParams) -> dict[str, Any]:
    return {
        "type": EventType.RETRACTED.value,
        "tenant": p.tenant,
        "subject": p.subject,
        "key": p.key,
        "scope": p.scope,
        "target_version": p.target_version,
        "reason": p.reason,
        "event_id": p.event_id,
    }


async def _door_knows(res: Resources, tenant: str, event_id: str) -> bool:
    """Whether a door already took `event_id` of `tenant` (claimed, applied, or applied and erased since)."""
    async with res.pool.connection(timeout=res.settings.pg_door_check_timeout_s) as conn:
        fate = await event_fate(conn, tenant, event_id, res.settings.topic)
    return fate.applied is not None or fate.erased or fate.claimed_at is not None


async def _forget_target(res: Resources, p: ForgetParams) -> tuple[dict[str, Any], str | None, str | None]:
    """The retraction `forget` publishes, the memory_id of what it retracts (an episode's is its own, not the
    retraction's), and a note when PostgreSQL could not be asked whether it exists (then no memory_id).

    It names the fact (`key`, `scope`) or one version (`target_version`: of a fact, or an episode, which has no
    key); one that the tenant's projection does not hold is refused, 404 naming the field, rather than published
    to have no effect. Only the caller's tenant is looked at.
    """
    event = _retraction(p)
    try:
        async with res.pool.connection(timeout=res.settings.pg_door_check_timeout_s) as conn:
            now = datetime.now(UTC)  # the retraction's valid time: the door dates it when it publishes
            # -> what it names, and when it next holds if nothing of it holds now (None: something does, or never)
            if p.target_version is not None:
                cur = await conn.execute(
                    "SELECT key, scope, kind, memory_id, CASE WHEN valid_from > %s THEN valid_from END "
                    "FROM fact_versions WHERE tenant = %s AND subject = %s AND version_id = %s",
                    (now, p.tenant, p.subject, p.target_version),
                )
            else:
                cur = await conn.execute(
                    "SELECT key, scope, kind, memory_id, CASE WHEN NOT bool_or(valid_from <= %(now)s AND "
                    "coalesce(least(valid_to, superseded_at) > %(now)s, true)) OVER () "  # its end: either
                    "THEN min(valid_from) FILTER (WHERE valid_from > %(now)s) OVER () END "
                    "FROM fact_versions WHERE tenant = %(tenant)s AND memory_id = %(memory_id)s LIMIT 1",
                    {"now": now, "tenant": p.tenant, "memory_id": memory_id_for(p.tenant, p.subject, p.key, p.scope)},
                )
            row = await cur.fetchone()
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:  # cannot tell: publish, and say so
        log.warning("forget: the target was not looked up: %s: %s", type(exc).__name__, exc)
        return event, None, f"postgres could not be asked whether it exists ({type(exc).__name__})"
    pending = "nothing is known of it in the projection (an assertion still pending is not seen: retry once applied)"
    if row is None and p.target_version is not None:
        message = f"no version {p.target_version!r} of subject {p.subject!r} in tenant {p.tenant!r}: {pending}"
        raise ApiError(404, "not_found", message, "target_version")
    if row is None:
        message = f"no fact {p.key!r} (scope {p.scope!r}) of subject {p.subject!r} in tenant {p.tenant!r}: {pending}"
        raise ApiError(404, "not_found", message, "key")
    key, scope, kind, memory_id, later = row
    if p.target_version is not None and p.key is not None and (p.key, p.scope) != (key, scope):
        what = "an episode" if kind == "episodic" else f"a version of key {key!r} (scope {scope!r})"
        message = f"target_version {p.target_version!r} is {what}: leave key out, or name its own"
        raise ApiError(422, "invalid_value", message, "key")
    if later is not None:  # a retraction ends what holds at its time: published now, it would end nothing
        field = "target_version" if p.target_version is not None else "key"
        what = f"version {p.target_version!r}" if p.target_version is not None else f"fact {p.key!r}"
        message = (
            f"{what} holds from {rfc3339(later)}, after now: a retraction now would end nothing (forget it once "
            "it holds, or publish memory.retracted with valid_from at or after its start)"
        )
        raise ApiError(422, "invalid_value", message, field)
    # a version named alone stays so in the event: the worker finds its fact from it, so the same call again is the
    # same event whether or not the target is still there to look at (a retry after its subject's erasure)
    return event, memory_id, None


async def forget(res: Resources, tenants: frozenset[str], p: ForgetParams, after: str | None = None) -> dict[str, Any]:
    """Retract a fact, one version of a fact, or an episode (a `memory.retracted` through the door; see
    `_forget_target`) or erase the subject (`erase_subject`). `after`: writes the target may be among (an MCP
    session's own): the target is looked for once the projection has them, or has waited its bound for them.

    `{"action": "retract"|"erase", ...the door's or the erasure's answer, "effect", "status_url"}`: what was asked
    and that it is in the ledger, never that it took effect (`effect_pending`); its status says what it did.
    """
    check_tenant(p.tenant, tenants)
    if p.erase_subject:
        if p.key is not None or p.target_version is not None:
            field = "key" if p.key is not None else "target_version"
            raise ApiError(422, "invalid_value", f"{field} retracts one fact: leave it out to erase the subject", field)
        erased = await erase_subject(res, tenants, p.tenant, p.subject, p.reason, p.event_id, literal=p.literal)
        return {"action": "erase", **erased}
    if p.literal:  # a retraction names a stored fact or version exactly: literal would be ignored, so it is refused
        raise ApiError(
            422, "invalid_value", "literal goes with erase_subject: a retraction names its target", "literal"
        )
    if p.key is None and p.target_version is None:
        message = "key (or target_version) is required to retract a fact or an episode (or set erase_subject)"
        raise ApiError(422, "missing_field", message, "key")
    if after is not None:
        try:
            await wait_after(res, p.tenant, after, "projection")
        except ApiError as exc:  # not there yet: the target is looked for all the same (a 404 says it may be pending)
            if exc.code != "not_yet":
                raise
    try:
        event, memory_id, unchecked = await _forget_target(res, p)
    except ApiError as exc:
        # the same call again, its target erased (or otherwise gone) since the first took its id: the door answers
        # it as the retry it is (duplicate; event_id_conflict for other content), not 404 as if never asked
        if exc.status != 404 or p.event_id is None or not await _door_knows(res, p.tenant, p.event_id):
            raise
        event, memory_id, unchecked = _retraction(p), None, None
    done = await publish_one(res, tenants, event)
    return {
        "action": "retract",
        **done,  # with its effect_pending
        **({"memory_id": memory_id} if memory_id else {}),
        **({"target_note": unchecked} if unchecked else {}),
    }
