"""Has the pipeline caught up? The ledger's end offsets against what PostgreSQL and Elasticsearch hold.

"Visible in PostgreSQL" = the stored positions (committed with the projection rows) reach the
topic's end offsets. "Visible in Elasticsearch" = the search outbox is drained and the index
holds one searchable document per fact version (exact and keyword recall see them). "Semantic" =
besides, no version awaits its vectors (documents first, vectors after). All read from
the stores themselves, never from the processes' logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from elasticsearch import Elasticsearch, NotFoundError
from kafka import KafkaConsumer
from psycopg import sql

from bench.machine import cpu_seconds
from producers.kafka_producer import kafka_connection
from producers.settings import Settings
from producers.topics import end_offsets
from projections.postgres.counts import EMBED, OUTBOX, VERSIONS
from projections.postgres.positions import stored_positions

__all__ = ["CaughtUpCpu", "Progress", "Probe", "wait_caught_up"]


@dataclass
class Progress:
    ends: dict[int, int]
    positions: dict[int, int]
    outbox: int
    versions: int
    es_docs: int
    embed_pending: int = 0
    outbox_first: int | None = None  # the outbox's rows of new or changed versions (priority 0); None: not read

    @property
    def semantic_done(self) -> bool:
        return self.es_done and self.embed_pending == 0

    @property
    def pg_done(self) -> bool:
        return all(self.positions.get(p, 0) >= end for p, end in self.ends.items())

    @property
    def es_done(self) -> bool:
        return self.pg_done and self.outbox == 0 and self.es_docs >= self.versions

    @property
    def documents_done(self) -> bool:
        """Every version's document written: the embedders' vector rewrites (priority 1) may still be queued."""
        first = self.outbox if self.outbox_first is None else self.outbox_first
        return self.pg_done and first == 0 and self.es_docs >= self.versions

    @property
    def applied(self) -> int:
        return sum(min(self.positions.get(p, 0), end) for p, end in self.ends.items())

    @property
    def total(self) -> int:
        return sum(self.ends.values())


class Probe:
    """Cheap repeated reads of the pipeline's progress (one PG connection, one consumer, one ES client)."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.pg = psycopg.connect(settings.pg_dsn, autocommit=True)
        self.es = Elasticsearch(settings.es_url, request_timeout=30)
        self.consumer = KafkaConsumer(**kafka_connection(settings), group_id=None)

    def close(self) -> None:
        self.pg.close()
        self.es.close()
        self.consumer.close()

    def end_offsets(self) -> dict[int, int]:
        return end_offsets(self.s, consumer=self.consumer)

    def _scalar(self, query: sql.Composable, params: tuple = ()) -> int:
        try:
            row = self.pg.execute(query, params).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row and row[0] is not None else 0

    def positions(self) -> dict[int, int]:
        try:
            return stored_positions(self.pg, self.s.processor_group, self.s.topic, schema=self.s.pg_schema)
        except psycopg.errors.UndefinedTable:
            return {}

    def es_docs(self) -> int:
        try:
            return int(self.es.count(index=self.s.es_index)["count"])
        except NotFoundError:
            return 0

    def projected(self) -> dict[str, int]:
        """What the workers wrote (runs of the same data must write the same): events, fact versions, dead
        letters, sealed events."""
        schema = self.s.pg_schema

        def count(table: str, where: str = "") -> int:
            return self._scalar(sql.SQL("SELECT count(*) FROM {}" + where).format(sql.Identifier(schema, table)))

        return {
            "events": count("events"),
            "sealed_events": count("events", " WHERE key_id IS NOT NULL"),
            "fact_versions": count("fact_versions"),
            "dead_letters": count("dead_letters"),
        }

    def progress(self, ends: dict[int, int] | None = None) -> Progress:
        """Read from the writers' own counters (projections.postgres.counts, kept in their transactions, exact): a
        count(*) of the tables every 0.2 s would scan them, a cost that grows with the ledger being measured."""
        schema = self.s.pg_schema
        counted = sql.SQL("SELECT coalesce(sum(n), 0) FROM {} WHERE name = %s").format(sql.Identifier(schema, "counts"))
        first = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE priority = 0 LIMIT 1) q").format(
            sql.Identifier(schema, "search_outbox")
        )
        return Progress(
            ends=ends if ends is not None else self.end_offsets(),
            positions=self.positions(),
            outbox=self._scalar(counted, (OUTBOX,)),
            outbox_first=self._scalar(first),  # 0 or 1: whether a new or changed version's document waits
            versions=self._scalar(counted, (VERSIONS,)),
            es_docs=self.es_docs(),
            embed_pending=self._scalar(counted, (EMBED,)),
        )


class CaughtUpCpu:
    """Each process's CPU seconds from now until its own stage caught up (the worker: PostgreSQL holds everything;
    the indexer: every document is written), read by calling it with each Progress: the time a process then idles
    while a later stage (the embedder, minutes) catches up is not a cost of the items it handled."""

    STAGES = {"worker": "pg_done", "indexer": "documents_done"}  # `worker-2`, `indexer-3`: their kind's stage

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if self._stage(name) is not None}
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.at: dict[str, float] = {}  # name -> its CPU seconds when its stage caught up

    def __call__(self, p: Progress) -> None:
        for name, pid in self.pids.items():
            if name not in self.at and getattr(p, self._stage(name)):
                self.at[name] = cpu_seconds(pid)

    def _stage(self, name: str) -> str | None:
        return self.STAGES.get(name.split("-", 1)[0])

    def used(self, name: str) -> float:
        """CPU seconds until its stage caught up (until now, if it has not)."""
        return self.at.get(name, cpu_seconds(self.pids[name])) - self.start[name]


def wait_caught_up(
    probe: Probe,
    *,
    timeout: float,
    interval: float = 0.2,
    on_progress: Callable[[Progress], None] | None = None,
    alive: Callable[[], None] | None = None,
    semantic: bool = True,
    search: bool = True,
    documents: bool = False,
) -> tuple[float | None, float | None, float | None]:
    """Poll until PG, then ES, then (with `semantic`) the vectors hold everything published so far.

    Returns (seconds until PG caught up, until ES did, until the vectors did: None without `semantic`), from the
    call; with `search=False` (no indexer runs) it returns once PG caught up: (seconds, None, None). With
    `documents`, ES has caught up once every version's document is written (exact and keyword recall see it), while
    the embedders' vector rewrites may still be queued; without, once the whole outbox is drained. Raises
    TimeoutError (with the last progress) after `timeout`; `alive()` may raise if a process died.
    """
    t0 = time.perf_counter()
    ends = probe.end_offsets()
    pg_at: float | None = None
    es_at: float | None = None
    while True:
        prog = probe.progress(ends)
        if on_progress:
            on_progress(prog)
        if pg_at is None and prog.pg_done:
            pg_at = time.perf_counter() - t0
            if not search:
                return pg_at, None, None
        if es_at is None and (prog.documents_done if documents else prog.es_done):
            es_at = time.perf_counter() - t0
            if not semantic:
                return pg_at, es_at, None
        if es_at is not None and prog.semantic_done:
            return pg_at, es_at, time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"not caught up after {timeout:.0f}s: {prog}")
        if alive:
            alive()
        time.sleep(interval)
