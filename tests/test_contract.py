"""The event contract (producers/contract.py) as pure functions: no server needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    raw = orjson.dumps(_asserted())
    assert decode(raw, default_observed_at=ts).observed_at == ts
    assert decode(raw, default_observed_at=ts).valid_from == ts
    given = orjson.dumps(_asserted(observed_at="2026-01-01T00:00:00Z"))
    assert decode(given, default_observed_at=ts).observed_at == datetime(2026, 1, 1, tzinfo=UTC)


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
        (b"", "bad_json"),
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
