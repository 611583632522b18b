"""Connections bound to the projection's schema: where every session-wide `search_path` is set.

Queries name tables without a schema and rely on `search_path = <schema>, public`, so one code serves any private
schema; the schema is always quoted with `psycopg.sql.Identifier`, never formatted into SQL text. `use_schema`
commits, so a later rollback cannot undo it. (DDL sets its own with `SET LOCAL`.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["configure_pool", "connect", "connect_async", "search_path", "use_schema", "use_schema_async"]


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


def configure_pool(schema: str) -> Callable[[psycopg.AsyncConnection], Awaitable[None]]:
    """`AsyncConnectionPool(configure=...)`: each new pooled connection gets `search_path` on `schema`."""

    async def configure(conn: psycopg.AsyncConnection) -> None:
        await use_schema_async(conn, schema)

    return configure
