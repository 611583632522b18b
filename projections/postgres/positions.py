"""The stored positions: partition -> next_offset of one (consumer, topic), read in one way.

The recorder commits each batch's rows and its positions in one transaction, so these numbers are
exactly what PostgreSQL holds of the ledger. "Caught up" means they reach the topic's end offsets
(`producers.topics.end_offsets`): the API's lag, a rebuild's switch-over, the benchmark's and the
tests' waits all read them here.

- `stored_positions(conn, consumer, topic, schema=...)` / `stored_positions_async(conn, consumer, topic)`:
  on a connection (or cursor) whose search_path is the projection schema, or naming the schema.
- `read_positions(settings)`: on a connection of its own; {} while the schema has no positions yet.
- `wait_for_positions(settings, targets, timeout)`: poll until every partition reaches its target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import psycopg
from psycopg import sql

from producers.settings import Settings

__all__ = ["read_positions", "stored_positions", "stored_positions_async", "wait_for_positions"]

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


def read_positions(settings: Settings, *, consumer: str | None = None, topic: str | None = None) -> dict[int, int]:
    """The positions of `settings.processor_group` on `settings.topic` in `settings.pg_schema`, on a new connection.

    {} while the schema or its positions table does not exist yet (no worker has started on it).
    """
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
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
