"""Create the projection's tables in a schema, idempotently (`schema.sql`)."""

from __future__ import annotations

from importlib.resources import files

import psycopg
from psycopg import sql

__all__ = ["create_schema", "drop_schema", "schema_sql"]


def schema_sql() -> str:
    return files("projections.postgres").joinpath("schema.sql").read_text()


def create_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create `schema` and its tables unless they exist; safe to run any number of times, concurrently."""
    with conn.transaction():
        # two processes starting together must not race on CREATE ... IF NOT EXISTS
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"schema:{schema}",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(schema_sql())


def drop_schema(conn: psycopg.Connection, schema: str) -> None:
    """Drop a schema and everything in it (tests and rebuild clean-up)."""
    with conn.transaction():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
