"""The event contract as a JSON Schema (producers.event_schema): checked in, current, served, and as strict as it says.

- the checked-in file is exactly what `ledger schema --write` generates from the model (drift fails here);
- it is a valid draft 2020-12 schema with its $id and title, every field described, the contract's limits named;
- every valid event the test factories build validates against it (the class test: no valid event refused);
- the malformed corpus (tests/malformed.py): the door refuses every record; which of them the schema refuses too
  is pinned below (docs/other-languages.md states the same split), so a change in either shows here;
- GET /v1/schema/event serves the file byte for byte, without an API key.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from producers import contract
from producers.contract import InvalidEvent, MemoryEvent, decode, from_dict
from producers.event_schema import SCHEMA_FILE, SCHEMA_ID, checked_in, event_schema, render
from producers.settings import REPO_ROOT, Settings
from tests.malformed import _valid, malformed_corpus
from tests.support import T0, asserted, at, erased, facts, marked, wire

pytestmark = pytest.mark.unit

SCHEMA = json.loads(checked_in())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(doc: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.path)) or '(event)'}: {e.message[:120]}" for e in VALIDATOR.iter_errors(doc)]


def test_the_checked_in_file_is_what_the_model_generates() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render(), (
        f"{SCHEMA_FILE} drifted from producers.contract.MemoryEvent: run `ledger schema --write` and commit it"
    )
    check = subprocess.run(
        [sys.executable, "-m", "infra.cli", "schema", "--check"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_generator_fails_when_a_field_is_not_described(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contract field without a note here (a new field) fails the generation, so the file cannot go stale quietly."""
    generated = MemoryEvent.model_json_schema()
    with_new_field = {**generated, "properties": {**generated["properties"], "mood": {"type": "string"}}}
    monkeypatch.setattr(MemoryEvent, "model_json_schema", classmethod(lambda cls, *a, **k: with_new_field))
    with pytest.raises(RuntimeError, match="mood"):
        event_schema()


def test_it_is_a_draft_2020_12_schema_with_id_title_and_every_field_described() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"] == SCHEMA_ID and SCHEMA["title"].startswith("memory-ledger event")
    assert set(SCHEMA["properties"]) == set(MemoryEvent.model_fields)
    assert all(node.get("description") for node in SCHEMA["properties"].values())
    text = SCHEMA["description"]
    for limit in (contract.MAX_EVENT_BYTES, contract.MAX_VALUE_DEPTH, "U+0000", "lone surrogate", "RFC 3339", "300 s"):
        assert str(limit) in text, limit
    assert str(contract.INT_MAX) in SCHEMA["properties"]["value"]["description"]
    assert SCHEMA["properties"]["observed_at"]["anyOf"][0]["pattern"] == contract._RFC3339.pattern
    for example in SCHEMA["examples"]:
        assert not schema_errors(example) and from_dict(example).type == "memory.asserted"


# an explicit null the contract reads as "not given" (schema_version is not one: contract.upcast refuses it)
# on the ledger event_id is required (contract.decode: a minted id would differ on every replay); the model and the
# HTTP door still mint one for a body without it
NULL_IS_NOT_GIVEN = ("scope", "kind", "entities", "aliases", "tags", "source", "importance", "observed_at")
NULL_IS_NOT_GIVEN += ("schema_version",)


def _factory_events() -> list[tuple[str, dict[str, Any]]]:
    """Every valid event the tests build, as it goes on the wire (to_wire) or as an HTTP client posts it."""
    built: list[tuple[str, MemoryEvent]] = [
        ("asserted", asserted("user:1", "pref.seat", "window", 2)),
        (
            "asserted, all fields",
            asserted(
                "project:P1",
                "project.port",
                {"port": 8080, "tls": [True, None, 1.5]},
                1,
                scope="prod",
                kind="preference",
                valid_to=at(9),
                entities=["P1"],
                aliases=["backend port", "后端服务地址"],
                tags=["infra"],
                source={"type": "inferred", "service": "chat", "ref": "m-1", "actor": "bot"},
                confidence=0.7,
                importance=0.9,
                reason="deploy",
                event_id="e-all-fields",
            ),
        ),  # fmt: skip
        ("asserted, episodic", asserted("user:1", None, None, 0, kind="episodic", content="met at the booth")),
        ("asserted, explicit", asserted("user:1", "name", "Ada", 0, source={"type": "explicit"})),
        *[(f"facts {e.key}", e) for e in facts("user:2", {"a": 1, "b": "two", "c": [3]}, 1)],
        ("retracted", marked("memory.retracted", "user:1", "pref.seat", 3, reason="wrong")),
        ("retracted, one version", marked("memory.retracted", "user:1", "pref.seat", 3, target_version="v" * 32)),
        ("confirmed", marked("memory.confirmed", "user:1", "pref.seat", 4)),
        ("erased", erased("user:1", reason="gdpr")),
    ]
    posted: list[tuple[str, dict[str, Any]]] = [
        ("wire", wire(event_id="e-wire")),
        ("wire, explicit nulls for defaults", wire(event_id="e-nulls", **dict.fromkeys(NULL_IS_NOT_GIVEN))),
        (
            "wire, offset time",
            wire(event_id="e-offset", observed_at="2026-03-01T09:00:00.123456+08:00", valid_to="2030-01-01T00:00:00z"),
        ),
        ("malformed.py's valid record", _valid(random.Random(1), "acme", "user:9")),
    ]
    return [(label, e.to_wire()) for label, e in built] + posted


@pytest.mark.parametrize(("label", "event"), _factory_events(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_valid_event_of_the_factories_validates_against_the_schema(label: str, event: dict[str, Any]) -> None:
    from_dict(event, now=at(1000))  # the contract accepts it (a factory that builds invalid events fails here)
    assert not schema_errors(event), (label, schema_errors(event))


def test_null_is_allowed_by_the_schema_where_the_contract_allows_it_and_refused_where_it_is_refused() -> None:
    example = SCHEMA["examples"][0]
    door_takes_null = set()
    for name in MemoryEvent.model_fields:
        event = {**example, name: None}
        try:
            decode(json.dumps(event).encode())  # as the worker reads a record
            door_takes_null.add(name)
        except InvalidEvent:
            if name not in ("key", "content"):  # null for these is refused by a rule between fields only
                assert schema_errors(event), f"the schema takes {name}: null, the contract refuses it"
            continue
        assert not schema_errors(event), (name, schema_errors(event))
    # a ledger record must carry its own event_id (a minted one would differ on every replay)
    assert set(NULL_IS_NOT_GIVEN) <= door_takes_null and "event_id" not in door_takes_null


# What the schema refuses of the malformed corpus, by the corpus' reason code and what was changed. Everything else
# only the door (the contract, at POST /v1/events and in the worker) refuses. docs/other-languages.md has this table.
SCHEMA_REFUSES = {
    "not_an_object: [1, 2, 3]",
    'not_an_object: "just a string"',
    "not_an_object: null",
    "unknown_type: type='memory.exploded'",
    "missing_field: -type",
    "missing_field: -tenant",
    "wrong_type: tenant=<int>",
    "wrong_type: subject=['a', 'list']",
    "wrong_type: entities='not-a-list'",
    "wrong_type: confidence='high'",
    "invalid_time: observed_at='yesterday'",
    "invalid_time: observed_at='2026-01-02T03:04:05'",  # no offset (the contract's pattern)
    "invalid_time: observed_at='2026-01-02T03:04Z'",  # no seconds
    "invalid_time: observed_at='2026-01-02T03:04:05.1234567Z'",  # 7 fractional digits
    "invalid_value: tenant=''",
    "unknown_value: kind='mood'",
    "invalid_value: confidence=1.5",
    "unsupported_schema: schema_version=<int>",
    "unknown_field: surprise_field=True",
    "invalid_value: content='xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...",  # over 16000 characters
    # refused by the schema for something else the record has: the extra field "x" beside value 1e999, NaN or an
    # integer past 64 bits (its value the corpus drew at random: `value` unchanged), and the missing tenant and
    # subject of the oversized record (the schema cannot measure the encoded size)
    "number_out_of_range: value=inf x=<int>",
    "number_out_of_range: value=nan x=<int>",
    "number_out_of_range: x=<int>",
    "too_large: -event_id -key -observed_at -subject -tenant -value content='xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...",
}
DOOR_ONLY = {
    "bad_json: not JSON",  # three records: truncated, text, not UTF-8 (no JSON parser reads them)
    "empty: not JSON",  # zero bytes
    "missing_field: -content",  # memory.asserted needs content (a rule between fields)
    "missing_field: -key",  # ... and a key unless episodic
    "invalid_time: observed_at='2026-13-45T99:00:00Z'",  # digits in the right places (format date-time: see below)
    "invalid_time: valid_to='2020-01-01T00:00:00Z'",  # valid_to before valid_from
    "invalid_value: subject='   '",  # blank
    "invalid_value: content=''",  # blank
    "invalid_value: confidence=0.3 source={'type': 'explicit'}",  # an explicit source carries 1.0
    "unstorable_text: content='nul \\x00 inside'",
    "unstorable_text: subject='user:\\x00'",
    "unstorable_text: value={'a': ['ok', 'nul\\x00']}",
    "unstorable_text: value={'k\\x00': 1}",
    "unstorable_text: entities=['P1', '\\x00']",
    "unstorable_text: content='lone \\ud800 surrogate'",  # an escaped lone surrogate: JSON, not storable text
    "too_deep: value=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[...",  # 40 levels
    "too_deep: nested past the parser",  # 1,100 levels: JSON, which no parser here reads whole
    "invalid_time: observed_at='9999-12-31T23:59:59-01:00'",  # past year 9999 once in UTC
    "invalid_time: observed_at='0001-01-01T00:00:00+01:00'",  # before year 1 once in UTC
    "clock_skew: observed_at='2099-01-01T00:00:00Z'",  # judged against the record's broker timestamp
    "invalid_value: target_version='v1'",  # only a retraction targets a version
    "invalid_value: -key type='subject.erased'",  # an erasure carries no content or value (it is never sealed)
}


def _what(raw: bytes, template: dict[str, Any]) -> str:
    """What a corpus record changed, against the valid record it was made from (ids and int values vary)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return "not JSON"
    except RecursionError:
        return "nested past the parser"
    if not isinstance(doc, dict):
        return raw.decode()
    parts = [f"-{k}" for k in template if k not in doc]
    for k, v in doc.items():
        if k == "value":
            changed = not isinstance(v, int)
        else:
            changed = k != "event_id" and v != template.get(k, ...)
        if changed:
            text = "<int>" if type(v) is int else repr(v)  # an int the corpus drew at random
            parts.append(f"{k}={text[:30] + '...' if len(text) > 30 else text}")
    return " ".join(sorted(parts))


def test_the_malformed_corpus_door_refuses_all_and_the_schema_what_it_says(base_settings: Settings) -> None:
    template = _valid(random.Random(0), "acme", "user:1")
    now = datetime.now(UTC)
    caught: set[str] = set()
    missed: set[str] = set()
    for raw, code in malformed_corpus("acme", "user:1"):
        with pytest.raises(InvalidEvent) as refused:  # the worker's judgement (broker time = now, the default skew)
            decode(raw, default_observed_at=now, max_future_skew=timedelta(seconds=base_settings.max_future_skew_s))
        assert refused.value.code == code
        label = f"{code}: {_what(raw, template)}"
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # no schema validator reads it either
            missed.add(label)
            continue
        (caught if schema_errors(doc) else missed).add(label)
    assert caught == SCHEMA_REFUSES, (sorted(caught - SCHEMA_REFUSES), sorted(SCHEMA_REFUSES - caught))
    assert missed == DOOR_ONLY, (sorted(missed - DOOR_ONLY), sorted(DOOR_ONLY - missed))


def test_get_v1_schema_event_serves_the_file_without_a_key(base_settings: Settings) -> None:
    from api.main import create_app

    client = TestClient(create_app(base_settings.private("schema_route")))  # no lifespan: the route needs no store
    r = client.get("/v1/schema/event")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.content == SCHEMA_FILE.read_bytes()
    assert r.json()["$id"] == SCHEMA_ID
    assert "/v1/schema/event" in client.get("/openapi.json").json()["paths"]


def test_times_the_schema_pattern_accepts_are_the_ones_the_contract_parses() -> None:
    """The time pattern is the contract's; what it lets through that the contract refuses is the year range
    (and impossible dates, which `format: date-time` names for validators that check formats)."""
    for text in ("2026-03-01T00:00:00Z", "2026-03-01t00:00:00.5+05:30", T0.isoformat()):
        assert not schema_errors(wire(event_id="e-t", observed_at=text)) and contract.parse_rfc3339(text)
    for text in ("2026-03-01T00:00Z", "2026-03-01 00:00:00Z", "1700000000", "2026-03-01T00:00:00.1234567Z"):
        assert schema_errors(wire(event_id="e-t", observed_at=text)), text
        with pytest.raises(ValueError):
            contract.parse_rfc3339(text)
