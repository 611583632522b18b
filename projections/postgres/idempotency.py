"""Idempotency keys: one content per (tenant, event_id), whichever door publishes it, and an event's fate by its id.

Before a door publishes, `claim_events` claims each id with its `MemoryEvent.fingerprint` in one atomic statement
(new, claimed, applied, erased or conflict): two doors racing on one id with two contents upsert the same row, so
the second sees the first's fingerprint. Claims hold ids and fingerprints only, and an erasure leaves only salted
digests (`erased_events`). A claim outlives a failed publish, as the record may have been written; only events
refused before sending are released, and a re-drive's claim of its letter's id once the worker has refused the
re-drive (`release_letter_claims`). `event_fate` only ever reads the tenant's own ids.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
import psycopg

from producers.contract import MemoryEvent, letter_id

__all__ = [
    "FP_HASH_SQL",
    "ID_HASH_SQL",
    "Claim",
    "Fate",
    "claim_events",
    "erased_sql",
    "event_fate",
    "letter_claim",
    "release_claims",
    "release_letter_claims",
]

_SALT = "decode((SELECT value FROM meta WHERE name = 'erasure_salt'), 'hex')"
# the hash of an event id as erased_events keeps it; `{}` is the SQL expression of the event id
ID_HASH_SQL = f"sha256({_SALT} || convert_to({{}}, 'UTF8'))"
# the erased event's fingerprint, bound to its id (fingerprints have a fixed length: the concatenation is unambiguous)
FP_HASH_SQL = f"sha256({_SALT} || convert_to({{fp}} || {{id}}, 'UTF8'))"

# new: publish it; claimed (in flight), applied, erased: the same content seen before, so this is a retry;
# conflict: another fingerprint holds the id (refused; the worker would dead-letter it as `event_id_conflict`)
ClaimState = Literal["new", "claimed", "applied", "erased", "conflict"]


@dataclass(frozen=True, slots=True)
class Claim:
    """What the store says about one (tenant, event_id) a door is about to publish."""

    state: ClaimState
    partition: int | None = None  # applied (or a conflict with an applied event): the stored event's place
    offset: int | None = None
    holder: Literal["applied", "claimed", "erased"] | None = None  # conflict: what holds the id
    letters: tuple[tuple[int, int], ...] = ()  # claimed: where records of the id were refused (dead letters)


def erased_sql(with_fingerprints: bool) -> str:
    """Which rows of `unnest(tenants, ids[, fingerprints])` name an id an erasure kept: SELECT (tenant, id), or with
    fingerprints (row number from 1, same) per row, `same` true when the erased event had that fingerprint or its
    fingerprint was not recorded (per row: one batch may re-send an erased id with two contents)."""
    if not with_fingerprints:
        return (
            "SELECT x.t, x.id FROM unnest(%b::text[], %b::text[]) AS x(t, id) WHERE EXISTS (SELECT 1 FROM "
            f"erased_events e WHERE e.tenant = x.t AND e.id_hash = {ID_HASH_SQL.format('x.id')})"
        )
    same = f"e.fp_hash IS NULL OR e.fp_hash = {FP_HASH_SQL.format(fp='x.fp', id='x.id')}"
    return (
        f"SELECT x.n, ({same}) FROM unnest(%b::text[], %b::text[], %b::text[]) WITH ORDINALITY AS x(t, id, fp, n) "
        f"JOIN erased_events e ON e.tenant = x.t AND e.id_hash = {ID_HASH_SQL.format('x.id')}"
    )


# one statement: what is applied or erased under each id, and the claim of the others (inserted, or the existing
# row read back under its lock: ON CONFLICT DO UPDATE returns the committed claim of a concurrent door, which a
# snapshot read would miss; a retry's claim, the same fingerprint, is dated anew: it is published again); claims
# are taken in (tenant, event_id) order so two requests never deadlock. The ids
# come as one jsonb array of [tenant, event_id, fingerprint] written by orjson: psycopg would dump three lists of
# 1,000 element by element in Python, on the API's event loop
_CLAIM = f"""
WITH given AS (
    SELECT r->>0 AS t, r->>1 AS id, r->>2 AS fp, n
    FROM jsonb_array_elements(%(given)s::jsonb) WITH ORDINALITY AS j(r, n)
), applied AS (
    SELECT g.t, g.id, e.fingerprint, e."partition", e."offset" FROM given g
    JOIN events e ON e.tenant = g.t AND e.event_id = g.id
), erased AS (
    SELECT g.t, g.id, (x.fp_hash IS NULL OR x.fp_hash = {FP_HASH_SQL.format(fp="g.fp", id="g.id")}) AS same
    FROM given g JOIN erased_events x ON x.tenant = g.t AND x.id_hash = {ID_HASH_SQL.format("g.id")}
    WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.t = g.t AND a.id = g.id)
), claimed AS (
    INSERT INTO event_claims AS c (tenant, event_id, fingerprint)
    SELECT g.t, g.id, g.fp FROM given g
    WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.t = g.t AND a.id = g.id)
      AND NOT EXISTS (SELECT 1 FROM erased x WHERE x.t = g.t AND x.id = g.id)
    ORDER BY g.t, g.id
    ON CONFLICT (tenant, event_id) DO UPDATE SET fingerprint = c.fingerprint,
        claimed_at = CASE WHEN c.fingerprint = EXCLUDED.fingerprint THEN now() ELSE c.claimed_at END
    RETURNING c.tenant, c.event_id, c.fingerprint, c.xmax = 0 AS fresh
)
SELECT g.fp, a.fingerprint, a."partition", a."offset", x.same, c.fingerprint, c.fresh,
    (SELECT array_agg(ARRAY[d."partition"::bigint, d."offset"]) FROM dead_letters d
     WHERE d.tenant = g.t AND d.event_id = g.id) AS letters FROM given g
LEFT JOIN applied a ON a.t = g.t AND a.id = g.id
LEFT JOIN erased x ON x.t = g.t AND x.id = g.id
LEFT JOIN claimed c ON c.tenant = g.t AND c.event_id = g.id
ORDER BY g.n
"""


async def claim_events(conn: psycopg.AsyncConnection, events: list[tuple[str, str, str]]) -> list[Claim]:
    """Claim each (tenant, event_id, fingerprint) unless applied or erased; one Claim each, in order.

    The ids must be distinct (a door answers repeats within a request itself). `conn`'s search_path is the
    projection schema (the API pool); an autocommit connection commits the claims at once, which is the point.
    """
    if not events:
        return []
    cur = await conn.execute(_CLAIM, {"given": orjson.dumps(events).decode()})
    out: list[Claim] = []
    for given, applied_fp, p, o, erased_same, claimed_fp, fresh, letters in await cur.fetchall():
        if applied_fp is not None:
            same = applied_fp == given
            out.append(Claim("applied", p, o) if same else Claim("conflict", p, o, holder="applied"))
        elif erased_same is not None:
            out.append(Claim("erased") if erased_same else Claim("conflict", holder="erased"))
        elif claimed_fp == given:
            out.append(Claim("new" if fresh else "claimed", letters=tuple((p, o) for p, o in letters or ())))
        else:
            out.append(Claim("conflict", holder="claimed"))
    return out


_RELEASE = (
    "DELETE FROM event_claims c USING unnest(%s::text[], %s::text[], %s::text[]) AS x(t, id, fp) "
    "WHERE c.tenant = x.t AND c.event_id = x.id AND c.fingerprint = x.fp"
)


def _columns(events: list[tuple[str, str, str]]) -> tuple[list[str], ...]:
    return tuple(list(col) for col in zip(*events, strict=True))


async def release_claims(conn: psycopg.AsyncConnection, events: list[tuple[str, str, str]]) -> None:
    """Drop the claims of (tenant, event_id, fingerprint) that were certainly not published (the producer refused
    them before sending, e.g. too large once encoded), so the id is free for a corrected event. A claim whose
    publishing failed at the broker stays: the record may have been written."""
    if events:
        await conn.execute(_RELEASE, _columns(events))


def letter_claim(event: MemoryEvent) -> tuple[str, str, str]:
    """The claim a re-drive under an id of its own takes of its letter's id (the door's, before publishing): the
    letter's id with a fingerprint of the corrected event and its id, so that only the same re-drive again passes."""
    assert event.dead_letter is not None
    fingerprint = hashlib.sha256(f"{event.fingerprint}\n{event.event_id}".encode()).hexdigest()
    return event.tenant, letter_id(event.dead_letter.partition, event.dead_letter.offset), fingerprint


def release_letter_claims(cur: psycopg.Cursor, refused: list[MemoryEvent]) -> None:
    """In the worker's transaction: the letter claims of re-drives under ids of their own that it refuses (their id
    was taken by other content meanwhile), so each letter stays open to another action. An applied re-drive's claim
    stays: a door that found the letter open a moment before its resolution committed must still be refused."""
    claims = [c for e in refused if e.dead_letter is not None and (c := letter_claim(e))[1] != e.event_id]
    if claims:
        cur.execute(_RELEASE, _columns(claims))


@dataclass(frozen=True, slots=True)
class Fate:
    """What the projection knows about one (tenant, event_id): applied, erased, claimed, dead letters."""

    applied: dict[str, Any] | None  # type, subject, memory_id, partition, offset of the applied event
    erased: bool
    claimed_at: datetime | None
    dead_letters: list[dict[str, Any]]  # the refused records that carried this id, in ledger order
    last_letter_at: datetime | None = None  # when the newest of them was recorded

    @property
    def claimed_since_refused(self) -> bool:
        """A door claimed the id after its last refusal (a re-drive under the same id): that claim is pending."""
        return self.claimed_at is not None and self.last_letter_at is not None and self.claimed_at > self.last_letter_at


async def event_fate(conn: psycopg.AsyncConnection, tenant: str, event_id: str, topic: str) -> Fate:
    """Everything the projection holds about (tenant, event_id) of the ledger `topic`, in one snapshot."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = await conn.execute(
            'SELECT type, subject, memory_id, "partition", "offset" FROM events WHERE tenant = %s AND event_id = %s',
            (tenant, event_id),
        )
        row = await cur.fetchone()
        applied = None
        if row is not None:
            applied = dict(zip(("type", "subject", "memory_id", "partition", "offset"), row, strict=True))
        cur = await conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM erased_events WHERE tenant = %s AND id_hash = {ID_HASH_SQL.format('%s')}), "
            "(SELECT claimed_at FROM event_claims WHERE tenant = %s AND event_id = %s)",
            (tenant, event_id, tenant, event_id),
        )
        erased, claimed_at = await cur.fetchone()  # type: ignore[misc]
        cur = await conn.execute(  # with what became of each letter: a producer asking its event's fate learns it
            'SELECT d."partition", d."offset", d.code, d.field, d.message, coalesce(r.state, \'open\'), r.event_id, '
            "d.recorded_at FROM dead_letters d LEFT JOIN dead_letter_resolutions r ON r.topic = d.topic "
            'AND r."partition" = d."partition" AND r."offset" = d."offset" AND r.tenant = d.tenant '
            'WHERE d.tenant = %s AND d.event_id = %s AND d.topic = %s ORDER BY d."partition", d."offset"',
            (tenant, event_id, topic),
        )
        rows = await cur.fetchall()
    names = ("partition", "offset", "code", "field", "message", "state")
    letters = [dict(zip(names, r[:6], strict=True)) | ({"resolved_by": r[6]} if r[6] else {}) for r in rows]
    return Fate(applied, bool(erased), claimed_at, letters, max((r[7] for r in rows), default=None))
