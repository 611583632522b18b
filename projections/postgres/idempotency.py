"""Idempotency keys: what the projection knows about a tenant's event ids (the API's door check).

An event id is its producer's idempotency key, scoped by tenant: (tenant, event_id). For a
published event the API asks `known_events` first:

- not known: a new event (publish it);
- known with the same `MemoryEvent.fingerprint`: a retry (answer with the stored partition/offset);
- known with another fingerprint: a conflict (refuse; the projector would dead-letter it too);
- `erased`: the id belonged to a subject that was erased since (a retry has no effect; nothing
  else about it is kept).

Only the tenant's own ids are ever looked at: nothing here can tell one tenant about another's.
Erased ids are kept as `sha256(salt || event_id)` in `erased_events` (the salt is random per
schema, in `meta`), so the ids themselves leave with the erased subject.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

__all__ = ["ID_HASH_SQL", "Known", "known_events"]

# the hash of an event id as erased_events keeps it; `{}` is the SQL expression of the event id
ID_HASH_SQL = "sha256(decode((SELECT value FROM meta WHERE name = 'erasure_salt'), 'hex') || convert_to({}, 'UTF8'))"


@dataclass(frozen=True, slots=True)
class Known:
    """One known event id of the tenant: the stored event's fingerprint and place, or erased."""

    fingerprint: str | None  # None when erased
    erased: bool
    partition: int | None
    offset: int | None


async def known_events(conn: psycopg.AsyncConnection, tenant: str, event_ids: list[str]) -> dict[str, Known]:
    """The ids of `event_ids` the tenant already used (stored, or erased since); unknown ids are absent.

    `conn`'s search_path is the projection schema (the API pool).
    """
    ids = sorted(set(event_ids))
    if not ids:
        return {}
    cur = await conn.execute(
        'SELECT event_id, fingerprint, "partition", "offset" FROM events WHERE tenant = %s AND event_id = ANY(%s)',
        (tenant, ids),
    )
    out = {eid: Known(fp, False, p, o) for eid, fp, p, o in await cur.fetchall()}
    rest = [e for e in ids if e not in out]
    if rest:
        cur = await conn.execute(
            "SELECT x.id FROM unnest(%s::text[]) AS x(id) WHERE EXISTS (SELECT 1 FROM erased_events e "
            f"WHERE e.tenant = %s AND e.id_hash = {ID_HASH_SQL.format('x.id')})",
            (rest, tenant),
        )
        for (eid,) in await cur.fetchall():
            out[eid] = Known(None, True, None, None)
    return out
