"""A ledger record as a reader sees it: its position, its bytes, and the contract's verdict.

Every reader of the ledger (the projector, the rebuild, the dead-letter sink, the tests) turns a
Kafka record into an `Incoming` with `decode_record`, so they judge each record the same way:
the broker timestamp is the default `observed_at` and the reference of the clock-skew window, so
a replay decides exactly as the live worker did.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from producers.contract import InvalidEvent, MemoryEvent, decode

__all__ = ["DeadLetter", "Incoming", "decode_record"]


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
    topic: str,
    partition: int,
    offset: int,
    raw: bytes | None,
    *,
    key: bytes | None = None,
    timestamp_ms: int | None,
    max_future_skew: timedelta | None = None,
) -> Incoming:
    """contract.decode with the record's broker timestamp as the default observed_at (replays agree).

    The broker timestamp is also the reference of `max_future_skew` (Settings.max_future_skew):
    a replay judges a record exactly as the live worker did.
    """
    ts = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms is not None and timestamp_ms >= 0 else None
    try:
        event = decode(raw, default_observed_at=ts, max_future_skew=max_future_skew)
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
