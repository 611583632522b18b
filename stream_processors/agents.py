"""The projector agent: ledger records in batches -> one PostgreSQL transaction per batch.

The agent only collects (partition, offset, timestamp, key, value) of each message; decoding
(producers.contract) and the write (projections.postgres.recorder) run in a worker thread so the
event loop keeps serving the consumer.

Two kinds of failure. A poison record (PostgreSQL refuses its data, a constraint, a deterministic
error of the pure core: `recorder.is_permanent`) is found by the recorder, dead-lettered as
`unstorable`, and the rest of the batch applied: one record never stops a partition. A transient
failure (PostgreSQL away or shutting down, a deadlock, a lock or statement timeout, the DLQ topic
not answering) is retried with backoff until the batch commits: giving up would let the stream
move past records that were never applied.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence, Set
from datetime import timedelta

import psycopg
from faust.types import TP
from kafka.errors import KafkaError

from producers.keys.store import key_context
from producers.logs import bind_ids, new_id, unbind_ids
from producers.records import Incoming, decode_record
from producers.settings import Settings
from projections.postgres.recorder import BatchResult, Recorder, connect
from stream_processors.app import LedgerApp
from stream_processors.dlq import DlqProducer
from stream_processors.metrics import LagGauge, record_batch, record_retry

__all__ = ["BatchRunner", "attach"]

log = logging.getLogger(__name__)

RawRecord = tuple[str, int, int, bytes | None, bytes | None, int | None]  # topic, partition, offset, key, value, ts_ms


class BatchRunner:
    """Owns the recorder's connection and the DLQ producer; used from one thread at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dlq = DlqProducer(settings)
        self._recorder: Recorder | None = None

    def _rec(self) -> Recorder:
        if self._recorder is None or self._recorder.conn.closed:
            conn = connect(self.settings.pg_dsn, self.settings.pg_schema)
            keys = key_context(self.settings, conn)  # opens sealed records; erasures shred (issue 13)
            conn.commit()
            self._recorder = Recorder(
                conn, consumer=self.settings.processor_group, topic=self.settings.topic, dlq_sink=self.dlq, keys=keys
            )
        return self._recorder

    def apply(self, raw: Sequence[RawRecord]) -> BatchResult:
        skew = timedelta(seconds=self.settings.max_future_skew_s)
        records: list[Incoming] = [
            decode_record(t, p, o, v, key=k, timestamp_ms=ts, max_future_skew=skew) for t, p, o, k, v, ts in raw
        ]
        delay = 0.2
        while True:
            try:
                return self._rec().apply_batch(records)
            except psycopg.OperationalError as exc:  # PostgreSQL away, deadlock, timeout: reconnect and retry
                record_retry("postgres")
                log.error("batch not applied (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
            except KafkaError as exc:  # the DLQ topic did not take the dead letters: the batch rolled back
                record_retry("dlq")
                log.error("DLQ sink failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
            except Exception:  # noqa: BLE001 - not a poison record (the recorder dead-letters those): a bug, retry
                record_retry("other")
                log.exception("batch not applied; retrying in %.1fs", delay)
            self._reset()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _reset(self) -> None:
        """Drop the connection (a fresh one on the next attempt); the failed transaction was rolled back."""
        if self._recorder is not None:
            try:
                self._recorder.conn.close()
            except Exception:  # noqa: BLE001 - it is being discarded anyway
                pass
            self._recorder = None

    def positions(self, partitions: Set[int]) -> dict[int, int]:
        with connect(self.settings.pg_dsn, self.settings.pg_schema) as conn:
            stored = Recorder(conn, consumer=self.settings.processor_group, topic=self.settings.topic).positions()
        return {p: stored.get(p, 0) for p in partitions}

    def close(self) -> None:
        self.dlq.close()
        if self._recorder is not None:
            self._recorder.conn.close()


def attach(app: LedgerApp, settings: Settings) -> BatchRunner:
    """Add the projector agent to `app` and point its consumer's seeks at the PostgreSQL positions."""
    runner = BatchRunner(settings)
    topic = app.topic(settings.topic, value_serializer="raw", key_serializer="raw")
    lag = LagGauge(settings.topic)  # ledger_worker_consumer_lag (stream_processors.metrics)

    async def stored_positions(assigned: Set[TP]) -> Mapping[TP, int]:
        mine = {tp for tp in assigned if tp.topic == settings.topic}
        if not mine:
            return {}
        for attempt in range(1, 6):
            try:
                by_partition = await asyncio.to_thread(runner.positions, {tp.partition for tp in mine})
                lag.positions(by_partition)
                return {tp: by_partition[tp.partition] for tp in mine}
            except Exception:  # noqa: BLE001 - retried, then fatal (below)
                log.exception("reading the PostgreSQL positions failed (attempt %d)", attempt)
                await asyncio.sleep(0.5 * attempt)
        # never consume from wherever Kafka's own commit points: better dead than skipping records
        log.critical("no PostgreSQL positions for the assigned partitions; exiting")
        logging.shutdown()
        os._exit(71)

    app.stored_positions = stored_positions

    async def project(stream) -> None:
        async for events in stream.take_events(settings.processor_batch_size, within=settings.processor_batch_seconds):
            batch_ids = bind_ids(batch_id=new_id())  # on every line of this batch, its thread's too (to_thread)
            raw = [
                (
                    e.message.topic,
                    e.message.partition,
                    e.message.offset,
                    e.message.key,
                    e.message.value,
                    None if e.message.timestamp is None else round(e.message.timestamp * 1000),
                )
                for e in events
            ]
            started = time.perf_counter()
            try:
                result = await asyncio.to_thread(runner.apply, raw)
            except Exception:  # a faust-restarted agent would go on past this batch: die, restart re-seeks
                log.exception("projector failed outside the retry loop; exiting so a restart resumes from PostgreSQL")
                logging.shutdown()
                os._exit(70)
            record_batch(result, time.perf_counter() - started)
            lag.positions(result.positions)
            lag.refresh(app.consumer)
            log.info(
                "batch: %d records, %d applied, %d duplicate, %d conflict, %d erased replay, %d skipped, %d dead "
                "in %.0f ms, positions %s",
                len(raw),
                result.applied,
                result.duplicates,
                result.conflicts,
                result.erased_replays,
                result.skipped,
                result.dead,
                (time.perf_counter() - started) * 1000,
                result.positions,
            )
            unbind_ids(batch_ids)

    app.agent(topic, name="ledger-projector", concurrency=1)(project)

    async def refresh_lag(*_: object) -> None:  # between batches too: an idle or stuck worker's lag still moves
        lag.refresh(app.consumer)

    app.timer(settings.metrics_refresh_s, name="ledger-consumer-lag")(refresh_lag)
    return runner
