"""A generated corpus of records that are NOT valid events, each with the reason code it must get.

Used by the fault suite: published raw to the ledger topic (bypassing the SDK, as a
Java producer or kcat would), every one must land in the dead-letter topic with a
reason while the valid events around them are applied.
"""

from __future__ import annotations

import random
import uuid

import orjson

from producers.contract import MAX_EVENT_BYTES


def _valid(r: random.Random, tenant: str, subject: str) -> dict:
    return {
        "event_id": uuid.UUID(int=r.getrandbits(128)).hex,
        "type": "memory.asserted",
        "tenant": tenant,
        "subject": subject,
        "key": "profile.note",
        "value": r.randint(0, 10**6),
        "content": "a note that is fine",
        "observed_at": "2026-01-02T03:04:05Z",
    }


def malformed_corpus(tenant: str, subject: str, seed: int = 5) -> list[tuple[bytes, str]]:
    """(raw record value, expected reason code) pairs, one of each kind of bad input."""
    r = random.Random(seed)

    def mutate(**changes) -> bytes:
        d = _valid(r, tenant, subject)
        for k, v in changes.items():
            if v is _DROP:
                d.pop(k, None)
            else:
                d[k] = v
        return orjson.dumps(d)

    good = orjson.dumps(_valid(r, tenant, subject))
    corpus: list[tuple[bytes, str]] = [
        (good[: len(good) // 2], "bad_json"),  # truncated JSON
        (b"", "empty"),
        (b"not json at all", "bad_json"),
        (b"\xff\xfe\x00garbage", "bad_json"),  # not UTF-8
        (b"[1, 2, 3]", "not_an_object"),
        (b'"just a string"', "not_an_object"),
        (b"null", "not_an_object"),
        (mutate(type="memory.exploded"), "unknown_type"),
        (mutate(type=_DROP), "missing_field"),
        (mutate(tenant=_DROP), "missing_field"),
        (mutate(content=_DROP), "missing_field"),
        (mutate(key=_DROP), "missing_field"),
        (mutate(tenant=42), "wrong_type"),
        (mutate(subject=["a", "list"]), "wrong_type"),
        (mutate(entities="not-a-list"), "wrong_type"),
        (mutate(confidence="high"), "wrong_type"),
        (mutate(observed_at="yesterday"), "invalid_time"),
        (mutate(observed_at="2026-13-45T99:00:00Z"), "invalid_time"),
        (mutate(observed_at="2026-01-02T03:04:05"), "invalid_time"),  # no timezone
        (mutate(valid_to="2020-01-01T00:00:00Z"), "invalid_time"),  # ends before it starts
        (mutate(tenant=""), "invalid_value"),
        (mutate(subject="   "), "invalid_value"),
        (mutate(content=""), "invalid_value"),
        (mutate(kind="mood"), "unknown_value"),
        (mutate(confidence=1.5), "invalid_value"),
        (mutate(source={"type": "explicit"}, confidence=0.3), "invalid_value"),
        (mutate(schema_version=99), "unsupported_schema"),
        (mutate(surprise_field=True), "unknown_field"),
        (mutate(content="x" * 20_000), "invalid_value"),  # over MAX_CONTENT_CHARS
        # what PostgreSQL could never store is refused by the contract, never retried forever
        (mutate(content="nul \u0000 inside"), "unstorable_text"),
        (mutate(subject="user:\u0000"), "unstorable_text"),
        (mutate(value={"a": ["ok", "nul\u0000"]}), "unstorable_text"),
        (mutate(value={"k\u0000": 1}), "unstorable_text"),
        (mutate(entities=["P1", "\u0000"]), "unstorable_text"),
        # JSON that only the standard parser reads (as every door and reader does): judged by what it holds
        (_with(mutate(), b'"content":"a note that is fine"', b'"content":"lone \\ud800 surrogate"'), "unstorable_text"),
        (mutate(value=_nested(40)), "too_deep"),
        (
            _with(mutate(), b'"value":', b'"value":' + b"[" * 1100 + b"]" * 1100 + b',"x":'),
            "too_deep",
        ),  # past the parser
        (_with(mutate(), b'"value":', b'"value":1e999,"x":'), "number_out_of_range"),  # an infinity
        (_with(mutate(), b'"value":', b'"value":NaN,"x":'), "number_out_of_range"),
        (_with(mutate(), b'"value":', b'"value":123456789012345678901234567890,"x":'), "number_out_of_range"),
        (mutate(observed_at="2026-01-02T03:04Z"), "invalid_time"),  # no seconds
        (mutate(observed_at="2026-01-02T03:04:05.1234567Z"), "invalid_time"),  # 7 fractional digits
        (mutate(observed_at="9999-12-31T23:59:59-01:00"), "invalid_time"),  # past year 9999 in UTC
        (mutate(observed_at="0001-01-01T00:00:00+01:00"), "invalid_time"),  # before year 1 in UTC
        (mutate(observed_at="2099-01-01T00:00:00Z"), "clock_skew"),  # far ahead of the record timestamp
        (mutate(target_version="v1"), "invalid_value"),  # only a retraction targets a version
        # an erasure is never sealed: content or a value on one would stay in clear text for good
        (mutate(type="subject.erased", key=_DROP), "invalid_value"),
        (b'{"type": "memory.asserted", "content": "' + b"x" * (MAX_EVENT_BYTES + 10) + b'"}', "too_large"),
    ]
    return corpus


_DROP = object()


def _with(raw: bytes, old: bytes, new: bytes) -> bytes:
    """Raw bytes no encoder would write (an escaped lone surrogate, a number past a double)."""
    assert old in raw
    return raw.replace(old, new, 1)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value
