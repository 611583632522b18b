"""PostgreSQL and Elasticsearch from a test's side: schema-bound connections, catching up, clean-up.

- `pg(settings)`: an autocommit connection on the private schema (`projections.postgres.connection`).
- `async_pool(settings)`: the API's pool shape on the private schema.
- `positions(settings)`, `wait_caught_up(settings, timeout, worker=...)`: the stored positions
  (`projections.postgres.positions`) against the topic's end offsets (`producers.topics`).
- `outbox_count(conn)`: rows waiting in the search outbox.
- `private_store(settings)`: a fresh schema (the projection's own DDL) and an ES client, cleaned up after.
- `private_schema(settings)`: a fresh schema and `pg(settings)` on it, for tests of PostgreSQL alone; dropped after.
- `cleanup(settings)`: drop everything a test's private names hold (schemas, indices, topics, faust dir).
- `private_ledger(settings)`: the private topics and an empty projection schema (what an app needs to start and
  answer, without a worker), cleaned up after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from elasticsearch import Elasticsearch
from psycopg_pool import AsyncConnectionPool

from infra.private import drop_indices, drop_private
from producers.settings import Settings
from producers.topics import end_offsets, ensure_topics
from projections.postgres.connection import configure_pool, connect
from projections.postgres.positions import read_positions, wait_for_positions
from projections.postgres.schema import create_schema, drop_schema
from projections.search.client import es_client
from tests.support.processes import Process

__all__ = [
    "async_pool",
    "cleanup",
    "outbox_count",
    "pg",
    "positions",
    "private_ledger",
    "private_schema",
    "private_store",
    "wait_caught_up",
]


def pg(settings: Settings) -> psycopg.Connection:
    """Autocommit connection on the private schema; statements not prepared, like the worker's
    (`ledger rebuild` renames schemas under open connections)."""
    return connect(settings.pg_dsn, settings.pg_schema, autocommit=True, prepare_threshold=None)


def async_pool(settings: Settings) -> AsyncConnectionPool:
    """The API's pool shape: search_path on the private schema, autocommit; opened by the caller."""
    return AsyncConnectionPool(
        settings.pg_dsn,
        min_size=1,
        max_size=4,
        configure=configure_pool(settings.pg_schema),
        open=False,
        kwargs={"autocommit": True},
    )


def positions(settings: Settings) -> dict[int, int]:
    """The projector's stored positions in the private schema ({} before a worker created it)."""
    return read_positions(settings)


def wait_caught_up(settings: Settings, timeout: float = 60.0, worker: Process | None = None) -> dict[int, int]:
    """Wait until the stored positions reach the topic's current end offsets; returns those end offsets.

    Fails at once (with its log) if `worker` has exited.
    """
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}
    wait_for_positions(settings, ends, timeout, check=worker.check if worker is not None else None)
    return ends


def outbox_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM search_outbox").fetchone()[0]


def embed_queue_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM embed_queue").fetchone()[0]


def search_pending(conn: psycopg.Connection) -> int:
    """Outbox rows plus versions awaiting vectors, in one snapshot (0 means every document is written with
    its vectors: an embedder's commit moves a version from the queue to the outbox, an indexer's the other way)."""
    return conn.execute("SELECT (SELECT count(*) FROM search_outbox) + (SELECT count(*) FROM embed_queue)").fetchone()[
        0
    ]


def _create_fresh(admin: psycopg.Connection, schema: str) -> None:
    """create_schema of a schema that does not exist yet: what is made here is dropped after, and settings that
    are not private (a development stack's own schema) must never be."""
    if admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone():
        raise AssertionError(f"schema {schema!r} exists: a private store takes settings.private(...) names")
    create_schema(admin, schema)


@contextmanager
def private_store(settings: Settings) -> Iterator[tuple[psycopg.Connection, Elasticsearch]]:
    """A fresh schema (the projection's own DDL) and an ES client; afterwards no trace in PG or ES."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        _create_fresh(admin, settings.pg_schema)
    conn = connect(settings.pg_dsn, settings.pg_schema, autocommit=True)
    es = es_client(settings, request_timeout=30)
    try:
        yield conn, es
    finally:
        drop_indices(es, settings)
        es.close()
        conn.close()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            drop_schema(admin, settings.pg_schema)
            drop_schema(admin, settings.keys_schema)  # the key store a recorder created beside it


@contextmanager
def private_schema(settings: Settings) -> Iterator[psycopg.Connection]:
    """A fresh schema (the projection's own DDL) and an autocommit connection on it (`pg`); dropped after."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        _create_fresh(admin, settings.pg_schema)
    conn = pg(settings)
    try:
        yield conn
    finally:
        conn.close()
        with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
            drop_schema(admin, settings.pg_schema)


def cleanup(settings: Settings) -> None:
    """Drop what the private names hold (schemas, indices, faust directory, topics): the benchmarks' clean-up too."""
    drop_private(settings)


@contextmanager
def private_ledger(settings: Settings) -> Iterator[Settings]:
    """`settings` with its private topics and an empty projection schema created; everything dropped after."""
    ensure_topics(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    try:
        yield settings
    finally:
        cleanup(settings)
