"""The stored positions: partition -> next_offset of one (consumer, topic), read in one way.

The projections commit each batch's rows and positions in one transaction, so these numbers are exactly what
PostgreSQL holds of a topic; "caught up" means they reach the topic's end offsets. Readers (the API's lag and
read-your-writes waits, a rebuild's switch-over, tests) and the writers' `lock_positions` / `advance_positions`
all go through here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import psycopg
from psycopg import sql

from producers.settings import Settings
from projections.postgres.connection import held

__all__ = [
    "QUEUE_READ_PREPARED",
    "advance_positions",
    "lock_positions",
    "reached_async",
    "read_positions",
    "search_pending_async",
    "stored_positions",
    "stored_positions_async",
    "wait_for_positions",
]

_SELECT = sql.SQL('SELECT "partition", next_offset FROM {} WHERE consumer = %s AND topic = %s')


def _query(schema: str | None) -> sql.Composed:
    return _SELECT.format(sql.Identifier(schema, "positions") if schema else sql.Identifier("positions"))


def stored_positions(
    conn: psycopg.Connection | psycopg.Cursor, consumer: str, topic: str, *, schema: str | None = None
) -> dict[int, int]:
    """partition -> next_offset; `schema` None: the `positions` table on the search_path."""
    return {p: o for p, o in conn.execute(_query(schema), (consumer, topic)).fetchall()}


async def stored_positions_async(conn: psycopg.AsyncConnection, consumer: str, topic: str) -> dict[int, int]:
    """`stored_positions` on an async connection whose search_path is the projection schema (the API pool)."""
    cur = await conn.execute(_query(None), (consumer, topic))
    return {p: o for p, o in await cur.fetchall()}


async def reached_async(
    conn: psycopg.AsyncConnection, consumer: str, topic: str, targets: Mapping[int, int]
) -> tuple[bool, dict[int, int]]:
    """(every partition of `targets` stored at least at its target, the stored positions): one indexed read."""
    stored = await stored_positions_async(conn, consumer, topic)
    return all(stored.get(p, 0) >= o for p, o in targets.items()), stored


# The search stages' queues: the indexer deletes a `search_outbox` row in the transaction that wrote its document
# (queueing the version in `embed_queue` when it lacks a vector), the embedder deletes an `embed_queue` row in the
# one that queued the version's outbox row again (priority 1). Each row holds the log place of the record it stands
# for, so "none of the tenant's rows below the write's positions is left" means the write went through that stage,
# whatever the tenant wrote after it. A row queued before the places were (NULL) is below every write.
# A queue's size swings from a few rows to thousands between two reads, and a plan cached at one size (the API's
# connections keep generic plans) is wrong at the other: a read of a queue is planned at each call.
QUEUE_READ_PREPARED = False
_BELOW = (
    "EXISTS (SELECT 1 FROM unnest(%(p)s::int[], %(o)s::bigint[]) AS w(p, o) JOIN {queue} q ON q.tenant = %(tenant)s "
    'AND q."partition" = w.p AND q."offset" < w.o{only}) '
    'OR EXISTS (SELECT 1 FROM {queue} q WHERE q.tenant = %(tenant)s AND q."partition" IS NULL{only})'
)
# what each search stage waits for: documents, the outbox's rows of new or changed versions (the embedders' vector
# rewrites, priority 1, are not a document's first write); vectors, a version's every row, wherever it is now (a row
# moves from the outbox to embed_queue and back in one transaction, so one statement sees it in one of them)
_PENDING = {
    "documents": "SELECT " + _BELOW.format(queue="search_outbox", only=" AND q.priority = 0"),
    "vectors": "SELECT "
    + _BELOW.format(queue="search_outbox", only="")
    + " OR "
    + _BELOW.format(queue="embed_queue", only=""),
}


async def search_pending_async(
    conn: psycopg.AsyncConnection, stage: str, tenant: str, below: Mapping[int, int]
) -> bool:
    """Whether a search stage (`documents`, `vectors`) still has a row of `tenant` queued for a record below the
    positions `below` (partition -> next_offset, a write's token) in one of its queues."""
    parts = sorted(below.items())
    args = {"tenant": tenant, "p": [p for p, _ in parts], "o": [o for _, o in parts]}
    cur = await conn.execute(_PENDING[stage], args, prepare=QUEUE_READ_PREPARED)
    row = await cur.fetchone()
    return bool(row and row[0])


def read_positions(settings: Settings, *, consumer: str | None = None, topic: str | None = None) -> dict[int, int]:
    """The positions of `settings.processor_group` on `settings.topic` in `settings.pg_schema`, on a new connection.

    {} while the schema or its positions table does not exist yet (no worker has started on it).
    """
    with psycopg.connect(settings.pg_dsn, autocommit=True, **held(settings)) as conn:
        try:
            return stored_positions(
                conn, consumer or settings.processor_group, topic or settings.topic, schema=settings.pg_schema
            )
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return {}


def wait_for_positions(
    settings: Settings,
    targets: Mapping[int, int],
    timeout: float,
    *,
    interval: float = 0.2,
    check: Callable[[], object] | None = None,
) -> dict[int, int]:
    """Poll until the stored position of every partition in `targets` is at least its target; return them.

    `check()` is called every round and may raise (e.g. the worker expected to get there has died).
    TimeoutError after `timeout` seconds, naming the targets and the last positions read.
    """
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        stored = read_positions(settings)
        if all(stored.get(p, 0) >= o for p, o in targets.items()):
            return stored
        if time.monotonic() > deadline:
            raise TimeoutError(f"positions did not reach {dict(targets)} in {timeout:.0f}s (last: {stored})")
        time.sleep(interval)


def lock_positions(cur: psycopg.Cursor, consumer: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Inside a batch transaction: create missing position rows (at 0), lock them in partition order, read them.

    The first statement of a batch touches `positions`: a schema switch (`ledger rebuild`) holding its lock makes
    it wait and then resolve the name to the new schema.
    """
    cur.execute(
        'INSERT INTO positions (consumer, topic, "partition", next_offset) '
        "SELECT %s, %s, p, 0 FROM unnest(%b::int[]) AS p ON CONFLICT DO NOTHING",
        (consumer, topic, partitions),
    )
    cur.execute(
        'SELECT "partition", next_offset FROM positions WHERE consumer = %s AND topic = %s '
        'AND "partition" = ANY(%s) ORDER BY "partition" FOR UPDATE',
        (consumer, topic, partitions),
    )
    return {p: o for p, o in cur.fetchall()}


def advance_positions(cur: psycopg.Cursor, consumer: str, topic: str, ends: Mapping[int, int]) -> None:
    """Inside the same transaction: move each partition's position forward to `ends[p]` (never backwards)."""
    cur.execute(
        "UPDATE positions SET next_offset = GREATEST(positions.next_offset, v.next_offset), updated_at = now() "
        "FROM unnest(%b::int[], %b::bigint[]) AS v(p, next_offset) "
        'WHERE consumer = %s AND topic = %s AND "partition" = v.p',
        (list(ends), list(ends.values()), consumer, topic),
    )
