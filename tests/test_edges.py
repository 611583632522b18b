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

import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import orjson
import psycopg
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
    if kind == "subject.erased":  # an erasure carries nothing about its subject (contract: never sealed)
        full = {k: v for k, v in full.items() if k not in ("key", "content", "value")}
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


def test_a_body_sent_with_a_content_encoding_is_refused_naming_the_header(client: TestClient) -> None:
    """The body was read as it came: a gzip body was "not UTF-8 text" (the client looked in the wrong place), and an
    uncompressed one under `Content-Encoding: gzip` was taken. Every body route refuses the header, 415."""
    import gzip

    bodies = [
        (m, p) for m, p, op in _operations(client) if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    assert len(bodies) >= 5, bodies
    plain = orjson.dumps({"tenant": TENANT})
    for method, path in bodies:
        for coding, body in (("gzip", gzip.compress(plain)), ("gzip", plain), ("br", plain), ("deflate, gzip", plain)):
            headers = {**KEY, "Content-Type": "application/json", "Content-Encoding": coding}
            item = _only_item(client.request(method, path, content=body, headers=headers), 415)
            assert (item["code"], item["field"]) == ("unsupported_media_type", "Content-Encoding"), (path, item)
    identity = {**KEY, "Content-Type": "application/json", "Content-Encoding": "identity"}
    ok = client.request("POST", "/v1/recall", content=orjson.dumps({"tenant": TENANT, "query": "x"}), headers=identity)
    assert ok.status_code != 415, ok.text


def test_a_refused_key_is_blamed_on_the_header_it_came_in(client: TestClient) -> None:
    guarded = [(m, p) for m, p, op in _operations(client) if op.get("security")]
    assert len(guarded) >= 10, guarded
    for method, path in guarded:
        for headers, field in (
            ({"X-API-Key": "wrong"}, "X-API-Key"),
            ({"Authorization": "Bearer wrong"}, "Authorization"),
            ({"Authorization": "Basic eDp5"}, "Authorization"),
            ({}, "X-API-Key"),
            # two keys, one of them good: which one was meant is not guessed
            ({"X-API-Key": "k-edges", "Authorization": "Bearer wrong"}, "Authorization"),
            ({"X-API-Key": "wrong", "Authorization": "Bearer k-edges"}, "Authorization"),
            ({"X-API-Key": "k-edges", "Authorization": "Basic eDp5"}, "Authorization"),
            ([("X-API-Key", "k-edges"), ("X-API-Key", "wrong")], "X-API-Key"),
            ([("Authorization", "Bearer k-edges"), ("Authorization", "Bearer wrong")], "Authorization"),
        ):
            item = _only_item(client.request(method, path, headers=headers), 401)
            assert (item["code"], item["field"]) == ("unauthorized", field), (method, path, headers, item)
    both = {"X-API-Key": "k-edges", "Authorization": "Bearer k-edges"}  # one key, said twice alike
    assert client.get("/v1/tenants", headers=both).status_code == 200


def test_context_answers_as_accept_prefers_unless_the_body_says_format(client: TestClient) -> None:
    body = {"tenant": TENANT, "subject": "user:nobody", "as_of": "2026-01-01T00:00:00Z"}
    cases = [
        ({}, body, "text/plain"),
        ({"Accept": "*/*"}, body, "text/plain"),
        ({"Accept": "application/json"}, body, "application/json"),
        ({"Accept": "text/plain;q=0.5, application/json"}, body, "application/json"),
        ({"Accept": "application/json;q=0.2, text/*"}, body, "text/plain"),
        ({"Accept": "application/json;q=abc, text/plain;q=0"}, body, "application/json"),  # a bad q: as if absent
        ({"Accept": "application/json;q=nan, text/plain;q=0.5"}, body, "application/json"),
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


def test_the_mcp_server_refuses_two_keys_as_the_api_does(mcp_url: str) -> None:
    """Two keys in one request, one of them good: a 401 naming the header, as the HTTP API answers (the SDK's own
    middleware would take the first Authorization); one key said twice alike is one key."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = ("Accept", "application/json, text/event-stream")
    for headers, field in (
        ([("Authorization", "Bearer k-edges"), ("Authorization", "Bearer wrong")], "Authorization"),
        ([("Authorization", "Bearer wrong"), ("Authorization", "Bearer k-edges")], "Authorization"),
        ([("Authorization", "Bearer k-edges"), ("X-API-Key", "other")], "Authorization"),
        ([("Authorization", "Bearer k-edges"), ("X-API-Key", "k-edges"), ("X-API-Key", "k-edges")], "X-API-Key"),
    ):
        resp = httpx.post(mcp_url, json=ping, headers=[*headers, accept], timeout=10)
        item = _only_item(resp, 401)
        assert (item["code"], item["field"]) == ("unauthorized", field), (headers, item)
    both = [("Authorization", "Bearer k-edges"), ("X-API-Key", "k-edges"), accept]
    assert httpx.post(mcp_url, json=ping, headers=both, timeout=30).status_code == 200


def test_the_mcp_server_refuses_a_missing_or_unknown_bearer_in_the_one_shape(mcp_url: str) -> None:
    for headers in ({}, {"Authorization": f"Bearer {uuid.uuid4().hex}"}, {"X-API-Key": "k-edges"}):
        for method in ("GET", "POST"):
            resp = httpx.request(method, mcp_url, headers=headers, json={}, timeout=10)
            item = _only_item(resp, 401)
            assert (item["code"], item["field"]) == ("unauthorized", "Authorization"), (headers, item)
            assert resp.headers["www-authenticate"].startswith("Bearer")


# -- what no door may take in, whatever its route -------------------------------------------------------------


def test_an_erasure_carrying_what_its_subject_said_is_refused_and_nothing_is_published(client: TestClient) -> None:
    """An erasure is never sealed: content or a value on it would stay in the ledger in clear text for good."""
    subject = f"user:{uuid.uuid4().hex[:8]}"
    for extra, field in (({"content": "ann@example.com"}, "content"), ({"value": "ann"}, "value")):
        event = {"type": "subject.erased", "tenant": TENANT, "subject": subject, "reason": "gdpr", **extra}
        item = _only_item(client.post("/v1/events", json={"events": [event]}, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("invalid_value", f"events.0.{field}"), item
        assert "never sealed" in item["message"]
    events = client.get(f"/v1/subjects/{subject}/events", params={"tenant": TENANT}, headers=KEY)
    assert events.status_code == 200 and events.json()["events"] == [], events.text


def test_a_percent_escape_that_is_not_utf8_is_refused_naming_the_parameter(client: TestClient) -> None:
    """Read as U+FFFD it would be stored or looked up as other text: every path and query parameter refuses it."""
    with_params = [(m, p, op) for m, p, op in _operations(client) if op.get("parameters")]
    assert len(with_params) >= 10, with_params
    checked = 0
    for method, path, op in with_params:
        spec_path = next(p for p, item in client.get("/openapi.json").json()["paths"].items() if op in item.values())
        for param in op["parameters"]:
            name = param["name"]
            for bad in ("%ED%A0%80", "%FF", "ok%C3"):
                if param["in"] == "path":
                    url = spec_path
                    for other in op["parameters"]:
                        if other["in"] == "path":
                            value = f"x{bad}" if other["name"] == name else "x"
                            url = url.replace("{" + other["name"] + "}", value)
                elif param["in"] == "query":
                    url = f"{path}?{name}=x{bad}"
                else:
                    continue
                item = _only_item(client.request(method, url, headers=KEY), 422)
                assert (item["code"], item["field"]) == ("unstorable_text", name), (method, url, item)
                checked += 1
    assert checked >= 30, checked
    # a subject holding `/` or `%2F` is one parameter still
    for path in ("/v1/subjects/a/b%FF/facts", "/v1/subjects/a%2Fb%FF/events", "/v1/subjects/%FF/c/events"):
        item = _only_item(client.get(path, params={"tenant": TENANT}, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("unstorable_text", "subject"), (path, item)
    # a parameter's name that is not UTF-8, and U+FFFD itself sent as UTF-8 (a character like any other)
    item = _only_item(client.get("/v1/subjects?tenant=edges&%FF=1", headers=KEY), 422)
    assert (item["code"], item["field"]) == ("unstorable_text", "query")
    assert client.get("/v1/subjects/x%EF%BF%BD/facts", params={"tenant": TENANT}, headers=KEY).status_code == 200


def _answered_for(resp: httpx.Response, name: str) -> str:
    """The value of path parameter `name` an answer says it read: the field it echoes, or its 404's message."""
    body = resp.json()
    if resp.status_code == 404:
        (item,) = body["detail"]
        assert item["field"] == name, item
        return item["message"]
    return body[name]


def test_a_line_feed_in_a_text_path_parameter_is_read_exactly(client: TestClient) -> None:
    """A subject, an event id, a fact or erasure id may hold a line feed, so every route reads one exactly: a route's
    pattern once stopped at an inner one and dropped a trailing one (`DELETE /v1/subjects/x%0A` erased `x`)."""
    with_text = [
        (m, op, p["name"])
        for m, _, op in _operations(client)
        for p in op.get("parameters", [])
        if p["in"] == "path" and p["schema"].get("type") == "string"
    ]
    assert len(with_text) >= 6, with_text
    spec = client.get("/openapi.json").json()["paths"]
    checked = 0
    for method, op, name in with_text:
        template = next(p for p, item in spec.items() if op in item.values())
        for sent, meant in (("x%0A", "x\n"), ("x%0Ay", "x\ny"), ("a/b%0A", "a/b\n"), ("x%0D%0A", "x\r\n")):
            if "/" in sent and name == "memory_id":
                continue  # one segment: a fact id holds no `/`
            url = template.replace("{" + name + "}", sent)
            resp = client.request(method, url, params={"tenant": TENANT}, headers=KEY)
            assert resp.status_code in (200, 202, 404), (method, url, resp.status_code, resp.text[:300])
            answered = _answered_for(resp, name)
            assert answered == meant or repr(meant) in answered, (method, url, answered)
            checked += 1
    assert checked >= 20, checked


def _routes(routes: Any) -> Iterator[Any]:
    """Every route of an app, those of included routers and mounts too."""
    for route in routes:
        if hasattr(route, "param_convertors"):
            yield route
        inner = getattr(getattr(route, "original_router", None) or getattr(route, "app", None), "routes", None)
        if inner is not None and inner is not routes:
            yield from _routes(inner)


def test_no_api_route_takes_a_parameter_that_stops_at_a_line_feed(client: TestClient) -> None:
    """Starlette's `path` convertor (`.*`) stops at a line feed and its pattern's `$` matches before a trailing one:
    a route taking one would read `x%0A` as `x`, which the guard (trusting the route to read it exactly) passes on.
    Every API route's text parameter is `text` (any character) or one segment (`[^/]+`, which holds a line feed)."""
    found = {
        (route.path, name): type(convertor).__name__
        for route in _routes(client.app.routes)
        for name, convertor in route.param_convertors.items()
        if "/static" not in route.path  # the console's and the docs' files: no API route, so a line feed is refused
    }
    assert len(found) >= 7, found
    assert {k: v for k, v in found.items() if v not in ("TextConvertor", "StringConvertor")} == {}


def test_a_line_feed_a_route_does_not_read_is_refused(client: TestClient) -> None:
    """After a route's last literal a line feed would be dropped by its pattern (`.../facts%0A` read as `.../facts`),
    and in a number it would be read past (`1%0A` as 1): both are 422 before the key is asked, naming the path or the
    parameter. A subject of a line feed alone is blank, as the contract says."""
    for method, path in (
        ("GET", "/v1/subjects/x/facts%0A"),
        ("GET", "/v1/subjects/x/events%0A"),
        ("GET", "/v1/facts/x/history%0A"),
        ("GET", "/v1/subjects%0A"),
        ("GET", "/console%0A"),
    ):
        for headers in (KEY, {}):
            item = _only_item(client.request(method, path, params={"tenant": TENANT}, headers=headers), 422)
            assert (item["code"], item["field"]) == ("invalid_value", "path"), (method, path, item)
    for path, name in (("/v1/dead-letters/1%0A/2", "partition"), ("/v1/dead-letters/1/2%0A", "offset")):
        item = _only_item(client.get(path, params={"tenant": TENANT}, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("invalid_value", name), (path, item)
    item = _only_item(client.get("/v1/subjects/%0A/facts", params={"tenant": TENANT}, headers=KEY), 422)
    assert (item["field"], item["message"]) == ("subject", "must not be blank"), item
    # a carriage return alone is a character like any other, matched exactly
    assert client.get("/v1/subjects/x%0D/facts", params={"tenant": TENANT}, headers=KEY).json()["subject"] == "x\r"


def test_a_body_over_the_limit_is_413_before_the_key_is_checked(edge_settings: Settings) -> None:
    limit = 4096
    with TestClient(create_app(edge_settings.model_copy(update={"api_max_body_bytes": limit}))) as small:
        bodies = [(m, p) for m, p, op in _operations(small) if op.get("requestBody")]
        assert len(bodies) >= 5, bodies
        big = orjson.dumps({"tenant": TENANT, "pad": "x" * limit})

        def chunked():  # no Content-Length: counted as it arrives
            yield big[:1000]
            yield big[1000:]

        for method, path in bodies:
            for headers in ({}, KEY):  # no key, or a good one: the size is judged first
                for content in (big, chunked()):
                    sent = {**headers, "Content-Type": "application/json"}
                    item = _only_item(small.request(method, path, content=content, headers=sent), 413)
                    assert (item["code"], item["field"]) == ("too_large", "body"), (method, path, item)
                    assert f"{limit:,} bytes" in item["message"]
        # at the limit it is read as before: refused for its key, or answered
        fits = orjson.dumps({"tenant": TENANT, "query": "q" * 100})
        assert small.post("/v1/recall", content=fits, headers={"Content-Type": "application/json"}).status_code == 401
        ok = small.post("/v1/recall", content=fits, headers={**KEY, "Content-Type": "application/json"})
        assert ok.status_code == 200, ok.text


def test_recall_filters_past_their_bounds_are_422_naming_the_filter(client: TestClient) -> None:
    """Past Elasticsearch's own limits a search fails: the door refuses first, naming the filter."""
    from api.requests import MAX_FILTER_CHARS, MAX_FILTER_VALUES

    for name in ("key", "scope", "tags"):
        for values in (
            [f"v{i}" for i in range(MAX_FILTER_VALUES + 1)],
            ["a" * (MAX_FILTER_CHARS + 1)],
            "a" * 40_000,
        ):
            body = {"tenant": TENANT, "query": "anything", "filters": {name: values}}
            item = _only_item(client.post("/v1/recall", json=body, headers=KEY), 422)
            assert (item["code"], item["field"]) == ("invalid_value", f"filters.{name}"), (name, item)
        at_bound = [f"v{i}".ljust(MAX_FILTER_CHARS, "x") for i in range(MAX_FILTER_VALUES)]
        body = {"tenant": TENANT, "query": "anything", "filters": {name: at_bound}}
        assert client.post("/v1/recall", json=body, headers=KEY).status_code == 200


def test_a_token_past_the_end_of_the_log_is_422_not_a_retry(client: TestClient) -> None:
    """No write answered it, so `not_yet` ("retry the same read") would have a client retry for ever."""
    from producers.consistency import encode_token

    for positions in ({99: 1}, {0: 2**62}):
        after = encode_token(positions)
        for url in (f"/v1/subjects/x/facts?tenant={TENANT}&after={after}",):
            item = _only_item(client.get(url, headers=KEY), 422)
            assert (item["code"], item["field"]) == ("invalid_value", "after"), (positions, item)
            assert "past the end of the ledger topic" in item["message"]
        body = {"tenant": TENANT, "query": "anything", "after": after}
        item = _only_item(client.post("/v1/recall", json=body, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("invalid_value", "after"), (positions, item)


def test_numbers_and_booleans_sent_as_text_are_wrong_type(client: TestClient) -> None:
    event = {"type": "memory.asserted", "tenant": TENANT, "subject": "user:1", "key": "k", "content": "c"}
    for over, field in (
        ({"confidence": "0.5"}, "confidence"),
        ({"importance": "0.3"}, "importance"),
        ({"importance": True}, "importance"),
    ):
        item = _only_item(client.post("/v1/events", json={"events": [{**event, **over}]}, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("wrong_type", f"events.0.{field}"), (over, item)
    recall = {"tenant": TENANT, "query": "anything"}
    for over, field in (({"top_k": "5"}, "top_k"), ({"top_k": True}, "top_k"), ({"explain": "yes"}, "explain")):
        item = _only_item(client.post("/v1/recall", json={**recall, **over}, headers=KEY), 422)
        assert (item["code"], item["field"]) == ("wrong_type", field), (over, item)
    context = {"tenant": TENANT, "subject": "user:1"}
    item = _only_item(client.post("/v1/context", json={**context, "budget_tokens": "500"}, headers=KEY), 422)
    assert (item["code"], item["field"]) == ("wrong_type", "budget_tokens"), item


def test_a_blank_subject_is_refused_on_every_subject_route_as_on_a_write(client: TestClient) -> None:
    subject_routes = [(m, p, op) for m, p, op in _operations(client) if "/subjects/x" in p]
    assert len(subject_routes) >= 3, subject_routes
    for method, path, _op in subject_routes:
        for blank in ("%20", "%20%20", "%09"):
            resp = client.request(method, path.replace("/subjects/x", f"/subjects/{blank}"), params={"tenant": TENANT},
                                  headers=KEY)  # fmt: skip
            item = _only_item(resp, 422)
            assert (item["code"], item["field"]) == ("invalid_value", "subject"), (method, path, item)


NAMES = {"subject", "subjects", "memory_id", "event_id", "key", "target_version", "erasure_id"}


def test_a_blank_name_is_refused_by_every_request_model_and_at_every_door(client: TestClient) -> None:
    """The class: a subject, id or key made of white space names nothing a write could store, so a read or an
    erasure of it can only find nothing. Every request model's field of such a name refuses it (recall's
    `subject`, the MCP facts, context and forget, the key routes, a discard's reason were the ones that took it);
    through HTTP each is a 422 `invalid_value` naming the field."""
    import inspect

    from pydantic import BaseModel, TypeAdapter, ValidationError

    from api import dead_letters, requests
    from api.routes import keys

    checked = []
    for module in (requests, dead_letters, keys):
        for model in vars(module).values():
            if not (inspect.isclass(model) and issubclass(model, BaseModel) and model.__module__ == module.__name__):
                continue
            if model is requests.Filters:  # values to match, not names: a blank one matches nothing
                continue
            for name, field in model.model_fields.items():
                if name not in NAMES and not (model is dead_letters.DiscardParams and name == "reason"):
                    continue
                adapter = TypeAdapter(
                    Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
                )
                for blank in (" ", "\u3000", "\t\n"):
                    with pytest.raises(ValidationError):
                        adapter.validate_python([blank] if name == "subjects" else blank)
                checked.append(f"{model.__name__}.{name}")
    assert len(checked) >= 12, checked
    blank = "\u3000 "
    asks = [
        ("POST", "/v1/recall", {"json": {"tenant": TENANT, "query": "x", "subject": blank}}, "subject"),
        ("POST", "/v1/context", {"json": {"tenant": TENANT, "subject": blank}}, "subject"),
        ("GET", "/v1/events/%20", {"params": {"tenant": TENANT}}, "event_id"),
        ("GET", "/v1/facts/%20/history", {"params": {"tenant": TENANT}}, "memory_id"),
        ("GET", "/v1/erasures", {"params": {"tenant": TENANT, "subject": blank}}, "subject"),
        ("POST", "/v1/dead-letters/discard", {"json": {"tenant": TENANT, "partition": 0, "offset": 0, "reason": blank}},
         "reason"),
    ]  # fmt: skip
    for method, path, kwargs, field in asks:
        item = _only_item(client.request(method, path, headers=KEY, **kwargs), 422)
        assert (item["code"], item["field"]) == ("invalid_value", field), (path, item)


def test_mcp_forget_erases_only_on_a_true_flag_and_keeps_the_callers_id(mcp_url: str) -> None:
    """The destructive flag is a JSON boolean ("yes" or 1 erase nothing), and an erasure under the caller's id is
    that id's event: a retry is a duplicate, and its status answers under it."""
    from tests.support.servers import call_tool

    subject, event_id = f"user:{uuid.uuid4().hex[:8]}", f"erase-{uuid.uuid4().hex[:8]}"
    for flag in ("yes", 1, "on", "true"):
        args = {"tenant": TENANT, "subject": subject, "erase_subject": flag}
        failed, body = call_tool(mcp_url, "k-edges", "forget", args)
        assert failed and body["detail"][0]["code"] == "wrong_type", (flag, body)
        assert body["detail"][0]["field"] == "erase_subject", body
    args = {"tenant": TENANT, "subject": subject, "erase_subject": True, "event_id": event_id}
    failed, first = call_tool(mcp_url, "k-edges", "forget", args)
    assert not failed and first["action"] == "erase" and first["event_id"] == event_id, first
    failed, again = call_tool(mcp_url, "k-edges", "forget", args)
    assert not failed and again["event_id"] == event_id, again
    failed, status = call_tool(mcp_url, "k-edges", "event_status", {"tenant": TENANT, "event_id": event_id})
    assert not failed and status["status"] in ("pending", "applied"), status


def test_after_the_server_ends_the_pools_connections_one_request_fails_not_one_per_connection(
    client: TestClient, edge_settings: Settings
) -> None:
    """A PostgreSQL restart ends every connection the API's pool holds idle. The first request to meet one is a 503
    (the server is not asked first on every checkout: that would cost every read a round trip), and it has the
    pool check the others, so the requests after it are answered, not failed one per stale connection."""
    resources = client.app.state.resources

    async def idle_backends() -> list[int]:
        held = [await resources.pool.getconn() for _ in range(3)]
        pids = [conn.info.backend_pid for conn in held]
        for conn in held:
            await resources.pool.putconn(conn)
        return pids

    read = f"/v1/subjects/x/facts?tenant={TENANT}"
    assert client.get(read, headers=KEY).status_code == 200
    pids = client.portal.call(idle_backends)
    with psycopg.connect(edge_settings.pg_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) AS p", (pids,))
    first = client.get(read, headers=KEY)
    assert first.status_code == 503 and first.json()["detail"][0]["message"].startswith("postgres: "), first.text
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the check it started, done (none started: the wait runs out)
        check = getattr(resources, "pool_check", None)
        if check is not None and check.done():
            break
        time.sleep(0.05)
    answered = [client.get(read, headers=KEY).status_code for _ in range(5)]
    assert answered == [200] * 5, answered
