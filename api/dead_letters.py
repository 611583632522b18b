"""The dead-letter workflow as functions, shared by the HTTP routes (api.routes.dead_letters) and the MCP tools.

An operator lists a tenant's letters, opens one, and resolves it with an event through the one publish door
(re-drive: the corrected event; discard: `deadletter.discarded`), so nothing leaves the log and every action is on
the ledger. Only letters whose record names the tenant are read or resolved; the door answers `pending` until the
worker applies the resolution. One resolution a letter: every resolution claims the letter's own id
(`letter_id`) at the door, as its event id or beside the re-driven event's own, so a retry of the same resolution is
a duplicate and any other, even one sent before the first is applied, is 409 `dead_letter_resolved`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.consistency import check_applied
from api.deps import MAX_OFFSET, MAX_PARTITION, Named, Storable, check_tenant, cursor_place
from api.errors import ApiError
from api.requests import TENANT, TENANT_NOTE
from api.resources import Resources
from api.writes import publish_one
from producers.contract import EventType, InvalidEvent, from_dict, letter_id, load_record
from producers.keys.envelope import MAX_SEALED_BYTES, Envelope, open_envelope, parse_envelope
from producers.keys.store import KekError, key_states, settings_keks
from producers.settings import Settings
from projections import shapes
from projections.postgres import connection
from projections.postgres.dead_letters import State, dead_letter, list_dead_letters
from projections.postgres.idempotency import claim_events, letter_claim, release_claims

__all__ = [
    "DISCARD_SUBJECT",
    "letter_id",
    "DeadLetterParams",
    "DeadLettersParams",
    "DiscardParams",
    "RedriveParams",
    "MAX_PAGE",
    "discard_dead_letter",
    "list_letters",
    "open_letter",
    "parse_after",
    "redrive_dead_letter",
]

log = logging.getLogger(__name__)

MAX_PAGE = 500
DISCARD_SUBJECT = "dead-letters"  # a discard's subject when the record names none the contract takes
MAX_RAW_TEXT = 4096  # characters of an undecodable record shown when opening it (its size is given too)


class DeadLettersParams(BaseModel):
    """`GET /v1/dead-letters` as one model (the MCP `dead_letters` tool)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(description=TENANT_NOTE, **TENANT)
    state: Literal["open", "redriven", "discarded"] | None = Field(
        None, description="only the letters in this state: open, redriven (re-driven) or discarded"
    )
    after: str | None = Field(None, max_length=32, description="PARTITION:OFFSET: the previous page's `next`")
    limit: int = Field(100, ge=1, le=500, strict=True, description="at most this many letters")


class DeadLetterParams(BaseModel):
    """`GET /v1/dead-letters/{partition}/{offset}` as one model (the MCP `dead_letter` tool)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(description=TENANT_NOTE, **TENANT)
    partition: int = Field(
        ge=0, le=MAX_PARTITION, strict=True, description="the dead letter's partition of the ledger topic"
    )
    offset: int = Field(ge=0, le=MAX_OFFSET, strict=True, description="the dead letter's offset in that partition")


class RedriveParams(DeadLetterParams):
    """The MCP `redrive_dead_letter` tool: the corrected event for the dead letter."""

    event: dict[str, Any] = Field(description="the corrected event (its tenant defaults to the call's)")


class DiscardParams(DeadLetterParams):
    """The MCP `discard_dead_letter` tool: close the dead letter without a correction."""

    reason: Named = Field(min_length=1, max_length=1024, description="why it is discarded (kept on the event)")


def parse_after(after: str | None, field: str = "after") -> tuple[int, int] | None:
    """The page cursor `PARTITION:OFFSET` (the last letter of the previous page), or a 422 naming `field`."""
    if after is None:
        return None
    try:
        return cursor_place(after)
    except ValueError as exc:
        raise ApiError(422, "invalid_value", f"{exc} (its `next`)", field) from None


async def list_letters(
    res: Resources,
    tenants: frozenset[str],
    tenant: str,
    state: State | None = None,
    after: str | None = None,
    limit: int = 100,
) -> shapes.DeadLettersResponse:
    """The tenant's dead letters in ledger position order, at most `limit` (1..MAX_PAGE); `next` pages on."""
    check_tenant(tenant, tenants)
    cursor = parse_after(after)
    limit = min(limit, MAX_PAGE)
    async with res.pool.connection() as conn:  # one more than the page: `next` only when something follows
        if cursor is not None:
            await check_applied(res, conn, cursor, "after")
        letters = await list_dead_letters(conn, tenant, res.settings.topic, state=state, after=cursor, limit=limit + 1)
    last = letters[limit - 1] if len(letters) > limit else None
    letters = letters[:limit]
    return {
        "tenant": tenant,
        "state": state,
        "dead_letters": letters,
        "next": None if last is None else f"{last['partition']}:{last['offset']}",
    }


async def _letter(
    res: Resources, tenant: str, partition: int, offset: int
) -> tuple[shapes.DeadLetter, bytes | None, str | None]:
    async with res.pool.connection() as conn:
        found = await dead_letter(conn, tenant, res.settings.topic, partition, offset)
    if found is None:
        raise ApiError(
            404, "not_found", f"no dead letter at partition {partition}, offset {offset} in tenant {tenant!r}", "offset"
        )
    return found


async def open_letter(
    res: Resources, tenants: frozenset[str], tenant: str, partition: int, offset: int
) -> shapes.DeadLetterRecord:
    """One dead letter of the tenant with its record: `record` (the JSON object as far as it decodes; a sealed
    record's personal fields only if they open here, `sealed` says what became of them), else `raw_text`."""
    check_tenant(tenant, tenants)
    letter, raw, _ = await _letter(res, tenant, partition, offset)
    if raw is None and letter["reason"]["code"] != "empty":  # not a null record: bytes an erasure withheld
        return letter | {"size": 0, "record": None, "withheld": True}
    return letter | await run_in_threadpool(_record_view, res.settings, raw)


def _record_view(settings: Settings, raw: bytes | None) -> dict[str, Any]:
    """What the record's bytes say, as far as they decode (pure but for opening a sealed record's data key)."""
    view: dict[str, Any] = {"size": len(raw or b"")}
    try:
        data = load_record(raw, MAX_SEALED_BYTES)
        envelope = parse_envelope(data)
    except InvalidEvent:
        data, envelope = None, None
    if isinstance(data, dict) and envelope is None:
        return view | {"record": data}
    if envelope is None:  # not a JSON object: the text as far as it goes
        text = (raw or b"").decode("utf-8", "replace").replace("\x00", "\\u0000")
        return view | {"record": None, "raw_text": text[:MAX_RAW_TEXT]}
    opened, why = _open_sealed(settings, envelope)
    sealed = {"key_id": envelope.key_id, "opened": opened is not None} | ({"why": why} if why else {})
    return view | {"record": {**envelope.clear, **(opened or {})}, "sealed": sealed}


def _open_sealed(settings: Settings, envelope: Envelope) -> tuple[dict[str, Any] | None, str | None]:
    """The sealed fields, opened with the record's data key if this API can; else None and why not."""
    keks = settings_keks(settings)
    if keks is None:
        return None, "this API holds no key-encryption key"
    try:
        with connection.connect(settings.pg_dsn, settings.pg_schema) as conn, conn.cursor() as cur:
            state = key_states(cur, settings.keys_schema, keks, [envelope.key_id]).get(envelope.key_id)
    except KekError as exc:
        return None, f"the data key is wrapped by a key-encryption key this API does not hold: {exc}"
    if state is None:
        return None, "the key store has no such data key"
    if state.destroyed:
        return None, "the data key was destroyed by an erasure of its subject"
    tenant, subject = envelope.tenant, envelope.clear.get("subject")
    if not isinstance(tenant, str) or not isinstance(subject, str) or not state.owns(tenant, subject):
        return None, "the data key belongs to another subject"
    try:
        return open_envelope(envelope, state.key), None  # type: ignore[arg-type]
    except InvalidEvent as exc:
        return None, exc.message


def _open(letter: shapes.DeadLetter, partition: int, offset: int) -> None:
    if letter["state"] != "open":
        r = letter["resolution"]
        raise ApiError(
            409,
            "dead_letter_resolved",
            f"the dead letter at partition {partition}, offset {offset} is {letter['state']} already "
            f"(by {_by(r['event_id'])} at partition {r['partition']}, offset {r['offset']})",
            "offset",
        )


def _by(event_id: str | None) -> str:
    return "an event whose subject was erased since" if event_id is None else f"event {event_id!r}"


async def redrive_dead_letter(
    res: Resources, tenants: frozenset[str], tenant: str, partition: int, offset: int, event: Any
) -> shapes.DeadLetterAction:
    """Publish the corrected `event` through the door, linked to the tenant's open dead letter at (partition,
    offset) by its `dead_letter` field; the door's answer (`effect: pending`, `status_url`) with the link."""
    check_tenant(tenant, tenants)
    link = {"partition": partition, "offset": offset}
    if not isinstance(event, dict):
        raise ApiError(422, "not_an_object", "the corrected event must be a JSON object", "event")
    if event.get("tenant", tenant) != tenant:
        raise ApiError(422, "invalid_value", f"the corrected event must be of tenant {tenant!r}", "event.tenant")
    if event.get("dead_letter") not in (None, link):
        raise ApiError(422, "invalid_value", "names another dead letter than the one re-driven", "event.dead_letter")
    if event.get("type") == EventType.DISCARDED.value:
        raise ApiError(422, "invalid_value", "a re-drive is the corrected event: discard with /discard", "event.type")
    letter, _, _ = await _letter(res, tenant, partition, offset)
    _open(letter, partition, offset)
    corrected = {**event, "tenant": tenant, "dead_letter": link}
    claimed: tuple[str, str, str] | None = None
    if corrected.get("event_id") is None:  # the letter's own id: a retry is a duplicate, another re-drive a conflict
        corrected["event_id"] = letter_id(partition, offset)
    else:  # the re-driven event keeps its id (the producer's status of it resolves): the letter's id is claimed too
        claimed = await _claim_letter(res, tenant, partition, offset, corrected)
    try:
        result = await publish_one(res, tenants, corrected, resolutions=True)
    except ApiError as exc:  # the door names the field relative to the event
        _resolved_meanwhile(exc, partition, offset, corrected["event_id"])
        if exc.status == 422 and claimed is not None:
            await _release_letter(res, claimed)  # refused before anything was published: the letter stays open
        raise ApiError(exc.status, exc.code, exc.message, _within("event", exc.field), headers=exc.headers) from None
    return {"dead_letter": link, **result}


async def _claim_letter(
    res: Resources, tenant: str, partition: int, offset: int, event: dict[str, Any]
) -> tuple[str, str, str] | None:
    """Claim the letter's id for a re-drive under an id of its own, with a fingerprint of the corrected event and
    that id: the same re-drive again passes (its own id then makes it a duplicate), any other resolution is refused,
    even the same correction under another id (it would be applied twice). An event the contract refuses claims
    nothing: the door names its field next. The claim made (tenant, id, fingerprint), to release on a refusal."""
    try:
        parsed = from_dict(event)
    except InvalidEvent:
        return None
    claim_of = letter_claim(parsed)
    async with res.pool.connection() as conn:
        (claim,) = await claim_events(conn, [claim_of])
    if claim.state == "conflict" or claim.state == "erased":
        raise _being_resolved(partition, offset)
    return claim_of


async def _release_letter(res: Resources, claim: tuple[str, str, str]) -> None:
    """Release the letter's claim of a refused re-drive; PostgreSQL failing then keeps it (the refusal stands)."""
    try:
        async with res.pool.connection(timeout=res.settings.pg_door_check_timeout_s) as conn:
            await release_claims(conn, [claim])
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        log.warning("dead letter %s: a refused re-drive's claim was kept: %s: %s", claim[1], type(exc).__name__, exc)


def _resolved_meanwhile(exc: ApiError, partition: int, offset: int, event_id: str) -> None:
    """A conflict on the letter's own id is another resolution of the letter (applied, erased or in flight)."""
    if exc.code == "event_id_conflict" and event_id == letter_id(partition, offset):
        raise _being_resolved(partition, offset) from None


def _being_resolved(partition: int, offset: int) -> ApiError:
    return ApiError(
        409,
        "dead_letter_resolved",
        f"the dead letter at partition {partition}, offset {offset} is resolved already, or being resolved, by "
        f"another event (one resolution a letter; what resolved it: GET /v1/dead-letters/{partition}/{offset}, or "
        f"the status of the event that resolves it)",
        "offset",
    )


async def discard_dead_letter(
    res: Resources, tenants: frozenset[str], tenant: str, partition: int, offset: int, reason: str
) -> shapes.DeadLetterAction:
    """Publish `deadletter.discarded` with `reason` for the tenant's open dead letter at (partition, offset)."""
    check_tenant(tenant, tenants)
    letter, _, filed_under = await _letter(res, tenant, partition, offset)
    _open(letter, partition, offset)
    link = {"partition": partition, "offset": offset}
    event = {
        "type": EventType.DISCARDED.value,
        "tenant": tenant,
        "event_id": letter_id(partition, offset),
        # in the audit replay of the subject the letter is filed under, and erased with it (as the letter is)
        "subject": filed_under or DISCARD_SUBJECT,
        "dead_letter": link,
        "reason": reason,
        "source": {"type": "system", "service": "dead-letters"},
    }
    try:
        result = await publish_one(res, tenants, event, resolutions=True)
    except ApiError as exc:
        _resolved_meanwhile(exc, partition, offset, event["event_id"])
        raise
    return {"dead_letter": link, **result}


def _within(prefix: str, field: str | None) -> str:
    return prefix if field is None else f"{prefix}.{field}"
