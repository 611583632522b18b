"""The event contract (producers/contract.py) as pure functions: no server needed."""

from __future__ import annotations

import itertools
import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest

from producers import contract
from producers.contract import (
    MAX_EVENT_BYTES,
    EventType,
    InvalidEvent,
    Kind,
    MemoryEvent,
    SourceType,
    decode,
    encode,
    from_dict,
    kafka_key,
    memory_id_for,
)

pytestmark = pytest.mark.unit


def _asserted(**over: Any) -> dict[str, Any]:
    base = {
        "type": "memory.asserted",
        "tenant": "acme",
        "subject": "project:P1",
        "key": "project.port",
        "value": 8080,
        "content": "Project P1's backend listens on port 8080",
    }
    return {k: v for k, v in {**base, **over}.items() if v is not ...}


def _refused(data: Any) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as info:
        from_dict(data)
    return info.value


# -- required fields, types, enums -----------------------------------------------------------


@pytest.mark.parametrize("field", ["type", "tenant", "subject"])
def test_a_missing_required_field_is_named(field: str) -> None:
    err = _refused(_asserted(**{field: ...}))
    assert (err.code, err.field) == ("missing_field", field)


def test_content_is_required_for_an_assertion_and_key_unless_episodic() -> None:
    err = _refused(_asserted(content=...))
    assert (err.code, err.field) == ("missing_field", "content")
    err = _refused(_asserted(key=...))
    assert (err.code, err.field) == ("missing_field", "key")
    assert from_dict(_asserted(key=..., kind="episodic")).key is None


@pytest.mark.parametrize("etype", ["memory.retracted", "memory.confirmed"])
def test_retract_and_confirm_need_a_key_erasure_does_not(etype: str) -> None:
    err = _refused({"type": etype, "tenant": "acme", "subject": "user:1"})
    assert (err.code, err.field) == ("missing_field", "key")
    erased = from_dict({"type": "subject.erased", "tenant": "acme", "subject": "user:1"})
    assert erased.type is EventType.ERASED


# an erasure is never sealed (it must stay readable once the subject's key is destroyed): each of these would put
# what the subject said, or who said it, in clear text in the ledger for good
_NOT_ON_AN_ERASURE = [
    ({"key": "contact.email"}, "key"),
    ({"scope": "home"}, "scope"),
    ({"content": "Ann's address is ann@example.com"}, "content"),
    ({"value": "ann@example.com"}, "value"),
    ({"value": 0}, "value"),
    ({"value": {"mail": "ann@example.com"}}, "value"),
    ({"entities": ["Ann"]}, "entities"),
    ({"aliases": ["ann"]}, "aliases"),
    ({"tags": ["gdpr"]}, "tags"),
    ({"source": {"type": "explicit", "ref": "ticket of ann@example.com"}}, "source.ref"),
    ({"source": {"type": "explicit", "actor": "ann"}}, "source.actor"),
]


@pytest.mark.parametrize(("over", "field"), _NOT_ON_AN_ERASURE)
def test_an_erasure_carries_nothing_about_its_subject_but_its_id_and_a_reason(over: dict, field: str) -> None:
    erasure = {"type": "subject.erased", "tenant": "acme", "subject": "user:1", "reason": "gdpr"}
    err = _refused({**erasure, **over})
    assert (err.code, err.field) == ("invalid_value", field)
    assert "never sealed" in err.message
    # the same with the null a client writes for "not given", and the fields an erasure does take
    kept = from_dict({**erasure, "content": None, "value": None, "source": {"type": "explicit", "service": "crm"}})
    assert (kept.type, kept.reason, kept.content, kept.value) == (EventType.ERASED, "gdpr", None, None)


@pytest.mark.parametrize(
    ("over", "code", "field"),
    [
        ({"tenant": 42}, "wrong_type", "tenant"),
        ({"subject": ["x"]}, "wrong_type", "subject"),
        ({"importance": "high"}, "wrong_type", "importance"),
        ({"entities": "P1"}, "wrong_type", "entities"),
        ({"confidence": 1.5}, "invalid_value", "confidence"),
        ({"importance": -0.1}, "invalid_value", "importance"),
        ({"tenant": "a|b"}, "invalid_value", "tenant"),  # the key separator cannot be in a tenant
        ({"subject": "   "}, "invalid_value", "subject"),
        ({"entities": ["P1", " "]}, "invalid_value", "entities"),
        ({"content": "x" * (contract.MAX_CONTENT_CHARS + 1)}, "invalid_value", "content"),
        ({"colour": "red"}, "unknown_field", "colour"),
    ],
)
def test_wrong_types_and_values_are_refused_naming_the_field(over: dict, code: str, field: str) -> None:
    err = _refused(_asserted(**over))
    assert (err.code, err.field) == (code, field)
    assert err.message
    assert err.as_dict() == {"code": code, "field": field, "message": err.message}


@pytest.mark.parametrize(
    ("over", "code", "field"),
    [
        ({"type": "memory.deleted"}, "unknown_type", "type"),
        ({"kind": "rumour"}, "unknown_value", "kind"),
        ({"source": {"type": "hearsay"}}, "unknown_value", "source.type"),
        ({"source": {"type": "explicit", "colour": "red"}}, "unknown_field", "source.colour"),
    ],
)
def test_enum_values_outside_the_contract_are_refused(over: dict, code: str, field: str) -> None:
    err = _refused(_asserted(**over))
    assert (err.code, err.field) == (code, field)


@pytest.mark.parametrize("kind", [k.value for k in Kind])
def test_every_kind_and_type_in_the_contract_is_accepted(kind: str) -> None:
    assert from_dict(_asserted(kind=kind)).kind is Kind(kind)
    for stype in SourceType:
        assert from_dict(_asserted(source={"type": stype.value})).source.type is stype


def test_lists_are_stripped_and_deduplicated_in_order() -> None:
    event = from_dict(_asserted(entities=[" P1", "OD1", "P1"], aliases=["port", "端口"]))
    assert event.entities == ["P1", "OD1"]
    assert event.aliases == ["port", "端口"]


# -- RFC 3339 times ----------------------------------------------------------------------------


def test_times_are_rfc3339_and_normalised_to_utc() -> None:
    event = from_dict(_asserted(observed_at="2026-01-02T11:04:05+08:00", valid_to="2026-02-01T00:00:00Z"))
    assert event.observed_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert event.observed_at.utcoffset() == timedelta(0)
    assert event.to_wire()["observed_at"] == "2026-01-02T03:04:05.000000Z"


@pytest.mark.parametrize(
    "value",
    ["2026-01-02T03:04:05", "2026-01-02", "yesterday", "1700000000", 1700000000, 1.7e9, "02/01/2026 03:04"],
)
@pytest.mark.parametrize("field", ["observed_at", "valid_from", "valid_to"])
def test_naive_or_non_rfc3339_times_are_refused(field: str, value: Any) -> None:
    err = _refused(_asserted(**{field: value}))
    assert (err.code, err.field) == ("invalid_time", field)


def test_valid_to_must_come_after_valid_from() -> None:
    err = _refused(_asserted(valid_from="2026-01-02T00:00:00Z", valid_to="2026-01-01T00:00:00Z"))
    assert err.field == "valid_to"


# -- defaults ---------------------------------------------------------------------------------


def test_defaults_observed_now_valid_from_observed_scope_empty() -> None:
    before = datetime.now(UTC)
    event = from_dict(_asserted())
    after = datetime.now(UTC)
    assert before <= event.observed_at <= after
    assert event.valid_from == event.observed_at
    assert event.valid_to is None
    assert event.scope == ""
    assert event.kind is Kind.STATE
    assert event.source.type is SourceType.SYSTEM
    assert event.schema_version == contract.CURRENT_SCHEMA_VERSION
    assert event.event_id  # generated


def test_generated_event_ids_are_distinct_and_a_given_one_is_kept() -> None:
    ids = {from_dict(_asserted()).event_id for _ in range(200)}
    assert len(ids) == 200
    assert from_dict(_asserted(event_id="evt-1")).event_id == "evt-1"


def test_record_timestamp_fills_a_missing_observed_at_only() -> None:
    ts = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)
    raw = orjson.dumps(_asserted(event_id="evt-ts"))
    assert decode(raw, default_observed_at=ts).observed_at == ts
    assert decode(raw, default_observed_at=ts).valid_from == ts
    given = orjson.dumps(_asserted(event_id="evt-ts", observed_at="2026-01-01T00:00:00Z"))
    assert decode(given, default_observed_at=ts).observed_at == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("event_id", [..., None])
def test_a_ledger_record_without_an_event_id_is_refused_not_given_a_fresh_one(event_id: Any) -> None:
    # a minted id would differ on every replay: a rebuild would make another version of the same record
    for etype in ("memory.asserted", "memory.retracted", "memory.confirmed", "subject.erased"):
        raw = orjson.dumps(_asserted(type=etype, event_id=event_id))
        with pytest.raises(InvalidEvent) as err:
            decode(raw)
        assert (err.value.code, err.value.field) == ("missing_field", "event_id")
    assert decode(orjson.dumps(_asserted(event_id="evt-1"))).event_id == "evt-1"


# -- identity ---------------------------------------------------------------------------------


def test_memory_id_is_stable_for_the_same_fact() -> None:
    a = from_dict(_asserted(value=8080))
    b = from_dict(_asserted(value=9090, content="now 9090"))
    assert a.memory_id == b.memory_id == memory_id_for("acme", "project:P1", "project.port", "")
    assert a.event_id != b.event_id


def test_memory_id_differs_per_tenant_subject_key_and_scope() -> None:
    base = ("acme", "project:P1", "project.port", "")
    variants = [
        base,
        ("globex", "project:P1", "project.port", ""),
        ("acme", "project:P2", "project.port", ""),
        ("acme", "project:P1", "project.host", ""),
        ("acme", "project:P1", "project.port", "env:test"),
        # no ambiguity from concatenation
        ("acme", "project:P1project.port", "", ""),
        ("acmeproject:P1", "", "project.port", ""),
    ]
    ids = {memory_id_for(*v) for v in variants}
    assert len(ids) == len(variants)
    scoped = from_dict(_asserted(scope="env:test"))
    assert scoped.memory_id == memory_id_for("acme", "project:P1", "project.port", "env:test")


def test_episodic_identity_comes_from_the_event_id() -> None:
    one = from_dict(_asserted(key=..., kind="episodic", event_id="e1", content="met at the station"))
    two = from_dict(_asserted(key=..., kind="episodic", event_id="e2", content="met at the station"))
    again = from_dict(_asserted(key=..., kind="episodic", event_id="e1", content="met at the station"))
    assert one.memory_id != two.memory_id
    assert one.memory_id == again.memory_id
    assert one.memory_id == memory_id_for("acme", "project:P1", None, episodic_event_id="e1")


def test_kafka_key_is_tenant_bar_subject() -> None:
    event = from_dict(_asserted())
    assert event.kafka_key == kafka_key("acme", "project:P1") == b"acme|project:P1"


# -- source and confidence --------------------------------------------------------------------


def test_explicit_source_carries_confidence_one() -> None:
    assert from_dict(_asserted(source={"type": "explicit"})).confidence == 1.0
    assert from_dict(_asserted(source={"type": "explicit"}, confidence=1.0)).confidence == 1.0
    assert from_dict(_asserted(source={"type": "inferred"}, confidence=0.5)).confidence == 0.5
    assert from_dict(_asserted(source={"type": "inferred"})).confidence == 0.8


def test_explicit_source_with_lower_confidence_is_refused() -> None:
    err = _refused(_asserted(source={"type": "explicit", "ref": "msg-1"}, confidence=0.5))
    assert err.field == "confidence"
    assert err.code == "invalid_value"


# -- schema versions --------------------------------------------------------------------------


def test_v0_text_is_upcast_to_content() -> None:
    legacy = {k: v for k, v in _asserted().items() if k != "content"}
    for record in ({**legacy, "text": "old words"}, {**legacy, "schema_version": 0, "text": "old words"}):
        event = from_dict(record)
        assert event.content == "old words"
        assert event.schema_version == 1
        assert "text" not in event.to_wire()


def test_a_future_schema_version_is_refused() -> None:
    err = _refused(_asserted(schema_version=contract.CURRENT_SCHEMA_VERSION + 1))
    assert (err.code, err.field) == ("unsupported_schema", "schema_version")
    err = _refused(_asserted(schema_version="1"))
    assert (err.code, err.field) == ("wrong_type", "schema_version")


def test_an_unknown_old_version_without_upcaster_is_refused() -> None:
    err = _refused(_asserted(schema_version=-1))
    assert err.code == "unsupported_schema"


# -- wire format ------------------------------------------------------------------------------


def test_round_trip_encode_decode() -> None:
    event = from_dict(
        _asserted(
            value={"port": 8080, "tls": True},
            scope="env:prod",
            entities=["P1"],
            aliases=["后端端口"],
            tags=["infra"],
            source={"type": "explicit", "service": "chat", "ref": "msg-17", "actor": "user:42"},
            importance=0.9,
            observed_at="2026-01-02T03:04:05.123456Z",
            valid_to="2027-01-01T00:00:00Z",
        )
    )
    raw = encode(event)
    assert isinstance(raw, bytes)
    again = decode(raw)
    assert again == event
    assert encode(again) == raw
    wire = orjson.loads(raw)
    assert wire["type"] == "memory.asserted" and wire["kind"] == "state"
    assert wire["source"] == {"type": "explicit", "service": "chat", "ref": "msg-17", "actor": "user:42"}


def test_null_value_survives_the_round_trip() -> None:
    event = MemoryEvent(type=EventType.ASSERTED, tenant="acme", subject="s", key="k", content="unknown", value=None)
    assert orjson.loads(encode(event))["value"] is None
    assert decode(encode(event)) == event


def test_too_large_record_is_refused_before_parsing() -> None:
    raw = orjson.dumps(_asserted(value="x" * MAX_EVENT_BYTES))
    with pytest.raises(InvalidEvent) as info:
        decode(raw)
    assert info.value.code == "too_large"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "bad_json"),
        (b"", "empty"),
        (b"\xff\xfe", "bad_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"an event"', "not_an_object"),
        (b"null", "not_an_object"),
        (None, "empty"),
    ],
)
def test_bad_json_and_non_objects_are_refused_with_a_code(raw: bytes | None, code: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        decode(raw)
    assert info.value.code == code
    assert code in str(info.value)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"null", "null"), (b"[1]", "an array"), (b"7", "a number"), (b"true", "a boolean"), (b'"x"', "a string")],
)
def test_what_is_no_object_is_named_as_json_names_it(raw: bytes, kind: str) -> None:
    """The refusal said Python's type (`got NoneType`, `got list`): its reader wrote JSON."""
    with pytest.raises(InvalidEvent) as info:
        decode(raw)
    assert info.value.message == f"an event is a JSON object, got {kind}"


# -- everything the projector could never store is refused at the door -------------

_NUL, _SURROGATE = "a\x00b", "a\ud800b"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"content": _NUL}, "content"),
        ({"subject": _NUL}, "subject"),
        ({"key": "k" + _NUL}, "key"),
        ({"scope": _NUL}, "scope"),
        ({"tenant": "t" + _NUL}, "tenant"),
        ({"event_id": _NUL}, "event_id"),
        ({"value": _NUL}, "value"),
        ({"value": {"a": [1, {"b": _NUL}]}}, "value.a.1.b"),
        ({"value": {"k\x00": 1}}, "value.'k\\x00'"),
        ({"entities": ["ok", _NUL]}, "entities.1"),
        ({"aliases": [_NUL]}, "aliases.0"),
        ({"tags": [_NUL]}, "tags.0"),
        ({"source": {"type": "imported", "ref": _NUL}}, "source.ref"),
        ({"content": _SURROGATE}, "content"),
        ({"value": [_SURROGATE]}, "value.0"),
    ],
)
def test_text_postgresql_cannot_store_is_refused_naming_its_path(over: dict, field: str) -> None:
    err = _refused(_asserted(**over))
    assert (err.code, err.field) == ("unstorable_text", field), err


@pytest.mark.parametrize(
    "value",
    [10**30, 2**64, 2**63, -(2**63) - 1, float("nan"), float("inf"), -float("inf"), {"deep": [1, 2**70]}, -0.0,
     {"x": [-0.0]}],  # PostgreSQL's jsonb keeps -0.0 as 0
)  # fmt: skip
def test_numbers_outside_int64_non_finite_or_a_negative_zero_are_refused(value: Any) -> None:
    err = _refused(_asserted(value=value))
    assert err.code == "number_out_of_range" and err.field.startswith("value"), err


@pytest.mark.parametrize(
    ("literal", "refused"),
    [(b"-0.0", True), (b"-0", False), (b"-0e5", True), (b"1e-400", True), (b"-2.5E-0400", True),
     (b"0e-400", False), (b"0.0000e-999", False), (b"1e-300", False), (b"5e-324", False), (b"-0.5", False),
     (b"[1, {\"a\": 4.9e-999}]", True), (b"0." + b"0" * 400 + b"1", True), (b"0." + b"0" * 300 + b"1", False),
     (b"0." + b"0" * 250 + b"1e-80", True), (b"0." + b"0" * 230 + b"1E-099", True)],
)  # fmt: skip
def test_a_number_the_stores_would_read_as_another_is_refused_from_the_bytes(literal: bytes, refused: bool) -> None:
    """A record's bytes as the worker and the door read them: a negative zero, and a non-zero literal too small for
    a double (read as 0), are refused by name; a zero, and a tiny number a double keeps, are read as written."""
    raw = b'{"type": "memory.asserted", "tenant": "t", "subject": "s", "key": "k", "content": "c", "value": %s}'
    value, cleared = contract.read_record(raw % literal, 10**6)
    if refused:
        err = _refused(value)
        assert (err.code, err.field.split(".")[0]) == ("number_out_of_range", "value"), err
        assert not cleared
    else:
        assert from_dict(value).value == json.loads(literal)


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), 1.5e308, 5e-324, 0.0, 0])
def test_numbers_kept_exactly_pass_and_round_trip(value: Any) -> None:
    event = from_dict(_asserted(value=value))
    assert decode(encode(event)).value == value


@pytest.mark.parametrize("field", ["importance", "confidence"])
def test_a_negative_zero_score_is_zero_as_written_read_and_fingerprinted(field: str) -> None:
    """A score of -0.0 is the score 0: stored as 0 (no store keeps its sign), so it must be the event of 0.0 too; it
    was kept in the fingerprint, and the event as it read back was an `event_id_conflict` with itself."""
    source = {"source": {"type": "inferred", "service": "s"}, "event_id": "z", "observed_at": "2026-01-01T00:00:00Z"}
    zero, negative = (from_dict(_asserted(**{field: v}, **source)) for v in (0.0, -0.0))
    assert math.copysign(1.0, getattr(negative, field)) == 1.0
    assert negative.fingerprint == zero.fingerprint and encode(negative) == encode(zero)
    raw = orjson.dumps(_asserted(**{field: 0.0}, **source)).replace(b":0.0", b":-0.0")
    assert b"-0.0" in raw
    value, _ = contract.read_record(raw, 10**6)
    assert from_dict(value).fingerprint == zero.fingerprint


@pytest.mark.parametrize("field", ["importance", "confidence"])
def test_non_finite_scores_are_refused(field: str) -> None:
    assert _refused(_asserted(**{field: float("nan")})).field == field


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_values_nested_past_the_limit_are_refused_and_at_the_limit_pass() -> None:
    from_dict(_asserted(value=_nested(contract.MAX_VALUE_DEPTH)))
    for depth in (contract.MAX_VALUE_DEPTH + 1, 300, 2000):
        assert _refused(_asserted(value=_nested(depth))).code == "too_deep"


_EMOJI_LIST = ["😀" * 250 + str(i) for i in range(64)]  # 64 items of 256 characters, 4 bytes each


@pytest.mark.parametrize(
    "over",
    [
        {"value": "x" * 300_000},
        {"value": {f"k{i}": "x" * 1000 for i in range(300)}},
        # every field within its own limit, the record past the worker's cap
        {
            "content": "😀" * 16_000,
            "aliases": _EMOJI_LIST,
            "entities": _EMOJI_LIST,
            "tags": _EMOJI_LIST,
            "value": "x" * 6000,
        },
        {
            "content": "😀" * 16_000,
            "aliases": _EMOJI_LIST,
            "entities": _EMOJI_LIST,
            "reason": None,
            "value": "x" * 70_000,
        },
    ],
)
def test_encode_refuses_what_the_worker_would_refuse_for_size(over: dict) -> None:
    event = from_dict(_asserted(**over))
    with pytest.raises(InvalidEvent) as info:
        encode(event)
    assert info.value.code == "too_large"
    if len(orjson.dumps(event.to_wire())) <= MAX_EVENT_BYTES:  # pragma: no cover - the case is built to be large
        pytest.fail("the case is not large")


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01T00:00Z",  # no seconds
        "2026-01-01T00:00:00.1234567Z",  # 7 fractional digits would be cut silently
        "2026-01-01T00:00:00",  # no offset
        "2026-01-01",
        "1700000000",
        "2026-01-01 00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "9999-12-31T23:59:59-01:00",  # past year 9999 once in UTC
        "0001-01-01T00:00:00+01:00",  # before year 1 once in UTC
        "0000-12-31T21:59:59.5-02:00",  # year 0 still, once in UTC
        "0000-12-31T23:00:00Z",
        "0000-12-31T23:00:00+02:00",
        "0000-12-30T23:00:00-23:59",
        "0000-12-31T25:00:00-02:00",
        "+2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00+00:60",  # offset minutes run 00-59: Python would fold these into hours
        "2026-01-01T00:00:00+00:99",
        "2026-01-01T00:00:00-00:75",
        "2026-01-01T00:00:00+23:60",
        "2026-01-01T00:00:00+24:00",
    ],
)
def test_times_are_strict_rfc3339_within_range(text: str) -> None:
    for field in ("observed_at", "valid_from", "valid_to"):
        over = {field: text}
        if field == "valid_to":
            over["valid_from"] = "0001-01-01T00:00:00Z"
        err = _refused(_asserted(**over))
        assert (err.code, err.field) == ("invalid_time", field), (text, err)
    with pytest.raises(ValueError, match="^(must be|is not a valid time|is outside the representable range)"):
        contract.parse_rfc3339(text)


@pytest.mark.parametrize("number", [1700000000, 1700000000.5, True])
def test_a_number_is_never_read_as_a_unix_time(number: Any) -> None:
    assert _refused(_asserted(observed_at=number)).code in ("invalid_time", "wrong_type")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01t01:00:00.5+01:00", datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
        ("2026-01-01T23:59:00+23:59", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01T00:00:00-23:59", datetime(2026, 1, 1, 23, 59, tzinfo=UTC)),
        # the year is judged once in UTC: the last hours of year 0000 behind UTC are in 0001
        ("0000-12-31T22:00:00-02:00", datetime(1, 1, 1, tzinfo=UTC)),
        ("0000-12-31T23:59:59.999999-00:01", datetime(1, 1, 1, 0, 0, 59, 999999, tzinfo=UTC)),
        ("0000-12-31t10:00:00-23:59", datetime(1, 1, 1, 9, 59, tzinfo=UTC)),
    ],
)
def test_valid_rfc3339_times_parse_to_utc(text: str, expected: datetime) -> None:
    assert contract.parse_rfc3339(text) == expected
    assert from_dict(_asserted(observed_at=text)).observed_at == expected


def test_an_observation_too_far_in_the_future_is_refused_with_a_configurable_skew() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    skew = timedelta(minutes=5)
    ok = from_dict(_asserted(observed_at="2026-06-01T00:04:59Z"), now=now, max_future_skew=skew)
    assert ok.observed_at.minute == 4
    for text in ("2026-06-01T00:05:01Z", "2099-01-01T00:00:00Z"):
        with pytest.raises(InvalidEvent) as info:
            from_dict(_asserted(observed_at=text), now=now, max_future_skew=skew)
        assert (info.value.code, info.value.field) == ("clock_skew", "observed_at")
    # the worker's reference is the record timestamp, so a replay years later judges the same
    raw = encode(from_dict(_asserted(observed_at="2026-06-01T00:10:00Z")))
    with pytest.raises(InvalidEvent):
        decode(raw, default_observed_at=now, max_future_skew=skew)
    assert decode(raw, default_observed_at=now + timedelta(minutes=6), max_future_skew=skew)
    # a valid time in the future is a scheduled fact, not a skewed clock
    scheduled = _asserted(observed_at="2026-06-01T00:00:00Z", valid_from="2099-01-01T00:00:00Z")
    assert from_dict(scheduled, now=now, max_future_skew=skew)


@pytest.mark.parametrize(
    "field", ["event_id", "scope", "kind", "entities", "aliases", "tags", "source", "importance", "observed_at"]
)
def test_explicit_null_for_a_defaulted_field_means_absent(field: str) -> None:
    event = from_dict(_asserted(**{field: None}))
    default = MemoryEvent.model_fields[field]
    if field not in ("event_id", "observed_at"):
        got = getattr(event, field)
        want = default.get_default(call_default_factory=True)
        assert got == want, (field, got)


def test_memory_id_is_an_unambiguous_encoding_of_its_parts() -> None:
    pairs = [
        (("acme", "S1", "email\x1fwork", ""), ("acme", "S1\x1femail", "work", "")),
        (("acme", "a|b", "k", ""), ("acme", "a", "b|k", "")),
        (("a", "b", "c", "d"), ("a", "b", "c\x1fd", "")),
        (("t", 'x","y', "k", ""), ("t", "x", 'y","k', "")),
        (("t", "s", "k", ""), ("t", "s", "k", " ")),
    ]
    for left, right in pairs:
        assert memory_id_for(*left) != memory_id_for(*right), (left, right)
    assert memory_id_for("t", "s", None, episodic_event_id="e") != memory_id_for("t", "s", "e")


def test_version_ids_are_scoped_by_tenant() -> None:
    a = from_dict(_asserted(tenant="x", event_id="same"))
    b = from_dict(_asserted(tenant="y", event_id="same"))
    assert a.version_id != b.version_id and a.event_id == b.event_id
    assert a.version_id == contract.version_id_for("x", "same")


def test_fingerprint_is_equal_for_a_retry_and_differs_for_other_content() -> None:
    first = from_dict(_asserted(event_id="e1"))
    retry = from_dict(_asserted(event_id="e1"))  # observed_at defaults anew: still the same event
    assert first.observed_at != retry.observed_at or True
    assert first.fingerprint == retry.fingerprint
    assert from_dict(_asserted(event_id="e1", kind="state", scope="")).fingerprint == first.fingerprint
    for over in (
        {"value": 8081},
        {"subject": "project:P2"},
        {"content": "other"},
        {"valid_from": "2020-01-01T00:00:00Z"},
    ):
        assert from_dict(_asserted(event_id="e1", **over)).fingerprint != first.fingerprint, over


def test_target_version_is_only_for_retractions() -> None:
    retraction = from_dict({**_asserted(), "type": "memory.retracted", "target_version": "v1"})
    assert retraction.target_version == "v1"
    assert _refused(_asserted(target_version="v1")).field == "target_version"


def test_check_storable_names_the_field() -> None:
    assert contract.check_storable("fine / ok", "subject") == "fine / ok"
    with pytest.raises(InvalidEvent) as info:
        contract.check_storable(_NUL, "subject")
    assert (info.value.code, info.value.field) == ("unstorable_text", "subject")


def _isoformat_spelling(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class _Moment(datetime):
    """A datetime subclass: not what validation gives, spelled by the general path."""


def test_every_time_is_spelled_as_isoformat_would_spell_it() -> None:
    """rfc3339 takes orjson's spelling for the UTC times validation gives: the same text as isoformat's, with or
    without microseconds, at the ends of the range, and for any other offset or type of datetime."""
    r = random.Random(20261202)
    offsets = [UTC, timezone(timedelta(0)), timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-7))]
    for _ in range(20_000):
        day = datetime(r.randint(2, 9998), r.randint(1, 12), r.randint(1, 28), tzinfo=r.choice(offsets))
        micro = r.choice([0, 1, 10, 100_000, 999_999, r.randint(0, 999_999)])
        value = day.replace(hour=r.randint(0, 23), minute=r.randint(0, 59), second=r.randint(0, 59), microsecond=micro)
        assert contract.rfc3339(value) == _isoformat_spelling(value), value
    for value in (
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        _Moment(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        _Moment(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=2))),
    ):
        assert contract.rfc3339(value) == _isoformat_spelling(value), value


def test_to_wire_of_an_event_built_without_validation_is_model_dumps() -> None:
    """to_wire reads a validated event's fields as they are (model_dump's wire, key for key and in order); fields of
    other types (a model built or copied without validation) get the record model_dump's wire gives, never an error."""
    event = from_dict(_asserted(observed_at="2026-01-02T03:04:05Z", dead_letter={"partition": 1, "offset": 2}))
    assert list(event.to_wire().items()) == list(event._dumped_wire().items())
    odd = [
        MemoryEvent.model_construct(**{**event.__dict__, "type": "memory.asserted"}),  # a str, not the enum
        MemoryEvent.model_construct(**{**event.__dict__, "source": {"type": "explicit"}}),
        MemoryEvent.model_construct(**{**event.__dict__, "observed_at": "2026-01-02T03:04:05Z"}),
        MemoryEvent.model_construct(**{k: v for k, v in event.__dict__.items() if k != "scope"}),
        event.model_copy(update={"valid_to": None, "reason": None, "entities": ("a", "b")}),
    ]
    for built in odd:
        assert orjson.dumps(built.to_wire()) == orjson.dumps(built._dumped_wire()), built
    wire = event.to_wire()
    wire["entities"].append("changed")  # the wire's lists are its own
    assert "changed" not in event.entities


class _NoEquality(dict):
    """A JSON object that refuses to be compared (as an array does)."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("not comparable")

    __hash__ = object.__hash__


def test_explicit_nulls_are_dropped_whatever_the_other_values_say_of_equality() -> None:
    """An explicit null for a defaulted field means absent even beside a value that refuses `==`."""
    for door in (contract.MemoryEvent.model_validate, from_dict):
        event = door(_asserted(value=_NoEquality(), kind=None, reason=None, observed_at="2026-01-02T03:04:05Z"))
        assert event.kind is Kind.STATE and isinstance(event.value, _NoEquality)


def test_records_held_by_a_batch_cost_no_page_fault_each() -> None:
    """A producer holds a batch's records until its acks: each record is a copy of its own size, not orjson's 1 KiB
    working buffer shrunk in place, which left the heap such that every record held cost page faults."""
    import resource

    events = [
        _asserted(
            event_id=f"e{i}", subject=f"user:{i}", content=f"用户 {i} 的座位偏好是过道 {i}", aliases=["座位", "seat"]
        )
        for i in range(4000)
    ]
    for _ in range(2):  # the first pass may grow the heap for good: judged on the second
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [contract.from_dict_encoded(e)[2] for e in events] + [encode(from_dict(e)) for e in events]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del held
    assert faults / (2 * len(events)) < 0.25, faults


def test_a_record_past_the_parsers_depth_names_the_fields_its_parsed_form_would() -> None:
    """The class: the token reader that names a record nested past the parser (contract.claimed_fields) reads its
    top-level text fields as the parser reads them, a name given twice included (the last counts), so a refused
    record's tenant never depends on how deep it is nested."""
    from producers.contract import _top_level_text, claimed_fields

    values = ['"acme"', '"globex"', "7", "null", "[1]", '{"tenant": "x"}', '"a\\"b"', '"\\u00e9"']
    records = [
        "{" + ", ".join(f'"{name}": {v}' for name, v in pairs) + "}"
        for a, b, c in itertools.product(values, repeat=3)
        for pairs in ((("tenant", a), ("event_id", b), ("tenant", c)), (("tenant", a), ("tenant", b), ("x", c)))
    ]
    for raw in records:
        parsed = {k: v for k, v in json.loads(raw).items() if isinstance(v, str)}
        assert _top_level_text(raw.encode()) == parsed, raw
    deep = "[" * 5000 + "1" + "]" * 5000
    raw = f'{{"tenant": "globex", "event_id": "e", "value": {deep}, "tenant": "acme"}}'.encode()
    assert claimed_fields(raw) == {"tenant": "acme", "event_id": "e"}
