"""What a receipt (api.receipts) reads of the projection: the positions and the erasure salt when it is made, the
events it cites with their chain links, and, when it is checked, what the ledger holds at the places it cites.

Ids, fingerprints, positions and links only: nothing here reads a value or a text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import orjson
import psycopg

from projections.postgres.idempotency import ID_HASH_SQL
from projections.postgres.queries import shaped
from projections.postgres.recorder import VERSION_COLUMNS

__all__ = [
    "BASIS_COLUMNS",
    "CITED_COLUMNS",
    "Basis",
    "CitedRow",
    "Erasure",
    "erased_versions",
    "erasures_after",
    "held_at",
    "links_at",
    "receipt_rows",
    "receipt_state",
]


@dataclass(frozen=True, slots=True)
class CitedRow:
    """An `events` row a receipt cites, with the chain link of its record (None: taken before the chain)."""

    event_id: str
    memory_id: str | None
    partition: int
    offset: int
    fingerprint: str
    subject: str
    link: bytes | None


def _rows(rows: Sequence[tuple]) -> list[CitedRow]:
    return [CitedRow(eid, mid, p, o, fp, s, None if h is None else bytes(h)) for eid, mid, p, o, fp, s, h in rows]


async def receipt_state(conn: psycopg.AsyncConnection, consumer: str, topic: str) -> tuple[bytes, dict[int, int]]:
    """The schema's erasure salt (the receipts' digest key: a rebuild keeps it) and the stored positions."""
    salt, positions, _ = await receipt_rows(conn, consumer, topic, "", ())
    return salt, positions


# one statement, one round trip: what a receipt is made of (recall's latency pays for it on every answer). The ids go
# in, and the cited rows come out, as one JSON text: psycopg would dump and load an audit replay's ten thousand of
# them element by element in Python, on the event loop
_RECEIPT = """
SELECT (SELECT value FROM meta WHERE name = 'erasure_salt'),
       (SELECT coalesce(jsonb_object_agg("partition", next_offset), '{}'::jsonb) FROM positions
        WHERE consumer = %(consumer)s AND topic = %(topic)s),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(e.event_id, e.memory_id, e."partition", e."offset", e.fingerprint,
                                                    e.subject, encode(l.link, 'hex'))), '[]'::jsonb)::text
        FROM events e LEFT JOIN chain_links l ON l.consumer = %(consumer)s AND l.topic = %(topic)s
          AND l."partition" = e."partition" AND l."offset" = e."offset"
        WHERE e.tenant = %(tenant)s AND e.event_id = ANY(ARRAY(SELECT jsonb_array_elements_text(%(ids)s::jsonb))))"""


async def receipt_rows(
    conn: psycopg.AsyncConnection, consumer: str, topic: str, tenant: str, event_ids: Sequence[str]
) -> tuple[bytes, dict[int, int], dict[str, CitedRow]]:
    """The erasure salt, the stored positions, and event_id -> its `events` row and link for the tenant's events
    among `event_ids`: in one statement (indexed reads)."""
    args = {"consumer": consumer, "topic": topic, "tenant": tenant, "ids": orjson.dumps(list(event_ids)).decode()}
    cur = await conn.execute(_RECEIPT, args)
    row = await cur.fetchone()
    assert row is not None
    salt, positions, cited = row
    found = await shaped(
        len(event_ids),  # an audit replay's thousands: in a worker thread (queries.shaped)
        lambda: {
            eid: CitedRow(eid, mid, p, o, fp, subject, None if link is None else bytes.fromhex(link))
            for eid, mid, p, o, fp, subject, link in orjson.loads(cited)
        },
    )
    return bytes.fromhex(salt or ""), _positions(positions), found


def _positions(stored: Mapping[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in stored.items()}


# What a read that shows fact versions adds to its select list so that the receipt of its answer needs no read of
# its own (Basis): the salt and the positions (uncorrelated: evaluated once per statement, in its snapshot, where the
# projection advanced them in the transaction that wrote the rows; as text, parsed once). What it cites of each row
# is on the row itself (CITED_COLUMNS: the recorder writes them with it), so nothing is probed per row.
# `%(consumer)s` and `%(topic)s` are the statement's parameters (Basis.params).
BASIS_COLUMNS = """(SELECT value FROM meta WHERE name = 'erasure_salt') AS receipt_salt,
       (SELECT coalesce(jsonb_object_agg("partition", next_offset), '{}'::jsonb) FROM positions
        WHERE consumer = %(consumer)s AND topic = %(topic)s)::text AS receipt_positions"""
# what a receipt cites of a fact_versions row `f` besides its own columns (event_id, memory_id, subject, partition,
# offset): its event's fingerprint and its record's chain link (schema.sql)
CITED_COLUMNS = "f.fingerprint AS receipt_fingerprint, f.link AS receipt_link"


# where the fact_versions columns a receipt cites stand in a row of VERSION_COLUMNS
_CITED_AT = tuple(VERSION_COLUMNS.index(c) for c in ("event_id", "memory_id", "partition", "offset"))
_SUBJECT_AT = VERSION_COLUMNS.index("subject")


@dataclass(slots=True)
class Basis:
    """What a receipt is made of (the salt, the positions, the cited events' rows and links), gathered by the reads
    that made its answer (BASIS_COLUMNS and CITED_COLUMNS in their statements), so that issuing it takes no
    connection and no statement.

    `found`: event_id -> its row as a receipt cites it; a row without its citation (written before the columns) is
    left out, so a receipt citing it reads it (`covers`). `positions`: the latest read's (positions only move
    forward), so every row read lies below them."""

    consumer: str
    topic: str
    salt: bytes = b""
    positions: dict[int, int] | None = None
    found: dict[str, CitedRow] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)  # recall's: the access signals that ordered its ties

    # what a read of fact_versions rows `f` adds to its select list, in this order (take_versions reads them so)
    COLUMNS: ClassVar[tuple[str, str]] = (CITED_COLUMNS, BASIS_COLUMNS)

    def params(self) -> dict[str, str]:
        return {"consumer": self.consumer, "topic": self.topic}

    def take(self, rows: Sequence[dict[str, Any]]) -> None:
        """Pop the BASIS_COLUMNS and CITED_COLUMNS off each row of a statement (dict rows of fact_versions columns),
        keeping what they hold."""
        if not rows:
            return
        self._stand(rows[0]["receipt_salt"], rows[0]["receipt_positions"])
        for row in rows:
            del row["receipt_salt"], row["receipt_positions"]
            fingerprint, link = row.pop("receipt_fingerprint"), row.pop("receipt_link")
            self._cite(
                row["event_id"], row["memory_id"], row["partition"], row["offset"], fingerprint, row["subject"], link
            )

    def take_versions(self, rows: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
        """take() for tuple rows of VERSION_COLUMNS followed by COLUMNS' four: the rows without those four, and
        without the row of positions alone that an empty answer reads (its version_id is NULL)."""
        if not rows:
            return []
        self._stand(*rows[0][-2:])
        kept = [row for row in rows if row[0] is not None]
        for row in kept:
            self._cite(*(row[i] for i in _CITED_AT), row[-4], row[_SUBJECT_AT], row[-3])
        return [row[:-4] for row in kept]

    def _stand(self, salt: str | None, positions: str) -> None:
        self.salt = bytes.fromhex(salt or "")
        before = self.positions or {}
        stored = _positions(orjson.loads(positions))
        self.positions = {q: max(n, before.get(q, 0)) for q, n in stored.items()}

    def _cite(
        self, eid: str, mid: str | None, partition: int, offset: int, fingerprint: str | None, subject: str, link: Any
    ) -> None:
        if fingerprint is not None:  # a row written before its citation's columns: left out (`covers`)
            self.found[eid] = CitedRow(
                eid, mid, partition, offset, fingerprint, subject, None if link is None else bytes(link)
            )

    def covers(self, event_ids: Sequence[str]) -> bool:
        """Whether every one of `event_ids` was read here (a receipt of them needs no read of its own)."""
        return self.positions is not None and all(eid in self.found for eid in event_ids)


def _ints(values: Iterable[int]) -> str:
    """An int[] or bigint[] parameter as its text literal: psycopg dumps a list item by item in Python, and a
    receipt's 10,000 places would take tens of milliseconds of the event loop; this is one join."""
    return "{" + ",".join([str(int(v)) for v in values]) + "}"


async def held_at(
    conn: psycopg.AsyncConnection, consumer: str, topic: str, places: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], tuple[str, CitedRow]]:
    """(partition, offset) -> (tenant, the events row there with its link), for the places that hold one."""
    if not places:
        return {}
    cur = await conn.execute(
        'SELECT e.tenant, e.event_id, e.memory_id, e."partition", e."offset", e.fingerprint, e.subject, l.link '
        "FROM unnest(%(p)s::int[], %(o)s::bigint[]) AS q(p, o) "
        'JOIN events e ON e."partition" = q.p AND e."offset" = q.o '
        'LEFT JOIN chain_links l ON l.consumer = %(consumer)s AND l.topic = %(topic)s AND l."partition" = q.p '
        'AND l."offset" = q.o',
        {"p": _ints(p for p, _ in places), "o": _ints(o for _, o in places), "consumer": consumer, "topic": topic},
    )
    return {(r[3], r[4]): (r[0], _rows([r[1:]])[0]) for r in await cur.fetchall()}


async def links_at(
    conn: psycopg.AsyncConnection, consumer: str, topic: str, places: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> the stored chain link there (kept through an erasure: it hashes sealed bytes)."""
    if not places:
        return {}
    cur = await conn.execute(
        'SELECT l."partition", l."offset", l.link FROM unnest(%(p)s::int[], %(o)s::bigint[]) AS q(p, o) '
        'JOIN chain_links l ON l.consumer = %(consumer)s AND l.topic = %(topic)s AND l."partition" = q.p '
        'AND l."offset" = q.o',
        {"p": _ints(p for p, _ in places), "o": _ints(o for _, o in places), "consumer": consumer, "topic": topic},
    )
    return {(p, o): bytes(h) for p, o, h in await cur.fetchall()}


async def erased_versions(conn: psycopg.AsyncConnection, tenant: str, version_ids: Sequence[str]) -> set[str]:
    """Those of `version_ids` an erasure of the tenant purged (`erased_versions`, salted hashes)."""
    if not version_ids:
        return set()
    cur = await conn.execute(  # the ids as one JSON array: orjson writes it at once (as `_ints`, for text)
        f"SELECT v FROM jsonb_array_elements_text(%s::jsonb) AS q(v) WHERE EXISTS (SELECT 1 FROM erased_versions e "
        f"WHERE e.tenant = %s AND e.id_hash = {ID_HASH_SQL.format('q.v')})",
        (orjson.dumps(list(version_ids)).decode(), tenant),
    )
    return {v for (v,) in await cur.fetchall()}


@dataclass(frozen=True, slots=True)
class Erasure:
    """A subject.erased tombstone: where and when (its observed_at), and its subject (only to match a digest)."""

    subject: str
    partition: int
    offset: int
    at: datetime


async def erasures_after(
    conn: psycopg.AsyncConnection, tenant: str, places: Sequence[tuple[int, int]]
) -> list[Erasure]:
    """The tenant's erasure tombstones logged after any of `places` in its partition, in log order."""
    if not places:
        return []
    first: dict[int, int] = {}
    for p, o in places:
        first[p] = min(o, first.get(p, o))
    cur = await conn.execute(
        'SELECT e.subject, e."partition", e."offset", e.observed_at FROM unnest(%s::int[], %s::bigint[]) AS q(p, o) '
        "JOIN events e ON e.tenant = %s AND e.type = 'subject.erased' AND e.\"partition\" = q.p "
        'AND e."offset" > q.o ORDER BY e."partition", e."offset"',
        (_ints(first), _ints(first.values()), tenant),
    )
    return [Erasure(*r) for r in await cur.fetchall()]
