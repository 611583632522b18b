"""The dead-letter workflow's reads: a tenant's dead letters with what became of each, and one letter's record.

A letter is `open` until an event of its tenant resolves it (`dead_letter_resolutions`, written by the recorder in
the transaction of that event): `redriven` by the corrected event, or `discarded` with a reason. Only letters whose
record names the tenant (`dead_letters.tenant`, as the record claims it) are ever read here; a record that names no
tenant (undecodable bytes) belongs to none and is not listed to anyone through the tenant API.
"""

from __future__ import annotations

from typing import Any, Literal

import psycopg

from producers.contract import rfc3339
from projections import shapes

__all__ = ["STATES", "State", "dead_letter", "dead_letter_states", "list_dead_letters"]

State = Literal["open", "redriven", "discarded"]
STATES: tuple[State, ...] = ("open", "redriven", "discarded")

_COLUMNS = (
    'd."partition", d."offset", d.code, d.field, d.message, d.event_id, d.recorded_at, '
    "r.state, r.event_id, r.by_partition, r.by_offset, r.reason, r.resolved_at"
)
_FROM = (
    'FROM dead_letters d LEFT JOIN dead_letter_resolutions r ON r.topic = d.topic AND r."partition" = d."partition" '
    'AND r."offset" = d."offset" AND r.tenant = d.tenant'
)


def _letter(row: tuple[Any, ...]) -> shapes.DeadLetter:
    p, o, code, field, message, event_id, recorded_at, state, by_id, by_p, by_o, reason, resolved_at = row[:13]
    out: shapes.DeadLetter = {
        "partition": p,
        "offset": o,
        "reason": {"code": code, "field": field, "message": message},
        "event_id": event_id,
        "recorded_at": rfc3339(recorded_at),
        "state": state or "open",
    }
    if state is not None:
        out["resolution"] = {
            "event_id": by_id,
            "partition": by_p,
            "offset": by_o,
            "reason": reason,
            "resolved_at": rfc3339(resolved_at),
        }
    return out


async def list_dead_letters(
    conn: psycopg.AsyncConnection,
    tenant: str,
    topic: str,
    *,
    state: State | None = None,
    after: tuple[int, int] | None = None,
    limit: int = 100,
) -> list[shapes.DeadLetter]:
    """The tenant's dead letters of `topic` in (partition, offset) order after `after`, at most `limit`, optionally
    only those in `state` (an index range scan of `dead_letters_tenant`)."""
    where = ["d.tenant = %s", "d.topic = %s"]
    params: list[Any] = [tenant, topic]
    if after is not None:
        where.append('(d."partition", d."offset") > (%s, %s)')
        params += list(after)
    if state == "open":
        where.append("r.state IS NULL")
    elif state is not None:
        where.append("r.state = %s")
        params.append(state)
    cur = await conn.execute(
        f'SELECT {_COLUMNS} {_FROM} WHERE {" AND ".join(where)} ORDER BY d."partition", d."offset" LIMIT %s',
        (*params, limit),
    )
    return [_letter(row) for row in await cur.fetchall()]


async def dead_letter(
    conn: psycopg.AsyncConnection, tenant: str, topic: str, partition: int, offset: int
) -> tuple[shapes.DeadLetter, bytes | None, str | None] | None:
    """The tenant's dead letter at (partition, offset) of `topic`, its record's bytes (None once an erasure took
    them) and the subject it is filed under (positioned.claimed_subject); None if it has none there."""
    cur = await conn.execute(
        f'SELECT {_COLUMNS}, d.raw, d.subject {_FROM} WHERE d.tenant = %s AND d.topic = %s AND d."partition" = %s '
        'AND d."offset" = %s',
        (tenant, topic, partition, offset),
    )
    row = await cur.fetchone()
    return None if row is None else (_letter(row), row[13], row[14])


def dead_letter_states(conn: psycopg.Connection, topic: str) -> dict[State, int]:
    """How many dead letters of `topic` are in each state, over every tenant (the worker's gauge; a bounded
    count over `dead_letters`, which holds only refused records)."""
    row = conn.execute(
        f"SELECT count(*) FILTER (WHERE r.state IS NULL), count(*) FILTER (WHERE r.state = 'redriven'), "
        f"count(*) FILTER (WHERE r.state = 'discarded') {_FROM} WHERE d.topic = %s",
        (topic,),
    ).fetchone()
    assert row is not None
    return dict(zip(STATES, row, strict=True))  # type: ignore[return-value]
