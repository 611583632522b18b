"""Connections bound to the projection's schema: where every session-wide `search_path` (and plan mode) is set.

Queries name tables without a schema and rely on `search_path = <schema>, public`, so one code serves any private
schema; the schema is always quoted with `psycopg.sql.Identifier`, never formatted into SQL text. `use_schema`
commits, so a later rollback cannot undo it. (DDL sets its own with `SET LOCAL`.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from producers.settings import Settings

__all__ = [
    "KEEPALIVES",
    "configure_pool",
    "connect",
    "connect_async",
    "held",
    "search_path",
    "use_schema",
    "use_schema_async",
]

# TCP keepalives on a connection a process holds for long: a PostgreSQL that went away mid-statement (a host gone, a
# network cut) ends in an error within ~25 s, not after the kernel's retransmission timeout (a quarter of an hour)
KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def held(settings: Settings) -> dict[str, Any]:
    """libpq options of a worker's connection: the configured connect timeout (libpq's default waits 130 s on a
    server that takes the connection and never answers), and KEEPALIVES."""
    return {"connect_timeout": settings.pg_connect_timeout_s, **KEEPALIVES}


def search_path(schema: str) -> sql.Composed:
    """`SET search_path TO "<schema>", public` (public last: extensions and shared types stay visible)."""
    return sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema))


def use_schema(conn: psycopg.Connection, schema: str) -> None:
    """Point `conn` at `schema` and commit (a no-op in autocommit), so the setting outlives any rollback."""
    conn.execute(search_path(schema))
    conn.commit()


async def use_schema_async(conn: psycopg.AsyncConnection, schema: str) -> None:
    await conn.execute(search_path(schema))
    await conn.commit()


def connect(dsn: str, schema: str, **kwargs: Any) -> psycopg.Connection:
    """`psycopg.connect(dsn, **kwargs)` with `search_path` on `schema`."""
    conn = psycopg.connect(dsn, **kwargs)
    try:
        use_schema(conn, schema)
    except BaseException:
        conn.close()
        raise
    return conn


async def connect_async(dsn: str, schema: str, **kwargs: Any) -> psycopg.AsyncConnection:
    """`psycopg.AsyncConnection.connect(dsn, **kwargs)` with `search_path` on `schema`."""
    conn = await psycopg.AsyncConnection.connect(dsn, **kwargs)
    try:
        await use_schema_async(conn, schema)
    except BaseException:
        await conn.close()
        raise
    return conn


# The API's reads are keyed by tenant and subject, memory ids or event ids, with no pattern match. psycopg prepares a
# statement run often; PostgreSQL then plans it anew on each execution as long as its generic plan's estimate looks
# dearer than the custom ones (an `= ANY(array)` of unknown length is costed as ten items against the one or two
# sent), and recall's verification spent ~0.3 ms of each call planning a statement that runs in ~0.1. Its generic
# plan is an index walk (EXPLAIN); `generic_plans` takes the cached generic plan on a read pool's connections.
GENERIC_PLANS = sql.SQL("SET plan_cache_mode TO force_generic_plan")


def configure_pool(schema: str, *, generic_plans: bool = False) -> Callable[[psycopg.AsyncConnection], Awaitable[None]]:
    """`AsyncConnectionPool(configure=...)`: each new pooled connection gets `search_path` on `schema` (and, with
    `generic_plans`, the generic plan of every prepared statement: GENERIC_PLANS)."""

    async def configure(conn: psycopg.AsyncConnection) -> None:
        if generic_plans:
            await conn.execute(GENERIC_PLANS)
        await use_schema_async(conn, schema)

    return configure
