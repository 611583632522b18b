"""The OpenAPI spec describes every 2xx body, and the real answers are what it describes.

Against the real stack (a private topic, schema and index: `Settings.private`): facts written through
the PostgreSQL projection and indexed, then every route asked for real through the app
(`create_app` + TestClient, lifespan included). Each answer must validate against the model its
route declares (`response_model=` / `responses=`, read from the app's routes, not repeated here),
carry no field that model does not declare, and spell every time with `producers.contract.rfc3339`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NotRequired

import jsonschema
import orjson
import pytest
from fastapi.testclient import TestClient
from httpx import Response
from pydantic import BaseModel, Field, SecretStr
from typing_extensions import TypedDict, is_typeddict

from api import schemas
from api.main import create_app
from producers.consistency import token_of
from producers.contract import EventType, MemoryEvent, parse_rfc3339, rfc3339
from producers.records import decode_record
from producers.settings import Settings
from producers.topics import ensure_topics
from projections import shapes
from projections.embedding import load_embedder
from tests.conftest import unique
from tests.support import RecorderWriter, cleanup, drain_all, private_store

TENANT, KEY = "schemaco", "k-schema"
H = {"X-API-Key": KEY}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)  # zero microseconds: a time spelled without them shows


def _event(**over: Any) -> dict[str, Any]:
    return {
        "type": "memory.asserted",
        "tenant": TENANT,
        "subject": "user:7",
        "key": "pref.seat",
        "value": "aisle",
        "content": "user 7 prefers aisle seats",
        **over,
    }


# (label, method, path template, request kwargs, expected status); {memory_id} is filled in from the data; kwargs
# may be a function of the answers before (a receipt's checks take a receipt an answer gave)


def _after(place: str, **given: Any) -> Callable[[dict[str, Answer]], dict[str, Any]]:
    """The request with `after` = the token of a write the projection has applied: the subject's first logged event
    (listed by the audit replay asked before)."""

    def made(done: dict[str, Answer]) -> dict[str, Any]:
        first = done["events"].response.json()["events"][0]
        return {place: {**given, "after": token_of([(first["partition"], first["offset"])])}}

    return made


def _receipt_of(label: str, **more: Any) -> Callable[[dict[str, Answer]], dict[str, Any]]:
    return lambda done: {"json": {"tenant": TENANT, "receipt": done[label].response.json()["receipt"], **more}}


REQUESTS: list[tuple[str, str, str, Any, int]] = [
    ("health", "GET", "/v1/health", {}, 200),
    ("event schema", "GET", "/v1/schema/event", {}, 200),
    ("facts", "GET", "/v1/subjects/{subject}/facts", {"params": {"tenant": TENANT}}, 200),
    (
        "facts as_of",
        "GET",
        "/v1/subjects/{subject}/facts",
        {"params": {"tenant": TENANT, "as_of": "2026-01-06T10:00:00+01:00"}},
        200,
    ),
    (
        "facts known_at",
        "GET",
        "/v1/subjects/{subject}/facts",
        {"params": {"tenant": TENANT, "known_at": "2026-01-05T12:00:00Z"}},
        200,
    ),
    ("history", "GET", "/v1/facts/{memory_id}/history", {"params": {"tenant": TENANT}}, 200),
    ("events", "GET", "/v1/subjects/{subject}/events", {"params": {"tenant": TENANT}}, 200),
    ("tenants", "GET", "/v1/tenants", {}, 200),
    ("subject search", "GET", "/v1/subjects", {"params": {"tenant": TENANT, "prefix": "project:", "limit": 1}}, 200),
    ("stats", "GET", "/v1/stats", {"params": {"tenant": TENANT}}, 200),
    ("stats consistency", "GET", "/v1/stats/consistency", {"params": {"tenant": TENANT}}, 200),
    ("recall exact", "POST", "/v1/recall", {"json": {"tenant": TENANT, "query": "P1 backend port"}}, 200),
    (
        "recall time cue",
        "POST",
        "/v1/recall",
        {"json": {"tenant": TENANT, "query": "was order OD5001 refunded yesterday?", "mode": "hybrid"}},
        200,
    ),
    (
        "recall keyword",
        "POST",
        "/v1/recall",
        {"json": {"tenant": TENANT, "query": "backend port 9090", "mode": "keyword", "top_k": 3}},
        200,
    ),
    (
        "recall known_at",
        "POST",
        "/v1/recall",
        {"json": {"tenant": TENANT, "query": "P1 backend port", "known_at": "2026-01-05T12:00:00Z"}},
        200,
    ),
    # read-your-writes: a token every partition has reached (offset 0), so the answer carries `consistency`
    ("facts after", "GET", "/v1/subjects/{subject}/facts", _after("params", tenant=TENANT), 200),
    ("history after", "GET", "/v1/facts/{memory_id}/history", _after("params", tenant=TENANT), 200),
    ("recall after", "POST", "/v1/recall", _after("json", tenant=TENANT, query="P1 port"), 200),
    (
        "context",
        "POST",
        "/v1/context",
        {
            "json": {
                "tenant": TENANT,
                "subject": "project:P1",
                "question": "P1 backend port",
                "format": "json",
                "include_history": True,
            }
        },
        200,
    ),
    ("publish", "POST", "/v1/events", {"json": {"events": [_event()]}}, 200),
    ("publish partly", "POST", "/v1/events", {"json": {"events": [_event(), _event(subject="")]}}, 207),
    ("erase", "DELETE", "/v1/subjects/{subject}", {"params": {"tenant": TENANT, "reason": "schema test"}}, 202),
    ("keys", "POST", "/v1/keys", {"json": {"tenant": TENANT, "subjects": ["user:7", "user:8"]}}, 200),
    (
        "keys retire",
        "POST",
        "/v1/keys/retire",
        {"json": {"tenant": TENANT, "subject": "user:8", "erasure_id": "schema-retire"}},
        200,
    ),
    ("erasures", "GET", "/v1/erasures", {"params": {"tenant": TENANT}}, 200),
    ("erasure", "GET", "/v1/erasures/{erasure_id}", {"params": {"tenant": TENANT}}, 200),
    ("event status", "GET", "/v1/events/{event_id}", {"params": {"tenant": TENANT}}, 200),
    ("dead letters", "GET", "/v1/dead-letters", {"params": {"tenant": TENANT, "limit": 1}}, 200),
    ("dead letter", "GET", "/v1/dead-letters/{partition}/{offset}", {"params": {"tenant": TENANT}}, 200),
    (
        "redrive",
        "POST",
        "/v1/dead-letters/redrive",
        {"json": {"tenant": TENANT, "partition": 0, "offset": 100, "event": _event(subject="user:redriven")}},
        200,
    ),
    (
        "discard",
        "POST",
        "/v1/dead-letters/discard",
        {"json": {"tenant": TENANT, "partition": 0, "offset": 101, "reason": "schema test"}},
        200,
    ),
    ("receipt verify", "POST", "/v1/receipts/verify", _receipt_of("facts"), 200),
    (
        "receipt replay",
        "POST",
        "/v1/receipts/replay",
        _receipt_of("recall exact", request={"query": "P1 backend port"}),
        200,
    ),
]
# the dead letter each request of the workflow is about (the fixture's records at offsets 100 and 101)
LETTER = {"dead letter": (0, 100), "redrive": (0, 100), "discard": (0, 101)}
ERASURE_ID = "schema-erasure/1"  # an event id may hold a slash: the route takes the rest of the path
SUBJECT = {"facts": "project:P1", "events": "project:P1", "erase": "user:gone/with/slashes"}


@dataclass
class Answer:
    label: str
    method: str
    template: str
    response: Response
    expected: int


@pytest.fixture(scope="module")
def world(base_settings: Settings) -> Iterator[dict[str, Any]]:
    kek = SecretStr(base64.b64encode(os.urandom(32)).decode())  # POST /v1/keys answers with a KEK configured
    settings = base_settings.private(unique("schema"), api_keys={KEY: [TENANT]}, kek=kek)
    ensure_topics(settings)
    try:
        with (
            private_store(settings) as (conn, es),
            RecorderWriter(settings, consumer=settings.processor_group) as ledger,
        ):
            port = ledger.assert_fact(
                TENANT,
                "project:P1",
                "project.backend_port",
                "P1 backend port is 8080",
                8080,
                aliases=["backend port"],
                entities=["P1"],
                valid_from=T0,
            )
            ledger.assert_fact(  # the next version: history of two, a superseded event in the audit replay
                TENANT,
                "project:P1",
                "project.backend_port",
                "P1 backend port is 9090",
                9090,
                aliases=["backend port"],
                entities=["P1"],
                valid_from=T0 + timedelta(days=1),
            )
            ledger.assert_fact(TENANT, "user:42", "pref.seat", "user 42 prefers window seats", "window")
            yesterday = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=1)
            ledger.assert_fact(
                TENANT,
                "order:OD5001",
                "order.refund",
                "order OD5001 was refunded, 30 EUR",
                30,
                kind="event",
                entities=["OD5001"],
                valid_from=yesterday,
            )
            ledger.assert_fact(TENANT, "user:erased", "pref.seat", "user erased prefers aisle seats", "aisle")
            ledger.publish(
                MemoryEvent(type=EventType.ERASED, tenant=TENANT, subject="user:erased", event_id=ERASURE_ID)
            )
            for offset in LETTER.values():  # records without content, dead-lettered by the recorder
                raw = orjson.dumps(
                    {k: v for k, v in _event(event_id=f"schema-dl-{offset[1]}").items() if k != "content"}
                )
                ledger.recorder.apply_batch([decode_record(settings.topic, *offset, raw, timestamp_ms=None)])
            drain_all(settings, conn, es, load_embedder(settings))
            with TestClient(create_app(settings)) as client:
                yield {"settings": settings, "client": client, "memory_id": port.memory_id}
    finally:
        cleanup(settings)


@pytest.fixture(scope="module")
def spec(world: dict[str, Any]) -> dict[str, Any]:
    r = world["client"].get("/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def answers(world: dict[str, Any]) -> dict[str, Answer]:
    client: TestClient = world["client"]
    out = {}
    for label, method, template, kwargs, expected in REQUESTS:
        subject = SUBJECT.get(label.split()[0], "")
        partition, offset = LETTER.get(label, (0, 0))
        url = template.format(
            subject=subject,
            memory_id=world["memory_id"],
            erasure_id=ERASURE_ID,
            event_id=ERASURE_ID,
            partition=partition,
            offset=offset,
        )
        if callable(kwargs):
            kwargs = kwargs(out)
        out[label] = Answer(label, method, template, client.request(method, url, headers=H, **kwargs), expected)
    return out


def declared_models(spec: dict[str, Any]) -> dict[tuple[str, str], dict[int, type[BaseModel]]]:
    """(METHOD, path) -> {2xx status: its model}: the component the spec names, as api.schemas defines it."""
    out: dict[tuple[str, str], dict[int, type[BaseModel]]] = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            models = out.setdefault((method.upper(), path), {})
            for status, r in op["responses"].items():
                ref = r.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
                if status.startswith("2") and ref:
                    models[int(status)] = getattr(schemas, ref.rsplit("/", 1)[-1])  # response models live there
    return out


def undeclared(value: Any, path: str = "") -> list[str]:
    """Fields of a validated body that no model declares (a model's extras), anywhere in it."""
    if isinstance(value, BaseModel):
        found = [f"{path}.{k}".lstrip(".") for k in value.model_extra or {}]
        for name in type(value).model_fields:
            found += undeclared(getattr(value, name), f"{path}.{name}")
        return found
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in undeclared(v, f"{path}.{i}")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in undeclared(v, f"{path}.{k}")]
    return []


def times_in(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) of every string in a JSON body that reads as an RFC 3339 time."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from times_in(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from times_in(v, f"{path}.{i}")
    elif isinstance(value, str):
        try:
            parse_rfc3339(value)
        except ValueError:
            return
        yield path.lstrip("."), value


def test_every_operation_documents_a_non_empty_2xx_body(spec: dict[str, Any]) -> None:
    components = spec["components"]["schemas"]
    operations = 0
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            operations += 1
            ok = {status: r for status, r in op["responses"].items() if status.startswith("2")}
            assert ok, (method, path, sorted(op["responses"]))
            for status, r in ok.items():
                schema = r.get("content", {}).get("application/json", {}).get("schema")
                assert schema and "$ref" in schema, (method, path, status, r)
                target = components[schema["$ref"].rsplit("/", 1)[-1]]
                assert target.get("properties"), (method, path, status, target)
    assert operations, "no operation in the spec"


def test_every_route_is_asked_and_answers_as_expected(spec: dict[str, Any], answers: dict[str, Answer]) -> None:
    asked = {(a.method, a.template) for a in answers.values()}
    assert asked == set(declared_models(spec)), "each operation of the spec needs a request in REQUESTS"
    for a in answers.values():
        assert a.response.status_code == a.expected, (a.label, a.response.status_code, a.response.text[:500])
        assert a.response.headers["content-type"] == "application/json", a.label
    for label in ("recall exact", "recall time cue", "recall keyword"):
        assert answers[label].response.json()["hits"], f"{label}: no hit to check the hit model with"
    assert answers["recall time cue"].response.json()["cues"]["time"], "no time cue to check its model with"
    assert answers["publish partly"].response.json()["results"][1]["error"]["field"] == "events.1.subject"


@pytest.mark.parametrize("label", [r[0] for r in REQUESTS])
def test_the_answer_validates_against_its_declared_model(
    spec: dict[str, Any], answers: dict[str, Answer], label: str
) -> None:
    a = answers[label]
    model = declared_models(spec)[(a.method, a.template)][a.response.status_code]
    body = model.model_validate(a.response.json())
    assert undeclared(body) == [], f"{label}: fields {model.__name__} does not declare"


@pytest.mark.parametrize("label", [r[0] for r in REQUESTS])
def test_every_time_in_the_answer_is_spelled_by_rfc3339(answers: dict[str, Answer], label: str) -> None:
    body = answers[label].response.json()
    wrong = {path: text for path, text in times_in(body) if text != rfc3339(parse_rfc3339(text))}
    assert not wrong, f"{label}: times not spelled by producers.contract.rfc3339: {wrong}"
    if label.startswith("facts"):
        assert body["as_of"].endswith("Z") and len(body["as_of"]) == len("2026-01-05T09:00:00.000000Z")


def _strict(schema: Any) -> Any:
    """`schema` with every object that names its properties closed to others (`additionalProperties: false`)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and out.get("additionalProperties") is True:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.mark.parametrize("label", [r[0] for r in REQUESTS])
def test_the_answer_validates_against_the_openapi_document(
    spec: dict[str, Any], answers: dict[str, Answer], label: str
) -> None:
    """What a client reads, not our models: the JSON schema the OpenAPI document declares for the answer's status,
    every object closed to keys it does not name (a key a shape lacks would pass `additionalProperties: true`)."""
    a = answers[label]
    path = next(p for p in spec["paths"] if p.replace(":path", "") == a.template)
    declared = spec["paths"][path][a.method.lower()]["responses"][str(a.response.status_code)]
    schema = declared["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator(_strict({**schema, "components": spec["components"]}))
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"[:300] for e in validator.iter_errors(a.response.json())
    ]
    assert errors == [], f"{label}: {errors[:5]}"


def _response_components(spec: dict[str, Any]) -> set[str]:
    """The components a response (any status) refers to, and those they refer to."""
    refs: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.rsplit("/", 1)[-1]
            if ref.startswith("#/components/schemas/") and name not in refs:
                refs.add(name)
                walk(spec["components"]["schemas"][name])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk([op["responses"] for methods in spec["paths"].values() for op in methods.values()])
    return refs


@pytest.mark.unit
def test_every_documented_body_is_generated_from_the_shape_its_builder_is_typed_with(base_settings: Settings) -> None:
    """A response shape is written once (projections.shapes): each body component of the OpenAPI document is its
    shape's model as api.schemas generates it, never a model written apart (the event schema document excepted:
    its body is a file no code builds)."""
    spec = create_app(base_settings).openapi()
    written_apart = {"EventSchemaDocument"}
    names = _response_components(spec) - written_apart
    assert names, "no response body in the document"
    not_shapes = sorted(n for n in names if not is_typeddict(getattr(shapes, n, None)))
    assert not_shapes == [], f"documented bodies that are no shape of projections.shapes: {not_shapes}"
    for name in sorted(names):
        generated = schemas.model(getattr(shapes, name)).model_json_schema(
            mode="serialization", ref_template="#/components/schemas/{model}"
        )
        generated.pop("$defs", None)
        assert _no_null_default(spec["components"]["schemas"][name]) == _no_null_default(generated), name


def _no_null_default(schema: Any) -> Any:
    """`schema` without `"default": null` (FastAPI leaves it out beside a reference, pydantic writes it)."""
    if isinstance(schema, dict):
        return {k: _no_null_default(v) for k, v in schema.items() if not (k == "default" and v is None)}
    return [_no_null_default(v) for v in schema] if isinstance(schema, list) else schema


class _Part(TypedDict):
    """A part."""

    n: int


class _Whole(TypedDict):
    from_: Annotated[str, Field(description="a key named like a Python name")]
    part: _Part
    parts: NotRequired[list[_Part] | None]
    tags: NotRequired[Annotated[list[str], Field(default=[], description="a default other than None")]]


class _More(_Whole):
    extra: NotRequired[int]


_Keyword = TypedDict("_Keyword", {"from": str, "in": NotRequired[int]})


@pytest.mark.unit
def test_a_shape_s_model_has_its_keys_required_or_optional_its_nested_shapes_models_and_its_parent_s_model() -> None:
    whole, more, keyword = schemas.model(_Whole), schemas.model(_More), schemas.model(_Keyword)
    assert list(whole.model_fields) == ["from_", "part", "parts", "tags"] and whole.__doc__ is None
    assert [name for name, f in whole.model_fields.items() if f.is_required()] == ["from_", "part"]
    assert whole.model_fields["parts"].default is None and whole.model_fields["tags"].default == []
    assert whole.model_fields["from_"].description == "a key named like a Python name"
    assert whole.model_fields["part"].annotation is schemas.model(_Part) and schemas.model(_Part).__doc__ == "A part."
    assert issubclass(more, whole) and list(more.model_fields) == [*whole.model_fields, "extra"]
    assert schemas.model(_Whole) is whole  # one model per shape: the same class wherever a shape is used
    assert list(keyword.model_fields) == ["from_", "in_"]  # keys that are Python keywords: fields with an alias
    k = keyword.model_validate({"from": "a", "in": 1, "unknown": True})
    assert (k.from_, k.in_, k.model_extra) == ("a", 1, {"unknown": True})  # and a shape allows keys it lacks
    assert k.model_dump(by_alias=True, exclude_unset=True) == {"from": "a", "in": 1, "unknown": True}
    assert keyword.model_validate({"from": "a"}).model_dump(by_alias=True, exclude_unset=True) == {"from": "a"}
