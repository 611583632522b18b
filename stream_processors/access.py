"""The access agent: the access topic in batches -> one PostgreSQL transaction per batch (issue 16).

A second agent in the projector's faust App (same group, same worker processes), beside the ledger's
(stream_processors.agents): it collects each message's (partition, offset, value) and hands the batch to
`projections.postgres.access_projector.AccessProjector` in a worker thread. Its positions live in the same
`positions` table (topic = `Settings.access_topic`), and `attach_access` extends the App's seek hook so that
after every rebalance the access partitions, too, resume where PostgreSQL says.

A transient failure (PostgreSQL away, a deadlock) is retried with backoff until the batch commits; an access is
never skipped by the stream moving on without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence, Set

import psycopg
from faust.types import TP

from producers.settings import Settings
from projections.postgres.access_projector import AccessBatchResult, AccessProjector, decode_access_record
from projections.postgres.recorder import connect
from stream_processors.app import LedgerApp

__all__ = ["AccessRunner", "attach_access"]

log = logging.getLogger(__name__)

RawAccess = tuple[str, int, int, bytes | None]  # topic, partition, offset, value


class AccessRunner:
    """Owns the access projector's connection; used from one thread at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._projector: AccessProjector | None = None

    def _proj(self) -> AccessProjector:
        if self._projector is None or self._projector.conn.closed:
            conn = connect(self.settings.pg_dsn, self.settings.pg_schema)
            self._projector = AccessProjector(
                conn, consumer=self.settings.processor_group, topic=self.settings.access_topic
            )
        return self._projector

    def apply(self, raw: Sequence[RawAccess]) -> AccessBatchResult:
        records = [decode_access_record(t, p, o, v) for t, p, o, v in raw]
        delay = 0.2
        while True:
            try:
                return self._proj().apply_batch(records)
            except psycopg.OperationalError as exc:  # PostgreSQL away, deadlock, timeout: reconnect and retry
                log.error("access batch not applied (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
            except Exception:  # noqa: BLE001 - not a refused record (those are dead-lettered): a bug, retry
                log.exception("access batch not applied; retrying in %.1fs", delay)
            self._reset()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _reset(self) -> None:
        if self._projector is not None:
            try:
                self._projector.conn.close()
            except Exception:  # noqa: BLE001 - it is being discarded anyway
                pass
            self._projector = None

    def positions(self, partitions: Set[int]) -> dict[int, int]:
        with connect(self.settings.pg_dsn, self.settings.pg_schema) as conn:
            stored = AccessProjector(
                conn, consumer=self.settings.processor_group, topic=self.settings.access_topic
            ).positions()
        return {p: stored.get(p, 0) for p in partitions}

    def close(self) -> None:
        self._reset()


def attach_access(app: LedgerApp, settings: Settings) -> AccessRunner:
    """Add the access agent to `app` (after `agents.attach`) and let the seek hook cover its partitions too."""
    runner = AccessRunner(settings)
    topic = app.topic(settings.access_topic, value_serializer="raw", key_serializer="raw")
    ledger_positions = app.stored_positions

    async def stored_positions(assigned: Set[TP]) -> Mapping[TP, int]:
        out = dict(await ledger_positions(assigned)) if ledger_positions is not None else {}
        mine = {tp for tp in assigned if tp.topic == settings.access_topic}
        if not mine:
            return out
        for attempt in range(1, 6):
            try:
                by_partition = await asyncio.to_thread(runner.positions, {tp.partition for tp in mine})
                out.update({tp: by_partition[tp.partition] for tp in mine})
                return out
            except Exception:  # noqa: BLE001 - retried, then fatal (below)
                log.exception("reading the PostgreSQL access positions failed (attempt %d)", attempt)
                await asyncio.sleep(0.5 * attempt)
        log.critical("no PostgreSQL positions for the assigned access partitions; exiting")
        logging.shutdown()
        os._exit(71)

    app.stored_positions = stored_positions

    async def project(stream) -> None:
        async for events in stream.take_events(settings.access_batch_size, within=settings.processor_batch_seconds):
            raw = [(e.message.topic, e.message.partition, e.message.offset, e.message.value) for e in events]
            started = time.perf_counter()
            try:
                result = await asyncio.to_thread(runner.apply, raw)
            except Exception:  # a faust-restarted agent would go on past this batch: die, restart re-seeks
                log.exception("access projector failed outside the retry loop; exiting")
                logging.shutdown()
                os._exit(70)
            log.info(
                "access batch: %d records, %d applied, %d duplicate, %d erased, %d skipped, %d dead in %.0f ms",
                len(raw),
                result.applied,
                result.duplicates,
                result.erased,
                result.skipped,
                result.dead,
                (time.perf_counter() - started) * 1000,
            )

    app.agent(topic, name="access-projector", concurrency=1)(project)
    return runner
