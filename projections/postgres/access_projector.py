"""Apply a batch of access records (the access topic) to PostgreSQL in ONE transaction with their positions.

The same exactly-once scheme as the ledger's Recorder: lock the position rows of (consumer, access topic),
skip records below them, write, advance the positions, commit. On top of that every access has its id
(`AccessEvent.access_id`, a digest of the serving), the primary key of `accesses`: a record delivered twice at
another offset (a producer retry) is a no-op as well. `access_counts` (per tenant and memory_id: how many
accesses, the last one) only grows by the rows that were new, so it is a function of `accesses` and a replay
from offset 0 gives the same numbers. In the same transaction it adds to `/v1/stats`' access counters
(projections.postgres.counts) the new accesses of active facts and the active facts served for the first time
(projections.postgres.accesses.served_deltas), on its own shard (`access_shard` of its lowest partition).

An access of an erased version is dropped (`erased`; projections.postgres.accesses explains why both orders of
an erasure and an access give the same tables). An invalid record (not an AccessEvent) is written to
`dead_letters` once (topic = the access topic) and the batch goes on; a record PostgreSQL refuses is found by
applying the batch one record at a time and dead-lettered as `unstorable`. Accesses are not re-published to
the ledger's dead-letter topic: they are the service's own records, and the table says what went wrong.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import psycopg
from psycopg import errors as pg_errors

from producers.contract import AccessEvent, InvalidEvent, decode_access
from projections.postgres.accesses import erased_version_ids, lock_access_facts, served_deltas
from projections.postgres.counts import access_shard, add_counts, dead_letters_name
from projections.postgres.positions import advance_positions, lock_positions, stored_positions
from projections.postgres.recorder import insert_dead_letters, is_permanent, letter_tenant

__all__ = ["AccessBatchResult", "AccessProjector", "AccessRecord", "decode_access_record"]

log = logging.getLogger(__name__)


class AccessRecord(NamedTuple):
    """One record of the access topic, judged by the contract: exactly one of event/error is set."""

    topic: str
    partition: int
    offset: int
    raw: bytes | None
    event: AccessEvent | None = None
    error: InvalidEvent | None = None


def decode_access_record(topic: str, partition: int, offset: int, raw: bytes | None) -> AccessRecord:
    try:
        return AccessRecord(topic, partition, offset, raw, event=decode_access(raw))
    except InvalidEvent as exc:
        return AccessRecord(topic, partition, offset, raw, error=exc)


@dataclass
class AccessBatchResult:
    applied: int = 0  # new accesses (counted)
    duplicates: int = 0  # an access id already recorded
    erased: int = 0  # accesses of a version whose subject was erased: dropped
    skipped: int = 0  # records below the stored position
    dead: int = 0  # newly dead-lettered records
    positions: dict[int, int] = field(default_factory=dict)

    def add(self, other: AccessBatchResult) -> None:
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.erased += other.erased
        self.skipped += other.skipped
        self.dead += other.dead
        for p, o in other.positions.items():
            self.positions[p] = max(self.positions.get(p, 0), o)


class AccessProjector:
    """Writes access batches for one consumer (group) and the access topic into the connection's schema."""

    def __init__(self, conn: psycopg.Connection, *, consumer: str, topic: str) -> None:
        self.conn = conn
        self.consumer = consumer
        self.topic = topic

    def positions(self) -> dict[int, int]:
        with self.conn.transaction(), self.conn.cursor() as cur:
            return stored_positions(cur, self.consumer, self.topic)

    def apply_batch(self, records: Sequence[AccessRecord], *, attempts: int = 5) -> AccessBatchResult:
        """Apply the records exactly once; a record PostgreSQL refuses is dead-lettered, the others applied."""
        records = [r for r in records if r.topic == self.topic]
        try:
            return self._commit(records, attempts)
        except Exception as exc:
            if not is_permanent(exc):
                raise
            log.warning("access batch of %d refused (%s: %s); one by one", len(records), type(exc).__name__, exc)
            result = AccessBatchResult()
            for r in records:  # ledger order per partition is kept: each record commits with its position
                try:
                    result.add(self._commit([r], attempts))
                except Exception as again:
                    if not is_permanent(again):
                        raise
                    error = InvalidEvent("unstorable", f"{type(again).__name__}: {again}"[:1000])
                    result.add(self._commit([r._replace(event=None, error=error)], attempts))
            return result

    def _commit(self, records: list[AccessRecord], attempts: int) -> AccessBatchResult:
        for attempt in range(1, attempts + 1):
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    return self._apply(cur, records)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt == attempts:
                    raise
                log.warning("access batch retried after %s (attempt %d)", type(exc).__name__, attempt)
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    def _apply(self, cur: psycopg.Cursor, records: list[AccessRecord]) -> AccessBatchResult:
        result = AccessBatchResult()
        if not records:
            return result
        stored = lock_positions(cur, self.consumer, self.topic, sorted({r.partition for r in records}))
        fresh: list[AccessRecord] = []
        seen: set[tuple[int, int]] = set()
        for r in records:
            if r.offset < stored[r.partition] or (r.partition, r.offset) in seen:
                result.skipped += 1
                continue
            seen.add((r.partition, r.offset))
            fresh.append(r)
        if dead := self._dead_letters(cur, [r for r in fresh if r.event is None], result):
            # the dead-letter counters of this topic, per tenant named (projections.postgres.counts), on a shard
            # whose position row this transaction holds locked, as the ledger's Recorder does
            add_counts(cur, Counter((letter_tenant(r), dead_letters_name(self.topic)) for r in dead), shard=min(stored))
        self._record(cur, [r for r in fresh if r.event is not None], result, shard=access_shard(min(stored)))
        ends: dict[int, int] = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        result.positions = {p: max(stored[p], end) for p, end in ends.items()}
        advance_positions(cur, self.consumer, self.topic, result.positions)
        return result

    def _record(self, cur: psycopg.Cursor, records: list[AccessRecord], result: AccessBatchResult, shard: int) -> None:
        if not records:
            return
        events: list[AccessEvent] = [r.event for r in records]  # type: ignore[misc]
        lock_access_facts(cur, (e.memory_id for e in events))
        erased = erased_version_ids(cur, [e.tenant for e in events], [e.version_id for e in events])
        if erased:
            keep = [(r, e) for r, e in zip(records, events, strict=True) if (e.tenant, e.version_id) not in erased]
            result.erased += len(records) - len(keep)
            records, events = [r for r, _ in keep], [e for _, e in keep]
            if not events:
                return
        cur.execute(
            "INSERT INTO accesses (tenant, access_id, memory_id, version_id, stage, via, caller, request_id, "
            'accessed_at, "partition", "offset") '
            "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[], %b::timestamptz[], %b::int[], %b::bigint[]) "
            "ON CONFLICT (tenant, access_id) DO NOTHING RETURNING tenant, memory_id, accessed_at",
            (
                [e.tenant for e in events],
                [e.access_id for e in events],
                [e.memory_id for e in events],
                [e.version_id for e in events],
                [e.stage for e in events],
                [e.via for e in events],
                [e.caller for e in events],
                [e.request_id for e in events],
                [e.accessed_at for e in events],
                [r.partition for r in records],
                [r.offset for r in records],
            ),
        )
        new = cur.fetchall()
        result.applied += len(new)
        result.duplicates += len(events) - len(new)
        agg: dict[tuple[str, str], tuple[int, datetime]] = {}
        grouped: dict[tuple[str, str], list[datetime]] = defaultdict(list)
        for tenant, memory_id, accessed_at in new:
            grouped[(tenant, memory_id)].append(accessed_at)
        for k, times in sorted(grouped.items()):
            agg[k] = (len(times), max(times))
        if agg:
            # before access_counts grows: which facts are served for the first time (the locks above are held)
            add_counts(cur, served_deltas(cur, {k: n for k, (n, _) in agg.items()}), shard=shard)
            cur.execute(
                "INSERT INTO access_counts (tenant, memory_id, accesses, last_accessed_at) "
                "SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::timestamptz[]) "
                "ON CONFLICT (tenant, memory_id) DO UPDATE SET accesses = access_counts.accesses + EXCLUDED.accesses, "
                "last_accessed_at = GREATEST(access_counts.last_accessed_at, EXCLUDED.last_accessed_at)",
                (
                    [t for t, _ in agg],
                    [m for _, m in agg],
                    [n for n, _ in agg.values()],
                    [last for _, last in agg.values()],
                ),
            )

    def _dead_letters(
        self, cur: psycopg.Cursor, invalid: list[AccessRecord], result: AccessBatchResult
    ) -> list[AccessRecord]:
        """Record the invalid records once each; those newly recorded."""
        if not invalid:
            return []
        new = insert_dead_letters(cur, invalid)
        letters = [r for r in invalid if (r.partition, r.offset) in new]
        result.dead += len(letters)
        return letters
