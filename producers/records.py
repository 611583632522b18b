"""A ledger record as a reader sees it: its position, its bytes, and the contract's verdict.

Every reader of the ledger (the projector, the rebuild, the dead-letter sink, the tests) turns a
Kafka record into an `Incoming` with `decode_record`, so they judge each record the same way:
the broker timestamp is the default `observed_at` and the reference of the clock-skew window, so
a replay decides exactly as the live worker did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from producers.contract import (
    MAX_EVENT_BYTES,
    InvalidEvent,
    MemoryEvent,
    decode_value,
    read_record,
)
from producers.keys.envelope import MAX_SEALED_BYTES, Envelope, open_envelope, parse_envelope

__all__ = ["DeadLetter", "Incoming", "decode_record", "open_record"]


@dataclass(slots=True)  # not frozen, as projections.versions.Version: built once a record, never assigned to
class Incoming:
    """One Kafka record, decoded by the event contract: exactly one of event/error/envelope is set, or `erased`.

    A sealed record comes out of `decode_record` with its `envelope` and `key_id`; whoever holds the
    key store opens it with `open_record` (the recorder, in its transaction), which sets event or error, or
    `erased` when its data key was destroyed by the erasure of the subject it names.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    raw: bytes | None
    timestamp: datetime | None
    event: MemoryEvent | None = None
    error: InvalidEvent | None = None
    envelope: Envelope | None = None  # sealed, not opened yet
    key_id: str | None = None  # the data key that sealed it; None: a clear record
    erased: bool = False  # sealed with a data key an erasure destroyed: the record is no longer readable
    max_future_skew: timedelta | None = None  # the reader's window, applied again when a sealed record is opened


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
        # a sealed record may be larger than a clear one (base64): anything else past MAX_EVENT_BYTES is too large
        oversize = raw is not None and len(raw) > MAX_EVENT_BYTES
        try:
            data, storable = read_record(raw, MAX_SEALED_BYTES)
        except InvalidEvent:
            if oversize:
                raise _too_large(raw) from None
            raise
        envelope = parse_envelope(data) if isinstance(data, dict) else None
        if envelope is not None:
            kid, skew = envelope.key_id, max_future_skew
            return Incoming(topic, partition, offset, key, raw, ts, envelope=envelope, key_id=kid, max_future_skew=skew)
        if oversize:
            raise _too_large(raw)
        # `storable`: orjson read the bytes and `storable_json` cleared them, so validation leaves out the walk
        event = decode_value(data, default_observed_at=ts, max_future_skew=max_future_skew, storable=storable)
        # the Incoming is built once, for the outcome (dataclasses.replace of a base costs as much again)
        return Incoming(topic, partition, offset, key, raw, ts, event=event, max_future_skew=max_future_skew)
    except InvalidEvent as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - a record the contract cannot even judge is still a dead letter
        error = InvalidEvent("undecodable", f"{type(exc).__name__}: {exc}"[:500])
    return Incoming(topic, partition, offset, key, raw, ts, error=error, max_future_skew=max_future_skew)


def _too_large(raw: bytes | None) -> InvalidEvent:
    return InvalidEvent("too_large", f"{len(raw or b'')} bytes is more than {MAX_EVENT_BYTES}")


def open_record(
    record: Incoming,
    key: bytes | None,
    *,
    destroyed: bool = False,
    owner: Callable[[str, str], bool] | None = None,
) -> Incoming:
    """A sealed record opened with its data key `key` (None: the key store does not know its key id).

    `owner(tenant, subject)`: whether the key belongs to that subject (the key store says: `KeyState.owns`); a record
    sealed with another subject's key is refused (`key_mismatch`), or erasing its own subject would not shred it.
    That holds after the key was destroyed too, so a replay judges the record as its first application did and its
    clear fields (which nobody can authenticate any longer) never speak for another subject or tenant.
    `destroyed`: its key was destroyed by an erasure: the record of the key's own subject is `erased` (never a dead
    letter; another subject's is still `key_mismatch`). Otherwise the opened fields are judged by the contract
    exactly as a clear record is (`decode_value`, the same broker time and skew window), so a sealed and a clear
    record of the same event give the same event.
    """
    envelope = record.envelope
    if envelope is None:
        return record
    try:
        tenant, subject = envelope.tenant, envelope.subject
        if owner is not None and (
            not isinstance(tenant, str) or not isinstance(subject, str) or not owner(tenant, subject)
        ):
            raise InvalidEvent("key_mismatch", f"data key {envelope.key_id!r} belongs to another subject", "sealed.kid")
        if destroyed:
            return dataclasses.replace(record, envelope=None, erased=True)
        if key is None:
            raise InvalidEvent("unknown_key", f"no data key {envelope.key_id!r} in the key store", "sealed.kid")
        wire = open_envelope(envelope, key)
        # the opened event is held to the clear limit, as the SDK's `encode` is; the record's own bytes plus its
        # plaintext bound the opened JSON from above, so only a record near the limit is encoded to measure it
        if len(record.raw or b"") + len(envelope.ciphertext) > MAX_EVENT_BYTES:
            size = len(orjson.dumps(wire))
            if size > MAX_EVENT_BYTES:
                raise InvalidEvent("too_large", f"the opened event is {size} bytes, more than {MAX_EVENT_BYTES}")
        event = decode_value(wire, default_observed_at=record.timestamp, max_future_skew=record.max_future_skew)
        return dataclasses.replace(record, envelope=None, event=event)
    except InvalidEvent as exc:
        return dataclasses.replace(record, envelope=None, error=exc)
    except Exception as exc:  # noqa: BLE001 - an opened record the contract cannot judge is still a dead letter
        error = InvalidEvent("undecodable", f"{type(exc).__name__}: {exc}"[:500])
        return dataclasses.replace(record, envelope=None, error=error)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: Incoming
    error: InvalidEvent
