"""The edges a new user meets first, each as a class, against the real servers (create_app in-process; the MCP
server as a child process).

- an explicit null for any defaulted field of the event is the field left out (the fields read from the model);
- a body sent without `Content-Type: application/json` is told so, on every route that takes a JSON body;
- a refused key is blamed on the header it came in (`X-API-Key` or `Authorization`), on every route that needs one;
- `POST /v1/context` answers as `Accept` prefers when the body does not say `format`;
- `GET /` names where to go, and every place it names answers;
- the stateless MCP server answers a GET (or any method but POST) with a prompt 405 in the one error shape,
  never an event stream that stays open, and a missing or unknown bearer with a 401 in the same shape.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from producers.contract import InvalidEvent, MemoryEvent, from_dict
from producers.settings import Settings
from tests.conftest import unique
from tests.support.servers import McpHttpServer
from tests.support.stores import private_ledger

TENANT = "edges"
KEYS = {"k-edges": [TENANT]}
KEY = {"X-API-Key": "k-edges"}


# -- explicit nulls -------------------------------------------------------------------------------------------


def _outcome(data: dict[str, Any], varying: set[str]) -> Any:
    """What the contract makes of `data`: the event (fields minted anew on every call left out, a valid_from
    derived from the clock's observed_at named as such), or the refusal."""
    try:
        event = from_dict(data)
    except InvalidEvent as exc:
        return ("refused", exc.code, exc.field)
    dump = event.model_dump(exclude=varying)
    if event.valid_from == event.observed_at:
        dump["valid_from"] = "observed_at"
    return dump


def _minted_anew(name: str) -> bool:
    """A field whose default is made afresh on every call (an id, the clock): two defaults never compare equal."""
    info = MemoryEvent.model_fields[name]
    return info.default_factory is not None and info.get_default(call_default_factory=True) != info.get_default(
        call_default_factory=True
    )


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["memory.asserted", "memory.retracted", "subject.erased"])
def test_an_explicit_null_for_any_defaulted_field_is_the_field_left_out(kind: str) -> None:
    defaulted = [name for name, info in MemoryEvent.model_fields.items() if not info.is_required()]
    assert {"schema_version", "event_id", "scope", "kind", "observed_at"} <= set(defaulted)  # read from the model
    varying = {name for name in defaulted if _minted_anew(name)}
    full = {"type": kind, "tenant": "acme", "subject": "project:P1", "key": "k", "content": "c", "value": 1}
    wrong = []
    for name in defaulted:
        left_out = {k: v for k, v in full.items() if k != name}
        if _outcome({**left_out, name: None}, varying) != _outcome(left_out, varying):
            wrong.append((name, _outcome({**left_out, name: None}, varying), _outcome(left_out, varying)))
        if name in varying:  # minted in both cases, never refused, never kept null
            assert getattr(from_dict({**left_out, name: None}), name) is not None, name
    assert wrong == []


# -- the HTTP API ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edge_settings(base_settings: Settings) -> Iterator[Settings]:
    with private_ledger(base_settings.private(unique("edges"), api_keys=KEYS)) as settings:
        yield settings


@pytest.fixture(scope="module")
def client(edge_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(edge_settings)) as c:
        yield c


def _operations(client: TestClient) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path with its parameters filled, operation) of every operation of the app's OpenAPI spec."""
    spec = client.get("/openapi.json").json()
    out = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            filled = path
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    filled = filled.replace("{" + param["name"] + "}", "x")
            out.append((method.upper(), filled, op))
    return out


def _only_item(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.request.url, resp.status_code, resp.text[:500])
    detail = resp.json()["detail"]
    assert len(detail) == 1 and set(detail[0]) == {"code", "field", "message"}, detail
    return detail[0]


def test_a_json_body_sent_without_its_content_type_is_told_to_send_application_json(client: TestClient) -> None:
    bodies = [
        (m, p) for m, p, op in _operations(client) if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    assert len(bodies) >= 5, bodies  # events, recall, context, keys, ... : the spec is read, not assumed
    for method, path in bodies:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
            headers = {**KEY, **({"Content-Type": content_type} if content_type else {})}
            resp = client.request(method, path, content=orjson.dumps({"tenant": TENANT}), headers=headers)
            item = _only_item(resp, 422)
            assert (item["code"], item["field"]) == ("wrong_content_type", "body"), (method, path, item)
            assert "Content-Type: application/json" in item["message"], item


def test_a_refused_key_is_blamed_on_the_header_it_came_in(client: TestClient) -> None:
    guarded = [(m, p) for m, p, op in _operations(client) if op.get("security")]
    assert len(guarded) >= 10, guarded
    for method, path in guarded:
        for headers, field in (
            ({"X-API-Key": "wrong"}, "X-API-Key"),
            ({"Authorization": "Bearer wrong"}, "Authorization"),
            ({"Authorization": "Basic eDp5"}, "Authorization"),
            ({}, "X-API-Key"),
        ):
            item = _only_item(client.request(method, path, headers=headers), 401)
            assert (item["code"], item["field"]) == ("unauthorized", field), (method, path, headers, item)


def test_context_answers_as_accept_prefers_unless_the_body_says_format(client: TestClient) -> None:
    body = {"tenant": TENANT, "subject": "user:nobody", "as_of": "2026-01-01T00:00:00Z"}
    cases = [
        ({}, body, "text/plain"),
        ({"Accept": "*/*"}, body, "text/plain"),
        ({"Accept": "application/json"}, body, "application/json"),
        ({"Accept": "text/plain;q=0.5, application/json"}, body, "application/json"),
        ({"Accept": "application/json;q=0.2, text/*"}, body, "text/plain"),
        ({"Accept": "application/json"}, {**body, "format": "text"}, "text/plain"),  # the body wins
        ({"Accept": "text/plain"}, {**body, "format": "json"}, "application/json"),
    ]
    for headers, sent, media in cases:
        resp = client.post("/v1/context", json=sent, headers={**KEY, **headers})
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith(media), (headers, sent, resp.headers["content-type"])
        if media == "application/json":
            assert "text" in resp.json()


def test_the_root_names_where_to_go_and_every_place_it_names_answers(client: TestClient) -> None:
    resp = client.get("/")
    assert resp.status_code == 200, resp.text
    links = resp.json()["links"]
    assert {"docs", "console", "health"} <= set(links), links
    for name, path in links.items():
        assert client.get(path).status_code == 200, (name, path)


# -- the MCP server over Streamable HTTP ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_url(edge_settings: Settings) -> Iterator[str]:
    with McpHttpServer(edge_settings) as server:
        yield server.url
        server.check()


def test_the_stateless_mcp_server_answers_every_method_but_post_with_405_never_a_stream(mcp_url: str) -> None:
    bearer = {"Authorization": "Bearer k-edges"}
    for method in ("GET", "DELETE", "PUT"):
        for accept in ("text/event-stream", "application/json, text/event-stream"):
            # a stream that never ends would run into the read timeout here (httpx.ReadTimeout), not pass
            resp = httpx.request(method, mcp_url, headers={**bearer, "Accept": accept}, timeout=10)
            item = _only_item(resp, 405)
            assert item["code"] == "method_not_allowed" and "POST" in item["message"], item
            assert resp.headers["allow"] == "POST" and resp.headers["content-type"] == "application/json"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {**bearer, "Accept": "application/json, text/event-stream"}
    assert httpx.post(mcp_url, json=ping, headers=headers, timeout=30).status_code == 200  # POST still served


def test_the_mcp_server_refuses_a_missing_or_unknown_bearer_in_the_one_shape(mcp_url: str) -> None:
    for headers in ({}, {"Authorization": f"Bearer {uuid.uuid4().hex}"}, {"X-API-Key": "k-edges"}):
        for method in ("GET", "POST"):
            resp = httpx.request(method, mcp_url, headers=headers, json={}, timeout=10)
            item = _only_item(resp, 401)
            assert (item["code"], item["field"]) == ("unauthorized", "Authorization"), (headers, item)
            assert resp.headers["www-authenticate"].startswith("Bearer")
