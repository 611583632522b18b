"""Helpers for the search and recall tests: a private schema + index, and a ledger writer.

Facts go in through the real PostgreSQL projection (`projections.postgres.recorder.Recorder`,
the code the stream processor runs), which writes `fact_versions` and `search_outbox` in one
transaction; the indexer then drains the outbox into a private Elasticsearch alias.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from elasticsearch import Elasticsearch
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from producers.contract import EventType, MemoryEvent, Source, SourceType, encode
from producers.records import decode_record
from producers.settings import Settings
from projections.postgres.recorder import Recorder
from projections.postgres.schema import create_schema, drop_schema
from projections.search.mapping import physical_indices


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@contextmanager
def private_store(settings: Settings) -> Iterator[tuple[psycopg.Connection, Elasticsearch]]:
    """A fresh schema (the projection's own DDL) and, afterwards, no trace in PG or ES."""
    admin = psycopg.connect(settings.pg_dsn, autocommit=True)
    create_schema(admin, settings.pg_schema)
    conn = psycopg.connect(settings.pg_dsn, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(settings.pg_schema)))
    es = Elasticsearch(settings.es_url, request_timeout=30)
    try:
        yield conn, es
    finally:
        for name in physical_indices(es, settings.es_index) + [
            n for n in es.indices.get(index=f"{settings.es_index}-*", allow_no_indices=True)
        ]:
            es.indices.delete(index=name, ignore_unavailable=True)
        es.close()
        conn.close()
        drop_schema(admin, settings.pg_schema)
        admin.close()


class Ledger:
    """Writes events through the PostgreSQL projection, one Kafka-like offset each."""

    def __init__(self, settings: Settings, conn: psycopg.Connection) -> None:
        self.settings = settings
        self.conn = psycopg.connect(settings.pg_dsn)
        self.conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(settings.pg_schema)))
        self.conn.commit()
        self.recorder = Recorder(self.conn, consumer="search-tests", topic=settings.topic)
        self.offset = 0

    def close(self) -> None:
        self.conn.close()

    def publish(self, *events: MemoryEvent) -> list[MemoryEvent]:
        records = []
        for e in events:
            records.append(
                decode_record(self.settings.topic, 0, self.offset, encode(e), timestamp_ms=int(time.time() * 1000))
            )
            self.offset += 1
        self.recorder.apply_batch(records)
        return list(events)

    def assert_fact(
        self,
        tenant: str,
        subject: str,
        key: str | None,
        content: str,
        value: Any = None,
        *,
        aliases: list[str] | None = None,
        entities: list[str] | None = None,
        kind: str = "state",
        valid_from: datetime | None = None,
        importance: float = 0.5,
        tags: list[str] | None = None,
        **extra: Any,
    ) -> MemoryEvent:
        e = MemoryEvent(
            type=EventType.ASSERTED,
            tenant=tenant,
            subject=subject,
            key=key,
            content=content,
            value=value,
            kind=kind,
            aliases=aliases or [],
            entities=entities or [],
            tags=tags or [],
            importance=importance,
            source=Source(type=SourceType.EXPLICIT, service="tests"),
            observed_at=valid_from or datetime.now(UTC),
            valid_from=valid_from,
            **extra,
        )
        self.publish(e)
        return e


def outbox_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM search_outbox").fetchone()[0]


def drain_all(settings: Settings, conn: psycopg.Connection, es: Elasticsearch, embedder, **kw: Any) -> int:
    """Drain the outbox to empty and refresh, so what was written is searchable."""
    from projections.search.indexer import drain_once

    total = 0
    while n := drain_once(settings, conn, es, embedder, refresh=True, **kw):
        total += n
    assert outbox_count(conn) == 0
    return total


def async_pool(settings: Settings) -> AsyncConnectionPool:
    """The API's pool shape: search_path on the schema, autocommit."""

    async def configure(conn) -> None:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(settings.pg_schema)))
        await conn.commit()

    return AsyncConnectionPool(
        settings.pg_dsn, min_size=1, max_size=4, configure=configure, open=False, kwargs={"autocommit": True}
    )


def run(coro):
    return asyncio.run(coro)
