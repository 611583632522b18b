"""The dead-letter record format (stream_processors.dlq.envelope): pure, no server."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from psycopg import errors as pg_errors

from producers.contract import MAX_EVENT_BYTES, MemoryEvent, encode, named_subject
from producers.records import DeadLetter, decode_record
from projections.postgres.positioned import CoreRefused, dead_letter_text, unstorable
from stream_processors.dlq import MAX_RAW_IN_DLQ, envelope

pytestmark = pytest.mark.unit


def test_envelope_carries_reason_origin_and_original_bytes():
    rec = decode_record("ledger", 3, 41, b"not json", key=b"acme|u1", timestamp_ms=1_767_225_600_123)
    assert rec.event is None and rec.error is not None
    body = envelope(DeadLetter(rec, rec.error))
    assert (body["code"], body["topic"], body["partition"], body["offset"]) == ("bad_json", "ledger", 3, 41)
    assert body["message"] and body["field"] is None
    assert base64.b64decode(body["raw_b64"]) == b"not json" and body["raw_truncated"] is False
    assert base64.b64decode(body["key_b64"]) == b"acme|u1"
    assert body["timestamp_ms"] == 1_767_225_600_123
    assert rec.timestamp == datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)


def test_envelope_cuts_huge_records_but_says_so():
    raw = b"x" * (MAX_EVENT_BYTES + 10)
    rec = decode_record("ledger", 0, 1, raw, timestamp_ms=None)
    body = envelope(DeadLetter(rec, rec.error))
    assert body["code"] == "too_large" and body["raw_bytes"] == len(raw)
    assert body["raw_truncated"] == (len(raw) > MAX_RAW_IN_DLQ)
    assert len(base64.b64decode(body["raw_b64"])) == min(len(raw), MAX_RAW_IN_DLQ)


def test_a_record_without_value_is_a_dead_letter():
    rec = decode_record("ledger", 0, 2, None, timestamp_ms=0)
    body = envelope(DeadLetter(rec, rec.error))
    assert body["code"] == "empty" and body["raw_b64"] is None


def _valid_record():
    event = MemoryEvent(type="memory.asserted", tenant="acme", subject="u1", key="k", value=1, content="c")
    return decode_record("ledger", 1, 7, encode(event), key=b"acme|u1", timestamp_ms=0)


def test_an_unstorable_record_carries_the_database_reason_and_its_bytes():
    rec = _valid_record()
    assert rec.event is not None
    for exc, words in (
        (pg_errors.CheckViolation('new row for relation "fact_versions" violates check constraint "c"'), 'c"'),
        (pg_errors.UntranslatableCharacter("unsupported Unicode escape sequence"), "Unicode"),
        (CoreRefused("ValueError: memory.frobbed has no route"), "no route"),
    ):
        dead = unstorable(rec, exc)
        assert dead.event is None and dead.error is not None
        body = envelope(DeadLetter(dead, dead.error))
        assert body["code"] == "unstorable" and words in body["message"], body
        assert base64.b64decode(body["raw_b64"]) == rec.raw and (body["partition"], body["offset"]) == (1, 7)


def test_dead_letter_text_is_always_storable():
    """A reason quoting the bad input (NUL, a lone surrogate) must not make the dead letter itself fail."""
    assert dead_letter_text("a\x00b") == "a\\u0000b"
    assert dead_letter_text("x\udcff") == "x\\udcff"
    assert dead_letter_text(None) is None
    assert dead_letter_text("plain é 中") == "plain é 中"
    for text in ("a\x00b", "x\udcff", "\ud800"):
        dead_letter_text(text).encode("utf-8")  # no surrogates left: PostgreSQL takes it


@pytest.mark.parametrize(
    ("raw", "subject"),
    [
        (b'{"subject": "user:1"}', "user:1"),
        (b'{"subject": "user:\\\\u0000x"}', "user:\\u0000x"),  # a backslash spelled in JSON: a real subject
        (b'{"subject": "user:\\u0000x"}', None),  # a NUL: no event names it
        (b'{"subject": "x\\udcff"}', None),  # a lone surrogate: not JSON orjson reads, nor text
        (b'{"subject": "   "}', None),
        (b'{"subject": "' + b"s" * 257 + b'"}', None),
        (b'{"subject": 7}', None),
        (b'["subject"]', None),
        (b"not json", None),
        (b"", None),
        (None, None),
    ],
)
def test_named_subject_is_one_an_event_could_name(raw: bytes | None, subject: str | None) -> None:
    """What a refused record's subject is stored as (so what erasing a subject takes): only a subject an event could
    name, never a spelling of one it could not."""
    assert named_subject(raw) == subject
