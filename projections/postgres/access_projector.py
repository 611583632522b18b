"""The access topic's positioned projection: access records -> `accesses` and `access_counts`.

A PositionedProjection, the same live and in `ledger rebuild`. Each access's id is the primary key of `accesses`,
so a record delivered twice at another offset is a no-op too, and `access_counts` grows only by new rows: a replay
gives the same numbers. An access of an erased version is dropped (projections.postgres.accesses). Invalid records
go to `dead_letters` only, not the ledger's DLQ topic: they are the service's own records.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

from producers.contract import AccessEvent, InvalidEvent, decode_access
from projections.postgres.accesses import erased_version_ids, lock_access_facts, served_deltas
from projections.postgres.counts import access_shard, add_counts
from projections.postgres.positioned import Decode, PositionedProjection, PositionedResult

if TYPE_CHECKING:
    from producers.settings import Settings

__all__ = ["AccessBatchResult", "AccessProjector", "AccessRecord", "decode_access_record"]

# the columns of `accesses` that are the event's fields, in the INSERT's order (then the record's partition, offset)
_EVENT_COLUMNS = "tenant access_id memory_id version_id stage via caller request_id accessed_at".split()


@dataclass(frozen=True, slots=True)
class AccessRecord:
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
class AccessBatchResult(PositionedResult):
    # applied: new accesses (counted); duplicates: an access id already recorded
    erased: int = 0  # accesses of a version whose subject was erased: dropped


class AccessProjector(PositionedProjection[AccessRecord, AccessBatchResult]):
    """Writes access batches for one consumer (group) and the access topic into the connection's schema."""

    result_type = AccessBatchResult

    @classmethod
    def topic_of(cls, settings: Settings) -> str:
        return settings.access_topic

    @classmethod
    def decoder(cls, settings: Settings) -> Decode:
        return lambda topic, partition, offset, key, value, ts: decode_access_record(topic, partition, offset, value)

    def apply(self, cur: psycopg.Cursor, records: list[AccessRecord], result: AccessBatchResult, shard: int) -> None:
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
        columns = [[getattr(e, c) for e in events] for c in _EVENT_COLUMNS]
        columns += [[r.partition for r in records], [r.offset for r in records]]
        cur.execute(
            "INSERT INTO accesses (tenant, access_id, memory_id, version_id, stage, via, caller, request_id, "
            'accessed_at, "partition", "offset") '
            "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[], %b::timestamptz[], %b::int[], %b::bigint[]) "
            "ON CONFLICT (tenant, access_id) DO NOTHING RETURNING tenant, memory_id, accessed_at",
            columns,
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
            # before access_counts grows: which facts are served for the first time (the locks above are held);
            # on the access projector's own shard, never one the recorder writes (projections.postgres.counts)
            add_counts(cur, served_deltas(cur, {k: n for k, (n, _) in agg.items()}), shard=access_shard(shard))
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
