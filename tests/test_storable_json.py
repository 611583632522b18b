"""The decoder's fast path (`contract.storable_json`) never changes a record's verdict.

A record whose bytes `storable_json` clears skips the walk that refuses what no store could keep (NUL, lone
surrogates, integers outside 64 bits, non-finite numbers, nesting deeper than MAX_VALUE_DEPTH). That is only right
if orjson itself refuses the rest and the byte checks are conservative, so: orjson's refusals are pinned here, and
thousands of generated hostile records get the same verdict (the same event, or the same code, field and message)
with the fast path as with the full check.

The producer's fast path (`contract.from_dict_encoded`, what the SDK publishes with) leaves the same walk to the record
it writes, and builds the wire without model_dump: generated events of Python values (what no JSON reading gives
too) get the same event, wire and bytes, or the same error, as validation with the walk and the model_dump wire; a
corpus pins the records byte for byte.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest

from producers.contract import (
    INT_MAX,
    INT_MIN,
    MAX_VALUE_DEPTH,
    EventType,
    InvalidEvent,
    Kind,
    MemoryEvent,
    Source,
    SourceType,
    _check_json,
    decode_value,
    encode_wire,
    from_dict,
    from_dict_encoded,
    read_json,
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
        return r.choice([1e308, -1e308, 5e-324, 0.1, 1e18, 12345678901234567890.0, -0.0, -0.5, -0.05, 0.0])
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
    if event["type"] == "subject.erased":  # an erasure carries nothing about its subject but its id
        event = {k: v for k, v in event.items() if k not in ("key", "value", "content", "entities")}
    for _ in range(r.randrange(0, 3)):  # the hostile value put anywhere else too
        event[r.choice(["content", "subject", "key", "entities", "importance", "scope", "source", "tags"])] = (
            _hostile(r) if r.random() < 0.8 else [_hostile(r)]
        )
    # the stdlib writes what orjson will not (integers past 64 bits), \u escapes or raw UTF-8
    raw = json.dumps(event, ensure_ascii=r.random() < 0.5).encode()
    if r.random() < 0.05:  # a literal no float writes: non-zero, too small for a double (read as 0)
        tiny = r.choice([b"1e-400", b"-2.5E-0330", b"0e-999"])
        raw = raw.replace(b'"event_id": ', b'"importance": ' + tiny + b', "event_id": ')
    return raw


def _verdict(outcome: Any) -> Any:
    return outcome.model_dump() if not isinstance(outcome, InvalidEvent) else outcome.as_dict()


def _full_check(raw: bytes) -> Any:
    try:
        data = read_json(raw)  # as every reader of the ledger reads a record
    except ValueError:
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


# -- the producer's fast path: `from_dict_encoded` (the SDK) against from_dict, to_wire and encode_wire ------------


class _Text(str):
    """A str subclass: the walk reads it as text, the fast path only as plain JSON."""


def _adversarial(r: random.Random) -> Any:
    """What a Python caller can put in a field: the decoder's hostile values and what no JSON reading gives."""
    choice = r.randrange(16)
    if choice < 6:
        return _hostile(r)
    if choice == 6:
        return r.choice([float("nan"), float("inf"), -float("inf"), 2**64, -(2**70)])
    if choice == 7:
        return r.choice(["a\ud800b", "\udfff", ["ok", "x\ud800"], {"k\ud800": 1}])  # lone surrogates
    if choice == 8:
        return r.choice([("a", "b\x00"), ("ok",), {"a", "b\x00"}, frozenset({1}), b"a\x00b", bytearray(b"x")])
    if choice == 9:
        return r.choice(
            [
                datetime(2026, 5, 1, tzinfo=UTC),
                datetime(2026, 5, 1),  # naive
                datetime(2026, 5, 1, 12, tzinfo=timezone(timedelta(hours=-7))),
                datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # before year 1 once in UTC
            ]
        )
    if choice == 10:
        return r.choice(
            ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2026-06-01T00:06:00Z", "2026-06-01T00:04:59Z"]
        )
    if choice == 11:
        return r.choice(
            [Source(type="imported", ref="r\x00"), Source(), SourceType.EXPLICIT, EventType.ASSERTED, Kind.EVENT]
        )
    if choice == 12:
        return r.choice([_Text("plain"), _Text("nul\x00"), {"k": _Text("x\x00")}, [_Text("a"), "a "]])
    if choice == 13:
        loop: list[Any] = [1]
        loop.append(loop)  # a value that contains itself
        return r.choice([loop, {1: "int key"}, {"k": object()}, ["  spaced  ", "spaced", ""]])
    if choice == 14:
        return r.choice(["x" * 300_000, ["😀" * 250] * 64, 1, True, 0.5, "  ", "\x00", None])
    return r.choice([{"type": "explicit"}, {"type": "inferred", "service": "s\x00"}, {"partition": 1, "offset": 2**63}])


_FIELDS_TO_SPOIL = [*MemoryEvent.model_fields, "unknown_field", "text"]


def _python_event(r: random.Random, i: int) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": f"e{i}",
        "type": r.choice(["memory.asserted", "memory.retracted", "memory.confirmed", "subject.erased"]),
        "tenant": "acme",
        "subject": f"user:{i}",
        "key": "pref.x",
        "value": _adversarial(r) if r.random() < 0.5 else r.choice([1, "v", None, 2.5]),
        "content": "a fine note",
        "entities": ["Ann", " Ann "],
        "source": {"type": r.choice(["inferred", "explicit"]), "service": "svc"},
        "observed_at": "2026-05-31T23:59:00Z",
    }
    if event["type"] == "subject.erased":  # an erasure carries nothing about its subject but its id
        event = {k: v for k, v in event.items() if k not in ("key", "value", "content", "entities")}
    for _ in range(r.randrange(0, 3)):  # anywhere else too (never a bare None for the id and the time: "not given")
        field = r.choice(_FIELDS_TO_SPOIL)
        value = _adversarial(r)
        if not (value is None and field in ("event_id", "observed_at")):
            event[field] = value
    return event


def _outcome(path: Any, data: dict[str, Any]) -> Any:
    """An event, its wire and its bytes, or what was raised (type, text, and an InvalidEvent's code, field, message)."""
    try:
        event, wire, raw = path(data, now=NOW, max_future_skew=SKEW)
    except Exception as exc:  # noqa: BLE001 - any exception is part of the verdict
        return (type(exc).__name__, str(exc), exc.as_dict() if isinstance(exc, InvalidEvent) else None)
    return (event.model_dump(), list(wire.items()), raw)


def _full_path(data: Any, now: datetime, max_future_skew: timedelta) -> tuple[MemoryEvent, dict[str, Any], bytes]:
    event = from_dict(data, now=now, max_future_skew=max_future_skew)  # validation with the walk, as the SDK did
    wire = event._dumped_wire()  # the wire from model_dump, as to_wire was built
    return event, wire, encode_wire(wire)


def test_the_producers_fast_path_gives_every_event_the_verdict_of_the_full_path():
    """NUL, lone surrogates, integers past 64 bits, NaN, deep and self-containing values, Python types JSON has not,
    edge and future times, oversized records, unknown fields: the same event, wire and bytes, or the same error."""
    r = random.Random(20261203)
    accepted = 0
    codes: set[str] = set()
    for i in range(6000):
        data = _python_event(r, i)
        full = _outcome(_full_path, data)
        assert _outcome(from_dict_encoded, data) == full, data
        if isinstance(full[0], dict):
            accepted += 1
        elif full[2] is not None:
            codes.add(full[2]["code"])
    assert accepted > 1500
    assert {"unstorable_text", "number_out_of_range", "too_deep", "too_large", "clock_skew", "unknown_field"} <= codes


# a corpus of events and the sha256 of their records as the SDK wrote them before `to_wire` stopped calling
# model_dump and validation left the walk to the encoded bytes: the records must stay byte for byte the same
_CORPUS_SHA256 = "51504a76250519ced24d3a2c19b51f52ad2b73160e744137b06664e311b5a0b4"


def _corpus() -> list[dict[str, Any]]:
    base = {"tenant": "acme", "subject": "project:P1", "observed_at": "2026-01-02T03:04:05Z"}
    events: list[dict[str, Any]] = []
    values = [8080, "v", None, 2.5, True, -(2**63), 2**63 - 1, 1e308, "汉字 😀", {"a": [1, None, {"b": "c"}]}, [1, "2"]]
    for i, value in enumerate(values):
        events.append({**base, "event_id": f"a{i}", "type": "memory.asserted", "key": f"k{i}", "value": value,
                       "content": f"note {i}", "importance": i / 10})  # fmt: skip
    events += [
        {**base, "event_id": "all", "type": "memory.asserted", "key": "project.port", "value": 1, "content": "c",
         "scope": "prod", "kind": "preference", "entities": [" P1 ", "P1", "P2"], "aliases": ["后端"], "tags": ["t"],
         "source": {"type": "inferred", "service": "svc", "ref": "r", "actor": "a"}, "confidence": 0.7,
         "valid_from": "2026-01-01T00:00:00.5+08:00", "valid_to": "2030-01-01T00:00:00z", "reason": "why"},
        {**base, "event_id": "explicit", "type": "memory.asserted", "key": "k", "value": 1, "content": "c",
         "source": {"type": "explicit"}, "importance": 1, "confidence": 1},
        {**base, "event_id": "episode", "type": "memory.asserted", "kind": "episodic", "content": "met"},
        {**base, "event_id": "retract", "type": "memory.retracted", "key": "k", "reason": "wrong"},
        {**base, "event_id": "retract-v", "type": "memory.retracted", "target_version": "v" * 32},
        {**base, "event_id": "confirm", "type": "memory.confirmed", "key": "k", "scope": "s"},
        {**base, "event_id": "erase", "type": "subject.erased", "reason": "gdpr"},
        {**base, "event_id": "redrive", "type": "memory.asserted", "key": "k", "value": 2, "content": "c",
         "dead_letter": {"partition": 3, "offset": 7}},
        {**base, "event_id": "discard", "type": "deadletter.discarded", "dead_letter": {"partition": 0, "offset": 0},
         "reason": "noise"},
        {**base, "event_id": "v0", "type": "memory.asserted", "key": "k", "value": 1, "text": "v0 text",
         "schema_version": 0, "observed_at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=2)))},
    ]  # fmt: skip
    return events


def test_the_records_the_sdk_writes_are_byte_for_byte_those_it_wrote_before():
    import hashlib

    records = [from_dict_encoded(e)[2] for e in _corpus()]
    assert records == [encode_wire(from_dict(e)._dumped_wire()) for e in _corpus()]
    assert hashlib.sha256(b"\n".join(records)).hexdigest() == _CORPUS_SHA256


class _Bag:
    """An iterable of the caller's own: iterable, but not a JSON type."""

    def __iter__(self):
        return iter(["a"])


NOT_JSON_CONTAINERS = {
    "set": lambda items: set(items),
    "frozenset": lambda items: frozenset(items),
    "generator": lambda items: (x for x in items),
    "iterator": lambda items: iter(list(items)),
    "deque": lambda items: __import__("collections").deque(items),
    "dict_keys": lambda items: dict.fromkeys(items).keys(),
    "dict_values": lambda items: {i: x for i, x in enumerate(items)}.values(),
    "range": lambda items: range(len(items)),
    "own iterable": lambda items: _Bag(),
}


@pytest.mark.parametrize("door", [from_dict, from_dict_encoded], ids=["from_dict", "from_dict_encoded"])
@pytest.mark.parametrize("field", ["entities", "aliases", "value", "value.nested"])
@pytest.mark.parametrize("kind", sorted(NOT_JSON_CONTAINERS))
def test_a_container_json_does_not_have_is_refused_naming_its_field(door, field, kind):
    """A set, a generator, a deque, a dict view...: validation would make a list of it with its items unchecked (a
    NUL inside got through to the worker's dead letters), read a one-shot iterator empty, or order a set differently
    in each process; every door refuses it, naming the field, whatever its items."""
    container = NOT_JSON_CONTAINERS[kind](["a\x00", "b"])
    data = {"type": "memory.asserted", "tenant": "acme", "event_id": "e1", "subject": "project:P1", "key": "k",
            "value": 1, "content": "c", "observed_at": "2026-06-01T00:00:00Z"}  # fmt: skip
    data.update({"value": {"nested": container}} if field == "value.nested" else {field: container})
    with pytest.raises(InvalidEvent) as refused:
        door(data, now=NOW, max_future_skew=SKEW)
    assert refused.value.code == "wrong_type", refused.value
    assert refused.value.field == field
    assert f"is a {type(container).__name__}, which JSON does not have" in str(refused.value)


NOT_JSON_SCALARS = {
    "object": object(),
    "bytes": b"ab",
    "bytearray": bytearray(b"ab"),
    "complex": 1 + 2j,
    "Decimal": __import__("decimal").Decimal("1.5"),
    "own class": _Bag,
}


@pytest.mark.parametrize("door", [from_dict, from_dict_encoded], ids=["from_dict", "from_dict_encoded"])
@pytest.mark.parametrize("field", ["value", "value.nested", "value.nested.0"])
@pytest.mark.parametrize("kind", sorted(NOT_JSON_SCALARS))
def test_a_value_json_cannot_write_is_refused_naming_its_field(door, field, kind):
    """Anything inside a value that is no JSON (bytes, an object, a complex number...) is an InvalidEvent naming
    where it is, at every door, never the encoder's TypeError after validation passed."""
    thing = NOT_JSON_SCALARS[kind]
    value = {"value": thing, "value.nested": {"nested": thing}, "value.nested.0": {"nested": [thing]}}[field]
    data = {"type": "memory.asserted", "tenant": "acme", "event_id": "e1", "subject": "project:P1", "key": "k",
            "value": value, "content": "c", "observed_at": "2026-06-01T00:00:00Z"}  # fmt: skip
    with pytest.raises(InvalidEvent) as refused:
        door(data, now=NOW, max_future_skew=SKEW)
    assert (refused.value.code, refused.value.field) == ("wrong_type", field), refused.value
    assert f"is of type {type(thing).__name__}, which JSON does not have" in str(refused.value)


@pytest.mark.parametrize("door", [from_dict, from_dict_encoded], ids=["from_dict", "from_dict_encoded"])
@pytest.mark.parametrize("key", [1, 1.5, None, ("a",)], ids=["int", "float", "None", "tuple"])
def test_a_dict_key_that_is_not_a_string_is_refused_naming_it(door, key):
    data = {"type": "memory.asserted", "tenant": "acme", "event_id": "e1", "subject": "project:P1", "key": "k",
            "value": {"a": {key: 1}}, "content": "c", "observed_at": "2026-06-01T00:00:00Z"}  # fmt: skip
    with pytest.raises(InvalidEvent) as refused:
        door(data, now=NOW, max_future_skew=SKEW)
    assert (refused.value.code, refused.value.field) == ("wrong_type", f"value.a.{key!r}"), refused.value
