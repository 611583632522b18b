"""The decoder's fast path (`contract.storable_json`) never changes a record's verdict.

A record whose bytes `storable_json` clears skips the walk that refuses what no store could keep (NUL, lone
surrogates, integers outside 64 bits, non-finite numbers, nesting deeper than MAX_VALUE_DEPTH). That is only right
if orjson itself refuses the rest and the byte checks are conservative, so: orjson's refusals are pinned here, and
thousands of generated hostile records get the same verdict (the same event, or the same code, field and message)
with the fast path as with the full check.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from producers.contract import (
    INT_MAX,
    INT_MIN,
    MAX_VALUE_DEPTH,
    InvalidEvent,
    _check_json,
    decode_value,
    storable_json,
)
from producers.records import decode_record

pytestmark = pytest.mark.unit

NOW = datetime(2026, 6, 1, tzinfo=UTC)
SKEW = timedelta(minutes=5)


@pytest.mark.parametrize(
    "raw",
    [
        b'["\\ud800"]',  # a lone high surrogate, escaped
        b'["\\udc00x"]',  # a lone low surrogate, escaped
        b'["\xed\xa0\x80"]',  # a surrogate encoded in UTF-8
        b'["a\x00b"]',  # a raw NUL (a control character) inside a string
        b"[NaN]",
        b"[Infinity]",
        b"[-Infinity]",
        b"[1e400]",  # overflows to infinity
    ],
)
def test_orjson_refuses_what_the_fast_path_leaves_to_it(raw: bytes):
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)


def _hostile(r: random.Random) -> Any:
    """A value the full check may refuse: NUL, big or bounding integers, extreme floats, deep nesting, digit runs."""
    choice = r.randrange(9)
    if choice == 0:
        return r.choice(["a\x00b", "\x00", "ok \\u0000 as text", "汉字\x00"])
    if choice == 1:
        return r.choice([INT_MAX, INT_MAX + 1, 2**64 - 1, INT_MIN, INT_MIN - 1, 10**18, 10**19 - 1, -(10**18)])
    if choice == 2:
        return r.choice([1e308, -1e308, 5e-324, 0.1, 1e18, 12345678901234567890.0])
    if choice == 3:
        depth = r.randrange(MAX_VALUE_DEPTH - 3, MAX_VALUE_DEPTH + 4)
        value: Any = r.choice([1, "x", None])
        for _ in range(depth):
            value = [value] if r.random() < 0.5 else {"k": value}
        return value
    if choice == 4:
        return "".join(r.choice("0123456789") for _ in range(r.randrange(15, 25)))  # digits inside a string
    if choice == 5:
        return {"k\x00": 1} if r.random() < 0.5 else {"汉字": [1, 2, {"n": 10**19}]}
    if choice == 6:
        return [_hostile(r) for _ in range(r.randrange(1, 4))]
    if choice == 7:
        return "\U0001f3b5 fine text ünïcode"
    return r.randrange(-(10**6), 10**6)


def _record(r: random.Random, i: int) -> bytes:
    event: dict[str, Any] = {
        "event_id": f"e{i}",
        "type": "memory.asserted",
        "tenant": "acme",
        "subject": f"user:{i}",
        "key": "pref.x",
        "value": _hostile(r),
        "content": "a fine note",
        "entities": ["Ann"],
        "observed_at": "2026-05-31T23:59:00Z",
    }
    for _ in range(r.randrange(0, 3)):  # the hostile value put anywhere else too
        event[r.choice(["content", "subject", "key", "entities", "importance", "scope", "source", "tags"])] = (
            _hostile(r) if r.random() < 0.8 else [_hostile(r)]
        )
    # the stdlib writes what orjson will not (integers past 64 bits), \u escapes or raw UTF-8
    return json.dumps(event, ensure_ascii=r.random() < 0.5).encode()


def _verdict(outcome: Any) -> Any:
    return outcome.model_dump() if not isinstance(outcome, InvalidEvent) else outcome.as_dict()


def _full_check(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "bad_json"
    try:
        return _verdict(decode_value(data, default_observed_at=NOW, max_future_skew=SKEW, storable=False))
    except InvalidEvent as exc:
        return _verdict(exc)


def test_the_fast_path_gives_every_record_the_verdict_of_the_full_check():
    r = random.Random(20261202)
    cleared = refused_codes = 0
    codes: set[str] = set()
    for i in range(4000):
        raw = _record(r, i)
        incoming = decode_record("t", 0, i, raw, timestamp_ms=int(NOW.timestamp() * 1000), max_future_skew=SKEW)
        fast = _verdict(incoming.event) if incoming.event is not None else _verdict(incoming.error)
        full = _full_check(raw)
        if full == "bad_json":
            assert incoming.error is not None and incoming.error.code == "bad_json"
            continue
        assert fast == full, raw
        if storable_json(raw):
            cleared += 1
            for k, v in orjson.loads(raw).items():  # what the fast path skips would have refused nothing
                _check_json(v, k)
        if incoming.error is not None:
            refused_codes += 1
            codes.add(incoming.error.code)
    # the generator reaches both sides of the fast path and every refusal it stands in for
    assert cleared > 500 and refused_codes > 500
    assert {"unstorable_text", "number_out_of_range", "too_deep"} <= codes
