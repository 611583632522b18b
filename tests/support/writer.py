"""Facts written straight through the PostgreSQL projection, without Kafka: `RecorderWriter`, `drain_all`.

`RecorderWriter` hands events to `projections.postgres.recorder.Recorder` (the code the worker runs),
one Kafka-like offset each on partition 0, so `fact_versions` and `search_outbox` are written in one
transaction exactly as the worker would; `drain_all` then runs the indexer's `drain_once` until the
outbox is empty, so what was written is searchable. For search and recall tests that need facts in
the stores quickly; the whole pipeline (Kafka, worker, indexer) is `tests.support.pipeline`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from elasticsearch import Elasticsearch

from producers.contract import EventType, MemoryEvent, Source, SourceType, encode
from producers.keys.store import key_context
from producers.records import decode_record
from producers.settings import Settings
from projections.postgres.recorder import BatchResult, Recorder, connect
from tests.support.stores import outbox_count

__all__ = ["RecorderWriter", "drain_all"]


class RecorderWriter:
    """Writes events through the PostgreSQL projection's recorder on a transactional connection of its own.

    `conn` (the test's autocommit connection) is accepted for callers that pass it and not used: the
    recorder needs a connection whose transactions it controls.
    """

    def __init__(
        self, settings: Settings, conn: psycopg.Connection | None = None, *, consumer: str = "search-tests"
    ) -> None:
        self.settings = settings
        self.conn = connect(settings.pg_dsn, settings.pg_schema)
        keys = key_context(settings, self.conn)  # as the worker: erasures shred and leave their record
        self.conn.commit()
        # `consumer`: whose positions it stores (the worker's group, where an API read checks them, or none's)
        self.recorder = Recorder(self.conn, consumer=consumer, topic=settings.topic, keys=keys)
        self.offset = 0

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RecorderWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, *events: MemoryEvent) -> BatchResult:
        """One batch through the recorder, each event at the next offset of partition 0; the recorder's result."""
        records = []
        for e in events:
            records.append(
                decode_record(self.settings.topic, 0, self.offset, encode(e), timestamp_ms=int(time.time() * 1000))
            )
            self.offset += 1
        return self.recorder.apply_batch(records)

    def publish(self, *events: MemoryEvent) -> list[MemoryEvent]:
        """`apply`, returning the events."""
        self.apply(*events)
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
        """Write one memory.asserted (explicit, from "tests"), observed at `valid_from` or now."""
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


def drain_all(settings: Settings, conn: psycopg.Connection, es: Elasticsearch, embedder, **kw: Any) -> int:
    """Run the indexer's `drain_once` and the embedder's `embed_once` until the outbox and the embed queue are
    empty, and refresh, so what was written is searchable with its vectors; the outbox rows drained."""
    from projections.search.embedder import embed_once
    from projections.search.indexer import drain_once

    total = 0
    while True:
        while n := drain_once(settings, conn, es, refresh=True, **kw):
            total += n
        if embedder is None or not embed_once(settings, conn, embedder, es=es).claimed:
            break
    assert outbox_count(conn) == 0
    return total
