"""The projector's agents: a topic's records in batches -> one PostgreSQL transaction per batch.

The ledger's and the access topic's agents run through one `BatchRunner` and `attach_projection`; decoding and
writing run in a worker thread so the event loop keeps serving the consumer, and every rebalance seeks to the
positions PostgreSQL stores. A poison record is dead-lettered as `unstorable`, so one record never stops a
partition; a transient failure is retried until the batch commits, as giving up would let the stream move past
records never applied.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import psycopg
from faust.types import TP
from kafka.errors import KafkaError

from producers.logs import bind_ids, new_id, unbind_ids
from producers.settings import Settings
from projections.postgres.chain import Checkpoints, sign_idle_heads
from projections.postgres.connection import held
from projections.postgres.positioned import DlqSink, PositionedProjection, connect
from projections.postgres.positions import stored_positions
from projections.postgres.recorder import BatchResult, Recorder
from stream_processors.app import LedgerApp, RawSchema, take_ready
from stream_processors.dlq import DlqProducer
from stream_processors.metrics import DeadLetterGauge, LagGauge, record_batch, record_retry

__all__ = ["BatchRunner", "attach", "attach_projection"]

log = logging.getLogger(__name__)

RawRecord = tuple[str, int, int, bytes | None, bytes | None, int | None]  # topic, partition, offset, key, value, ts_ms


class BatchRunner:
    """Owns one projection's connection (and its DLQ sink); used from one thread at a time."""

    def __init__(
        self,
        settings: Settings,
        kind: type[PositionedProjection],
        *,
        dlq: DlqProducer | None = None,
        on_retry: Callable[[str], None] | None = None,
        what: str = "batch",
    ) -> None:
        self.settings = settings
        self.kind = kind
        self.topic = kind.topic_of(settings)
        self.dlq = dlq
        self.decode = kind.decoder(settings)
        self.on_retry = on_retry  # called with the cause of each retry: postgres, dlq (the DLQ topic), other
        self.what = what  # how its log lines name a batch
        self._projection: PositionedProjection | None = None

    def _proj(self) -> PositionedProjection:
        if self._projection is None or self._projection.conn.closed:
            conn = connect(self.settings.pg_dsn, self.settings.pg_schema, **held(self.settings))
            sink: DlqSink | None = self.dlq
            try:
                self._projection = self.kind.for_settings(self.settings, conn, dlq_sink=sink)
            except BaseException:
                conn.close()
                raise
        return self._projection

    def apply(self, raw: Sequence[RawRecord]) -> Any:
        records = [self.decode(*r) for r in raw]
        delay = 0.2
        while True:
            try:
                return self._proj().apply_batch(records)
            except psycopg.OperationalError as exc:  # PostgreSQL away, deadlock, timeout: reconnect and retry
                self._retried("postgres")
                log.error("%s not applied (%s: %s); retrying in %.1fs", self.what, type(exc).__name__, exc, delay)
            except KafkaError as exc:  # the DLQ topic did not take the dead letters: the batch rolled back
                self._retried("dlq")
                log.error("DLQ sink failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
            except Exception:  # noqa: BLE001 - not a poison record (the projection dead-letters those): a bug, retry
                self._retried("other")
                log.exception("%s not applied; retrying in %.1fs", self.what, delay)
            self._reset()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _retried(self, cause: str) -> None:
        if self.on_retry is not None:
            self.on_retry(cause)

    def _reset(self) -> None:
        """Drop the connection (a fresh one on the next attempt); the failed transaction was rolled back."""
        if self._projection is not None:
            try:
                self._projection.conn.close()
            except Exception:  # noqa: BLE001 - it is being discarded anyway
                pass
            self._projection = None

    def positions(self, partitions: Set[int]) -> dict[int, int]:
        """The stored positions of `partitions` (0 where none is stored), on a connection of their own."""
        with connect(self.settings.pg_dsn, self.settings.pg_schema, **held(self.settings)) as conn:
            stored = stored_positions(conn, self.settings.processor_group, self.topic)
        return {p: stored.get(p, 0) for p in partitions}

    def close(self) -> None:
        if self.dlq is not None:
            self.dlq.close()
        self._reset()


def attach_projection(
    app: LedgerApp,
    settings: Settings,
    runner: BatchRunner,
    *,
    name: str,
    batch_size: int,
    report: Callable[[Any, int, float], None],
) -> None:
    """Add an agent `name` that feeds `runner.topic` to `runner`, and extend the App's seek hook to its partitions.

    `report(result, records, seconds)` after each committed batch (its log line, metrics). The topic's lag
    (`ledger_worker_consumer_lag{topic}`) follows the positions read at assignment and committed by each batch,
    and is refreshed between batches too, so an idle or stuck agent's lag still moves.
    """
    topic = app.topic(runner.topic, schema=RawSchema())
    earlier = app.stored_positions  # the hooks of the agents attached before this one
    lag = LagGauge(runner.topic)

    async def stored(assigned: Set[TP]) -> Mapping[TP, int]:
        out = dict(await earlier(assigned)) if earlier is not None else {}
        mine = {tp for tp in assigned if tp.topic == runner.topic}
        if not mine:
            return out
        for attempt in range(1, 6):
            try:
                by_partition = await asyncio.to_thread(runner.positions, {tp.partition for tp in mine})
                lag.positions(by_partition)
                out.update({tp: by_partition[tp.partition] for tp in mine})
                return out
            except Exception:  # noqa: BLE001 - retried, then fatal (below)
                log.exception("reading the PostgreSQL positions of %s failed (attempt %d)", runner.topic, attempt)
                await asyncio.sleep(0.5 * attempt)
        # never consume from wherever Kafka's own commit points: better dead than skipping records
        log.critical("no PostgreSQL positions for the assigned partitions of %s; exiting", runner.topic)
        logging.shutdown()
        os._exit(71)

    app.stored_positions = stored

    async def project(stream) -> None:
        async for events in take_ready(stream, batch_size):
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
                log.exception("%s failed outside the retry loop; exiting so a restart resumes from PostgreSQL", name)
                logging.shutdown()
                os._exit(70)
            lag.positions(result.positions)
            lag.refresh(app.consumer)
            report(result, len(raw), time.perf_counter() - started)
            unbind_ids(batch_ids)

    app.agent(topic, name=name, concurrency=1)(project)

    async def refresh_lag(*_: object) -> None:
        lag.refresh(app.consumer)

    app.timer(settings.metrics_refresh_s, name=f"{name}-consumer-lag")(refresh_lag)


def attach(app: LedgerApp, settings: Settings) -> BatchRunner:
    """Add the ledger's agent to `app` and point its consumer's seeks at the PostgreSQL positions."""
    runner = BatchRunner(settings, Recorder, dlq=DlqProducer(settings), on_retry=record_retry)

    def report(result: BatchResult, records: int, seconds: float) -> None:
        record_batch(result, seconds)
        log.info(
            "batch: %d records, %d applied, %d duplicate, %d conflict, %d erased replay, %d skipped, %d dead "
            "in %.0f ms, positions %s",
            records,
            result.applied,
            result.duplicates,
            result.conflicts,
            result.erased_replays,
            result.skipped,
            result.dead,
            seconds * 1000,
            result.positions,
        )

    attach_projection(
        app,
        settings,
        runner,
        name="ledger-projector",
        batch_size=settings.processor_batch_size,
        report=report,
    )
    letters = DeadLetterGauge(settings)  # ledger_worker_dead_letters_by_state{state}

    async def refresh_dead_letters(*_: object) -> None:  # a query: off the event loop
        await asyncio.to_thread(letters.refresh)

    app.timer(settings.metrics_refresh_s, name="ledger-dead-letters")(refresh_dead_letters)
    checkpoints = Checkpoints.for_settings(settings)
    if checkpoints is not None:  # a partition no batch reaches any more still gets its head signed

        def sign_idle() -> None:
            with connect(settings.pg_dsn, settings.pg_schema, **held(settings)) as conn:
                sign_idle_heads(conn, settings.processor_group, settings.topic, checkpoints)

        async def sign_idle_checkpoints(*_: object) -> None:
            try:
                await asyncio.to_thread(sign_idle)
            except Exception:  # noqa: BLE001 - the next round signs them; the batches go on meanwhile
                log.warning("signing idle chain heads failed; retried next round", exc_info=True)

        app.timer(max(1.0, checkpoints.every_s / 2), name="ledger-chain-checkpoints")(sign_idle_checkpoints)
    return runner
