"""`ledger rebuild`: replay the ledger from offset 0 into a fresh schema, then switch over.

1. Replay every partition into `<schema>_rebuild_<ts>` up to the end offsets seen at the start, with the workers'
   own projection and consumer name, so the rows are the same and the workers continue from the rebuilt positions.
2. Switch in one transaction: lock the live `positions` (a worker's next batch waits), catch up to the live
   positions, compute both checksums, carry over what a replay cannot recreate (signed chain checkpoints, the
   erasure salt and the `erased_events` of shredded keys, the doors' `event_claims`), then rename live ->
   `<schema>_old_<ts>` and rebuild -> live. The access topic is replayed and caught up the same way.

The DLQ topic is not written again, but `dead_letters` is rebuilt. Every version gets an outbox row, with document
revisions past the live schema's and its stored vectors copied, so search re-indexes without embedding again.
An older live layout is migrated this way: its checksum then differs only because the layouts do.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from psycopg import sql

from producers.kafka_producer import kafka_connection
from producers.settings import Settings
from producers.topics import end_offsets
from projections.postgres.access_projector import AccessProjector
from projections.postgres.chain import copy_checkpoints
from projections.postgres.positioned import PositionedProjection, connect
from projections.postgres.positions import stored_positions
from projections.postgres.queries import projection_checksum
from projections.postgres.recorder import Recorder
from projections.postgres.schema import (
    continue_revisions,
    copy_erasure_salt,
    copy_idempotency,
    copy_vectors,
    create_schema,
    drop_schema,
)

__all__ = ["PROJECTIONS", "RebuildReport", "rebuild", "rebuild_with_progress", "replay"]

Progress = Callable[[int], None]  # called with the number of records just applied
# what a rebuild replays, in this order: the accesses' erasure rule needs the ledger's erasures in place
# (projections.postgres.accesses)
PROJECTIONS: tuple[type[PositionedProjection], ...] = (Recorder, AccessProjector)


@dataclass
class RebuildReport:
    schema: str
    old_schema: str | None
    records: int
    seconds: float
    live_checksum: str | None
    rebuilt_checksum: str


def _schema_exists(conn: psycopg.Connection, schema: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


def _batches(
    settings: Settings, topic: str, start: dict[int, int], todo: dict[int, int], batch_size: int
) -> Iterator[list[ConsumerRecord]]:
    """The records of `topic` from `start` up to `todo` (exclusive) per partition, in polled batches."""
    consumer = KafkaConsumer(
        **kafka_connection(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=batch_size,
    )
    try:
        tps = {p: TopicPartition(topic, p) for p in todo}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, start.get(p, 0))
        remaining = set(todo)
        while remaining:
            polled = consumer.poll(timeout_ms=1000, max_records=batch_size)
            batch = [m for tp, msgs in polled.items() for m in msgs if m.offset < todo[tp.partition]]
            if batch:
                yield batch
            for p in list(remaining):
                if consumer.position(tps[p]) >= todo[p]:
                    consumer.pause(tps[p])
                    remaining.discard(p)
    finally:
        consumer.close()


def replay(
    settings: Settings,
    schema: str,
    until: dict[int, int],
    *,
    projection: type[PositionedProjection] = Recorder,
    batch_size: int = 2000,
    progress: Progress | None = None,
) -> int:
    """Apply the projection's topic into `schema` from its stored positions up to `until` (exclusive) per partition,
    through what the worker runs (`for_settings`, `decoder`); no DLQ topic: dead letters stay rows. The ledger's
    Recorder reads the live key store: a rebuild never copies or rewrites the keys."""
    records_done = 0
    decode = projection.decoder(settings)
    with connect(settings.pg_dsn, schema) as conn:
        projector = projection.for_settings(settings, conn)
        start = projector.positions()
        todo = {p: end for p, end in until.items() if start.get(p, 0) < end}
        if not todo:
            return 0
        batches = _batches(settings, projector.topic, start, todo, batch_size)
        for records in _decoded_ahead(
            batches, lambda m: decode(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
        ):
            projector.apply_batch(records)
            records_done += len(records)
            if progress:
                progress(len(records))
    return records_done


_END = object()


def _decoded_ahead(
    batches: Iterator[list[ConsumerRecord]], decode_one: Callable[[ConsumerRecord], Any]
) -> Iterator[list[Any]]:
    """`batches` polled and decoded one batch ahead, in a thread, while the caller applies the current one.

    The replay waited on PostgreSQL for a third of its time with nothing to do; polling and decoding the
    next batch meanwhile overlaps the two. The batches come out in their order, so the result is the same; an error
    of the thread is raised here, and leaving early stops the thread (which closes the consumer).
    """
    ahead: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for msgs in batches:
                if not put([decode_one(m) for m in msgs]):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            put(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # a generator: its finally closes the Kafka consumer, in the thread that iterated it

    thread = threading.Thread(target=run, name="rebuild-decode", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def rebuild(
    settings: Settings, *, keep_old: bool = True, batch_size: int = 2000, progress: Progress | None = None
) -> RebuildReport:
    """Rebuild the projection of `settings.pg_schema` from offset 0 and switch over to it."""
    t0 = time.perf_counter()
    live = settings.pg_schema
    stamp = time.strftime("%Y%m%d%H%M%S")
    fresh = f"{live}_rebuild_{stamp}"
    old = f"{live}_old_{stamp}"
    with psycopg.connect(settings.pg_dsn) as admin:
        create_schema(admin, fresh)
        # the live salt: erased_events is rebuilt row for row, and ids erased before stay erased
        copy_erasure_salt(admin, live, fresh)
        continue_revisions(admin, live, fresh)  # its documents win over the live ones
    records = 0
    for kind in PROJECTIONS:
        ends = end_offsets(settings, kind.topic_of(settings))
        records += replay(settings, fresh, ends, projection=kind, batch_size=batch_size, progress=progress)
    with psycopg.connect(settings.pg_dsn) as conn:
        with conn.transaction():  # the live vectors, so nothing is embedded again (and again under the lock below)
            copy_vectors(conn, live, fresh)
        with conn.transaction():
            live_checksum = None
            if _schema_exists(conn, live):
                lock = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(live, "positions"))
                conn.execute(lock)
                for kind in PROJECTIONS:  # caught up to the live positions, under the lock
                    live_pos = stored_positions(conn, settings.processor_group, kind.topic_of(settings), schema=live)
                    records += replay(
                        settings, fresh, live_pos, projection=kind, batch_size=batch_size, progress=progress
                    )
                live_checksum = projection_checksum(conn, live)
                copy_vectors(conn, live, fresh)
                copy_idempotency(conn, live, fresh)  # ids claimed by the doors, ids erased
                copy_checkpoints(conn, live, fresh)  # the signed heads of the past stay as they were signed
                conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(live), sql.Identifier(old)))
            rebuilt_checksum = projection_checksum(conn, fresh)
            conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(fresh), sql.Identifier(live)))
        if live_checksum is not None and not keep_old:
            drop_schema(conn, old)
    return RebuildReport(
        schema=live,
        old_schema=old if live_checksum is not None and keep_old else None,
        records=records,
        seconds=time.perf_counter() - t0,
        live_checksum=live_checksum,
        rebuilt_checksum=rebuilt_checksum,
    )


def rebuild_with_progress(settings: Settings, *, keep_old: bool = True, batch_size: int = 2000) -> RebuildReport:
    """rebuild() with a rich progress bar (records and records/s) and a summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    # bounded like a producer's waits: a broker that is away ends the command in one line (infra.cli), not a hang
    wait = settings.producer_timeout_s
    total = sum(sum(end_offsets(settings, k.topic_of(settings), timeout_s=wait).values()) for k in PROJECTIONS)
    columns = (
        TextColumn("[bold]rebuild[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>9,.0f} events/s"),
        TimeElapsedColumn(),
    )
    start = time.perf_counter()
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(settings.topic, total=total or None, rate=0.0)

        def advance(n: int) -> None:
            done = bar.tasks[0].completed + n
            bar.update(task, advance=n, rate=done / max(time.perf_counter() - start, 1e-6))

        report = rebuild(settings, keep_old=keep_old, batch_size=batch_size, progress=advance)
    same = report.live_checksum == report.rebuilt_checksum
    console.print(
        f"replayed {report.records:,} records in {report.seconds:.1f}s "
        f"({report.records / max(report.seconds, 1e-6):,.0f} events/s) into schema {report.schema}"
    )
    console.print(f"live checksum    {report.live_checksum or '(no live schema)'}")
    verdict = "[green]equal[/]" if same else "[red]DIFFERENT[/]"
    console.print(f"rebuilt checksum {report.rebuilt_checksum}  {verdict}")
    if report.old_schema:
        console.print(f"previous projection kept as schema {report.old_schema}")
    return report
