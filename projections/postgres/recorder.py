"""Apply a batch of Kafka records to the projection in ONE transaction with the consumer position.

Exactly-once effect: the batch's rows and the positions (consumer, topic, partition -> next_offset)
commit together. The position rows are locked first (FOR UPDATE, in partition order), records
below the stored position are skipped (redelivery after a crash, or another worker that already
applied them during a rebalance), a duplicate event_id is a no-op (unique key), and each fact is
recomputed under `pg_advisory_xact_lock(hashtextextended(memory_id, 0))` (FIELD-NOTES: a plain
SELECT ... FOR UPDATE races when two writers create a fact's first version).

Dead letters: an invalid record is written to `dead_letters` (once per topic/partition/offset) in
the same transaction and handed to `dlq_sink` before the commit, so the DLQ topic gets it at
least once and the table counts it exactly once.

Public methods open the transaction; underscore twins take a cursor (STYLE §1).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb

from producers.contract import EventType, InvalidEvent, MemoryEvent, decode
from projections.versions import Mark, Version, mark_of, new_version, plan

__all__ = ["BatchResult", "DeadLetter", "Incoming", "Recorder", "decode_record", "connect"]

log = logging.getLogger(__name__)

MARK_TYPES = (EventType.RETRACTED.value, EventType.CONFIRMED.value)
VERSION_COLUMNS = (
    "version_id memory_id tenant subject key scope kind value content entities aliases tags source confidence "
    "importance observed_at valid_from asserted_valid_to partition offset valid_to status superseded_by "
    "superseded_at version confirmed_count last_confirmed_at"
).split()
_Q = [sql.Identifier(c) for c in VERSION_COLUMNS]


@dataclass(frozen=True, slots=True)
class Incoming:
    """One Kafka record, decoded by the event contract: exactly one of event/error is set."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    raw: bytes | None
    timestamp: datetime | None
    event: MemoryEvent | None = None
    error: InvalidEvent | None = None


def decode_record(
    topic: str, partition: int, offset: int, raw: bytes | None, *, key: bytes | None = None, timestamp_ms: int | None
) -> Incoming:
    """contract.decode with the record's broker timestamp as the default observed_at (replays agree)."""
    ts = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms is not None and timestamp_ms >= 0 else None
    try:
        event = decode(raw, default_observed_at=ts)
        return Incoming(topic, partition, offset, key, raw, ts, event=event)
    except InvalidEvent as exc:
        return Incoming(topic, partition, offset, key, raw, ts, error=exc)
    except Exception as exc:  # noqa: BLE001 - a record the contract cannot even judge is still a dead letter
        error = InvalidEvent("undecodable", f"{type(exc).__name__}: {exc}"[:500])
        return Incoming(topic, partition, offset, key, raw, ts, error=error)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: Incoming
    error: InvalidEvent


@dataclass
class BatchResult:
    applied: int = 0  # events recorded (new event_ids)
    duplicates: int = 0  # valid events whose event_id was already known
    skipped: int = 0  # records below the stored position
    dead: int = 0  # newly dead-lettered records
    versions_written: int = 0
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next_offset after the batch


DlqSink = Callable[[Sequence[DeadLetter]], None]


def connect(dsn: str, schema: str, **kwargs) -> psycopg.Connection:
    """A connection for the recorder: search_path on the projection schema, no prepared statements.

    Statements are not prepared, so names are resolved per statement: `ledger rebuild` can rename
    schemas under a running worker.
    """
    conn = psycopg.connect(dsn, prepare_threshold=None, **kwargs)
    conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    conn.execute("SET TimeZone TO 'UTC'")
    conn.commit()
    return conn


class Recorder:
    """Writes batches for one consumer (group) and topic into the schema the connection points at."""

    def __init__(self, conn: psycopg.Connection, *, consumer: str, topic: str, dlq_sink: DlqSink | None = None):
        self.conn = conn
        self.consumer = consumer
        self.topic = topic
        self.dlq_sink = dlq_sink

    # -- public: each opens (and retries) its own transaction ---------------------------------
    def apply_batch(self, records: Sequence[Incoming], *, attempts: int = 5) -> BatchResult:
        """Apply records (any partitions of self.topic, ledger order within a partition) exactly once."""
        for attempt in range(1, attempts + 1):
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    return self._apply_batch(cur, records)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt == attempts:
                    raise
                log.warning("batch retried after %s (attempt %d)", type(exc).__name__, attempt)
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    def positions(self) -> dict[int, int]:
        """partition -> next_offset stored for this consumer and topic."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            return self._positions(cur)

    # -- cursor twins --------------------------------------------------------------------------
    def _positions(self, cur: psycopg.Cursor) -> dict[int, int]:
        cur.execute(
            'SELECT "partition", next_offset FROM positions WHERE consumer = %s AND topic = %s',
            (self.consumer, self.topic),
        )
        return {p: o for p, o in cur.fetchall()}

    def _lock_positions(self, cur: psycopg.Cursor, partitions: list[int]) -> dict[int, int]:
        # the first statement of every batch touches `positions`: a schema switch (ledger rebuild)
        # holding its lock makes this wait and then resolve the name to the new schema
        cur.execute(
            'INSERT INTO positions (consumer, topic, "partition", next_offset) '
            "SELECT %s, %s, p, 0 FROM unnest(%b::int[]) AS p ON CONFLICT DO NOTHING",
            (self.consumer, self.topic, partitions),
        )
        cur.execute(
            'SELECT "partition", next_offset FROM positions WHERE consumer = %s AND topic = %s '
            'AND "partition" = ANY(%s) ORDER BY "partition" FOR UPDATE',
            (self.consumer, self.topic, partitions),
        )
        return {p: o for p, o in cur.fetchall()}

    def _apply_batch(self, cur: psycopg.Cursor, records: Sequence[Incoming]) -> BatchResult:
        result = BatchResult()
        records = [r for r in records if r.topic == self.topic]
        if not records:
            return result
        stored = self._lock_positions(cur, sorted({r.partition for r in records}))
        fresh: list[Incoming] = []
        seen: set[tuple[int, int]] = set()
        for r in records:
            if r.offset < stored[r.partition] or (r.partition, r.offset) in seen:
                result.skipped += 1
                continue
            seen.add((r.partition, r.offset))
            fresh.append(r)
        if fresh:
            self._dead_letters(cur, [r for r in fresh if r.event is None], result)
            segment: list[Incoming] = []
            for r in fresh:
                if r.event is None:
                    continue
                if r.event.type is EventType.ERASED:
                    self._apply_events(cur, segment, result)
                    segment = []
                    self._erase(cur, r, result)
                else:
                    segment.append(r)
            self._apply_events(cur, segment, result)
        ends: dict[int, int] = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        result.positions = {p: max(stored[p], end) for p, end in ends.items()}
        cur.execute(
            "UPDATE positions SET next_offset = GREATEST(positions.next_offset, v.next_offset), updated_at = now() "
            "FROM unnest(%b::int[], %b::bigint[]) AS v(p, next_offset) "
            'WHERE consumer = %s AND topic = %s AND "partition" = v.p',
            (list(result.positions), list(result.positions.values()), self.consumer, self.topic),
        )
        return result

    def _dead_letters(self, cur: psycopg.Cursor, invalid: list[Incoming], result: BatchResult) -> None:
        if not invalid:
            return
        cur.execute(
            'INSERT INTO dead_letters (topic, "partition", "offset", code, field, message, raw) '
            "SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
            "%b::bytea[]) "
            'ON CONFLICT DO NOTHING RETURNING "partition", "offset"',
            (
                [r.topic for r in invalid],
                [r.partition for r in invalid],
                [r.offset for r in invalid],
                [r.error.code for r in invalid],  # type: ignore[union-attr]
                [r.error.field for r in invalid],  # type: ignore[union-attr]
                [r.error.message for r in invalid],  # type: ignore[union-attr]
                [r.raw for r in invalid],
            ),
        )
        new = set(cur.fetchall())
        letters = [DeadLetter(r, r.error) for r in invalid if (r.partition, r.offset) in new]  # type: ignore[arg-type]
        result.dead += len(letters)
        if letters and self.dlq_sink is not None:
            self.dlq_sink(letters)  # raises if the DLQ topic did not take them: the batch rolls back

    def _insert_events(self, cur: psycopg.Cursor, records: list[Incoming]) -> set[str]:
        """Log the events; returns the event_ids that were new (duplicates are left out everywhere)."""
        if not records:
            return set()
        evs = [r.event for r in records]
        cur.execute(
            "INSERT INTO events (event_id, tenant, subject, memory_id, type, kind, key, scope, "
            '"partition", "offset", observed_at, valid_from, valid_to, payload) '
            "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[], %b::int[], %b::bigint[], %b::timestamptz[], %b::timestamptz[], "
            "%b::timestamptz[], %b::jsonb[]) ON CONFLICT DO NOTHING RETURNING event_id",
            (
                [e.event_id for e in evs],
                [e.tenant for e in evs],
                [e.subject for e in evs],
                [None if e.type is EventType.ERASED else e.memory_id for e in evs],
                [e.type.value for e in evs],
                [e.kind.value for e in evs],
                [e.key for e in evs],
                [e.scope for e in evs],
                [r.partition for r in records],
                [r.offset for r in records],
                [e.observed_at for e in evs],
                [e.valid_from for e in evs],
                [e.valid_to for e in evs],
                [Jsonb(e.to_wire()) for e in evs],
            ),
        )
        return {row[0] for row in cur.fetchall()}

    def _apply_events(self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult) -> None:
        if not records:
            return
        new_ids = self._insert_events(cur, records)
        result.duplicates += len({r.event.event_id for r in records}) - len(new_ids)  # type: ignore[union-attr]
        result.applied += len(new_ids)
        new_versions: dict[str, list[Version]] = defaultdict(list)
        new_marks: dict[str, list[Mark]] = defaultdict(list)
        taken: set[str] = set()
        for r in records:
            e = r.event
            assert e is not None
            if e.event_id not in new_ids or e.event_id in taken:
                continue
            taken.add(e.event_id)
            if e.type is EventType.ASSERTED:
                new_versions[e.memory_id].append(new_version(e, r.partition, r.offset))
            else:
                new_marks[e.memory_id].append(mark_of(e))
        facts = sorted(set(new_versions) | set(new_marks))
        if not facts:
            return
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(m, 0)) FROM unnest(%b::text[]) WITH ORDINALITY AS t(m, i) "
            "ORDER BY i",
            (facts,),
        )
        versions = self._load_versions(cur, facts)
        marks = self._load_marks(cur, facts, exclude=new_ids)
        inserts: list[Version] = []
        updates: list[Version] = []
        for mid in facts:
            changes = plan(versions.get(mid, []), marks.get(mid, []), new_versions.get(mid, []), new_marks.get(mid, []))
            inserts.extend(changes.inserts)
            updates.extend(changes.updates)
        self._write_versions(cur, inserts, updates)
        result.versions_written += len(inserts) + len(updates)

    def _load_versions(self, cur: psycopg.Cursor, facts: list[str]) -> dict[str, list[Version]]:
        cur.execute(
            sql.SQL("SELECT {} FROM fact_versions WHERE memory_id = ANY(%s)").format(sql.SQL(", ").join(_Q)), (facts,)
        )
        out: dict[str, list[Version]] = defaultdict(list)
        for row in cur.fetchall():
            v = row_to_version(row)
            out[v.memory_id].append(v)
        return out

    def _load_marks(self, cur: psycopg.Cursor, facts: list[str], exclude: set[str]) -> dict[str, list[Mark]]:
        cur.execute(
            "SELECT memory_id, event_id, type, valid_from, observed_at FROM events "
            "WHERE memory_id = ANY(%s) AND type IN ('memory.retracted', 'memory.confirmed')",
            (facts,),
        )
        out: dict[str, list[Mark]] = defaultdict(list)
        for mid, eid, typ, vf, obs in cur.fetchall():
            if eid not in exclude:
                out[mid].append(Mark(eid, typ, vf, obs))
        return out

    def _write_versions(self, cur: psycopg.Cursor, inserts: list[Version], updates: list[Version]) -> None:
        # updates first: a row stops being current before its successor is inserted (unique index)
        if updates:
            cur.execute(
                "UPDATE fact_versions f SET valid_to = u.valid_to, status = u.status, superseded_by = u.superseded_by, "
                "superseded_at = u.superseded_at, version = u.version, confirmed_count = u.confirmed_count, "
                "last_confirmed_at = u.last_confirmed_at FROM unnest(%b::timestamptz[], %b::text[], %b::text[], "
                "%b::timestamptz[], %b::int[], %b::int[], %b::timestamptz[], %b::text[]) "
                "AS u(valid_to, status, superseded_by, superseded_at, version, confirmed_count, last_confirmed_at, id) "
                "WHERE f.version_id = u.id",
                [list(col) for col in zip(*[(*v.derived(), v.version_id) for v in updates], strict=True)],
            )
        if inserts:
            # new version_ids only (their events were just logged as new): COPY is safe and ~3x executemany
            copy_sql = sql.SQL("COPY fact_versions ({}) FROM STDIN").format(sql.SQL(", ").join(_Q))
            with cur.copy(copy_sql) as copy:
                for v in inserts:
                    copy.write_row(version_to_row(v))
        touched = [*inserts, *updates]
        if touched:
            cur.execute(
                "INSERT INTO search_outbox (version_id, tenant, subject, op) "
                "SELECT v, t, s, 'upsert' FROM unnest(%b::text[], %b::text[], %b::text[]) AS x(v, t, s)",
                ([v.version_id for v in touched], [v.tenant for v in touched], [v.subject for v in touched]),
            )

    def _erase(self, cur: psycopg.Cursor, record: Incoming, result: BatchResult) -> None:
        """subject.erased: purge the subject's versions and events, keep only the erasure tombstones."""
        e = record.event
        assert e is not None
        if not self._insert_events(cur, [record]):
            result.duplicates += 1
            return
        result.applied += 1
        cur.execute("DELETE FROM fact_versions WHERE tenant = %s AND subject = %s", (e.tenant, e.subject))
        cur.execute(
            "DELETE FROM events WHERE tenant = %s AND subject = %s AND type <> 'subject.erased'", (e.tenant, e.subject)
        )
        cur.execute(
            "DELETE FROM search_outbox WHERE tenant = %s AND subject = %s AND op = 'upsert'", (e.tenant, e.subject)
        )
        cur.execute(
            "INSERT INTO search_outbox (version_id, tenant, subject, op) VALUES (NULL, %s, %s, 'delete_subject')",
            (e.tenant, e.subject),
        )


def version_to_row(v: Version) -> tuple:
    values = []
    for name in VERSION_COLUMNS:
        x = getattr(v, name)
        if name in ("value", "source"):
            x = Jsonb(x)
        elif name in ("entities", "aliases", "tags"):
            x = list(x)
        values.append(x)
    return tuple(values)


def row_to_version(row: Sequence) -> Version:
    data = dict(zip(VERSION_COLUMNS, row, strict=True))
    for name in ("entities", "aliases", "tags"):
        data[name] = tuple(data[name] or ())
    data["source"] = data["source"] or {}
    return Version(**data)
