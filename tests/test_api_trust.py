"""Bad and hostile input at the API's door, one test per class, against the real servers (create_app + TestClient).

- every error status (401, 403, 404, 405, 422, 500, 503) has the one shape
  `{"detail": [{"code", "field", "message"}]}`, documented in the OpenAPI spec;
- a store that is down (a real client pointed at a dead loopback port) is a prompt 503
  naming it on every route; bad inputs that were 500 or 503 are 4xx naming the field; every field of every
  route's body given what only the standard parser reads (NaN, a lone surrogate, a long integer) is never a 500;
- what the worker would dead-letter (size, depth) is refused by POST /v1/events first;
- nothing is silently changed (non-finite numbers, Unix or sloppy times, future clocks),
  and explicit nulls for defaulted fields mean "absent";
- DELETE takes subjects with `/` exactly as the GET routes read them;
- idempotency by (tenant, event_id) at the door, with the projector applying
  events for real: retries are answered from the store, conflicts refused, other tenants' ids
  never seen, erased events never republished.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from pydantic import SecretStr

from api.errors import ErrorBody, install_error_handlers
from api.main import create_app, install_answer_headers
from api.resources import Resources
from api.writes import JUDGED_IN_A_CHILD
from producers.contract import MAX_EVENT_BYTES, decode
from producers.keys.signing import new_signing_key
from producers.settings import Settings
from tests.conftest import unique
from tests.support import Pipeline, end_offsets, pipeline, read_topic, wait_for, wire, with_value_at
from tests.support.kafka import publish_raw
from tests.support.routes import app_routes
from tests.support.stores import private_ledger

A, B = "tenant-a", "tenant-b"
KEYS = {"key-a": [A], "key-b": [B]}
HA, HB = {"X-API-Key": "key-a"}, {"X-API-Key": "key-b"}
DEAD = "127.0.0.1:1"  # nothing listens there: a real client fails to connect at once
PROMPT_S = 8.0  # pool wait 3 s, broker wait 5 s: a 503 comes well before this


def event(subject: str = "user:1", tenant: str = A, **over: Any) -> dict[str, Any]:
    """One event as a client posts it, of tenant A unless told (`tests.support.wire`)."""
    return wire(subject, tenant=tenant, **over)


def assert_error(resp, status: int, code: str | None = None, field: str | None | type = ...) -> dict[str, Any]:
    """The response is `status` in the one error shape; returns its first item (checked against code, field)."""
    assert resp.status_code == status, f"{resp.status_code} (wanted {status}): {resp.text[:500]}"
    body = resp.json()
    ErrorBody.model_validate(body)  # detail: a non-empty list of {code, field, message}
    assert body["detail"], body
    for item in body["detail"]:
        assert set(item) == {"code", "field", "message"}, item
        assert isinstance(item["code"], str) and item["code"] and item["message"], item
        assert item["field"] is None or isinstance(item["field"], str), item
    first = body["detail"][0]
    if code is not None:
        assert first["code"] == code, body
    if field is not ...:
        assert first["field"] == field, body
    return first


@pytest.fixture(scope="module")
def trust_settings(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Private topic, schema (created, empty) and index; keys bound to one tenant each; a KEK, so that the key
    routes reach their store; a chain key, so that receipts are signed (and a receipt's check reads all of it)."""
    kek = SecretStr(base64.b64encode(os.urandom(32)).decode())
    key_file = tmp_path_factory.mktemp("trust") / "chain-key"
    key_file.write_bytes(new_signing_key())
    key_file.chmod(0o600)
    private = base_settings.private(unique("trust"), api_keys=KEYS, kek=kek, chain_key_file=key_file)
    with private_ledger(private) as settings:
        yield settings


@pytest.fixture(scope="module")
def client(trust_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(trust_settings)) as c:
        yield c


# -- one error shape --------------------------------------------------------------------------


def test_class13_every_error_status_has_the_one_documented_shape(client: TestClient) -> None:
    json_headers = {**HA, "Content-Type": "application/json"}
    cases = [
        (client.get("/v1/stats", params={"tenant": A}), 401, "unauthorized", "X-API-Key"),
        (
            client.get("/v1/stats", params={"tenant": A}, headers={"X-API-Key": "nope"}),
            401,
            "unauthorized",
            "X-API-Key",
        ),
        (
            client.post("/v1/recall", json={}, headers={"Authorization": "Basic eDp5"}),
            401,
            "unauthorized",
            "Authorization",
        ),
        (client.get("/v1/stats", params={"tenant": B}, headers=HA), 403, "forbidden_tenant", "tenant"),
        (client.delete("/v1/subjects/s", params={"tenant": B}, headers=HA), 403, "forbidden_tenant", "tenant"),
        (
            client.post("/v1/events", json={"events": [event(), event(tenant=B)]}, headers=HA),
            403,
            "forbidden_tenant",
            "events.1.tenant",
        ),
        (client.get("/v1/facts/nothing/history", params={"tenant": A}, headers=HA), 404, "not_found", "memory_id"),
        (client.get("/v1/no/such/route"), 404, "not_found", None),
        (client.put("/v1/events", json={}), 405, "method_not_allowed", None),
        (client.get("/v1/stats", headers=HA), 422, "missing_field", "tenant"),
        (client.post("/v1/events", json={"events": []}, headers=HA), 422, "invalid_value", "events"),
        (client.post("/v1/recall", json={"tenant": A, "query": " "}, headers=HA), 422, "invalid_value", "query"),
        (
            client.post("/v1/events", content=b'{"events": [\n  {"a": 1,}]}', headers=json_headers),
            422,
            "bad_json",
            "body",
        ),
        (client.post("/v1/events", content=b"\xff\xfe{", headers=json_headers), 422, "bad_json", "body"),
        (client.post("/v1/events", content=b"[" * 100_000, headers=json_headers), 422, "bad_json", "body"),
    ]
    for resp, status, code, field in cases:
        assert_error(resp, status, code, field)
    bad_json = assert_error(cases[12][0], 422)
    assert "line 2, column 11 (char 23)" in bad_json["message"], bad_json  # its position, not "field": "23"
    assert "not UTF-8 text (byte 0" in assert_error(cases[13][0], 422)["message"]  # where, not an exception's name
    assert "nested deeper" in assert_error(cases[14][0], 422)["message"]
    assert cases[0][0].headers.get("www-authenticate") == "Bearer"
    # a final '/' that another route's path parameter swallows (a 405 from Starlette) says which path to ask
    slashed = client.get("/v1/subjects/s/facts/", params={"tenant": A}, headers=HA)
    assert "ask GET /v1/subjects/s/facts" in assert_error(slashed, 404, "not_found", None)["message"]
    assert "ask" not in assert_error(client.get("/v1/no/such/route/"), 404, "not_found", None)["message"]

    # the spec documents it: every operation lists ErrorBody (or its events extension) for its error statuses
    spec = client.get("/openapi.json").json()
    assert set(spec["components"]["securitySchemes"]) == {"ApiKeyAuth", "BearerAuth"}
    assert spec["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "an API key bound to tenants",
    }
    public = {"/v1/health": {"500", "503"}, "/v1/schema/event": {"500"}}  # no key; the schema touches no store
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
            assert public.get(path, {"500", "503"}) <= set(errors), (method, path, sorted(op["responses"]))
            for status, r in errors.items():
                ref = r["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith(("/ErrorBody", "/PublishErrorBody")), (method, path, status, ref)
            if path not in public:
                assert {"401", "403", "422"} <= set(errors), (method, path)
                assert op["security"] == [{"ApiKeyAuth": []}, {"BearerAuth": []}], (method, path)


def test_class13_unexpected_errors_and_framework_exceptions_keep_the_shape() -> None:
    """A bug is a 500 in the same shape (no traceback leaked); HTTPException details of any form are normalized."""
    app = FastAPI()
    install_error_handlers(app)
    install_answer_headers(app)

    @app.get("/boom")
    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    @app.get("/str")
    async def as_string() -> None:
        raise HTTPException(409, detail="plain text")

    @app.get("/dict")
    async def as_dict() -> None:
        raise HTTPException(403, detail={"field": "tenant", "message": "no"})

    with TestClient(app, raise_server_exceptions=False) as c:
        item = assert_error(c.get("/boom"), 500, "internal_error", None)
        assert "secret" not in item["message"] and "RuntimeError" in item["message"]
        answer = c.get("/v1/boom")  # a 500 says what every answer says (api.main.AnswerHeaders)
        assert answer.status_code == 500 and answer.headers["cache-control"] == "no-store", answer.headers
        assert answer.headers["x-content-type-options"] == "nosniff", answer.headers
        assert_error(c.get("/str"), 409, "error", None)
        assert_error(c.get("/dict"), 403, "forbidden", "tenant")


# -- store failures and inputs that were 500 ---------------------------------------------------


Route = tuple[str, str]  # (method, path template) as tests.support.routes.app_routes names it


def _routes(tenant: str, receipt: dict[str, Any]) -> dict[Route, list[tuple[str, dict[str, Any]]]]:
    """Requests on every route of the app, for the class tests that must hold on each (`receipt`: one of `tenant`'s,
    from a facts answer); a route without an entry fails test_every_route_is_in_the_class_tests."""
    q = {"params": {"tenant": tenant}}
    return {
        ("GET", "/v1/subjects/{subject}/facts"): [
            ("/v1/subjects/user:1/facts", q),
            ("/v1/subjects/user:1/facts", {"params": {"tenant": tenant, "known_at": "2026-01-01T00:00:00Z"}}),
        ],
        ("GET", "/v1/subjects/{subject}/events"): [("/v1/subjects/user:1/events", q)],
        ("GET", "/v1/facts/{memory_id}/history"): [("/v1/facts/abc/history", q)],
        ("GET", "/v1/stats"): [("/v1/stats", q)],
        ("GET", "/v1/stats/consistency"): [("/v1/stats/consistency", q)],
        ("GET", "/v1/tenants"): [("/v1/tenants", {})],
        ("GET", "/v1/subjects"): [("/v1/subjects", {"params": {"tenant": tenant, "prefix": "user:"}})],
        ("POST", "/v1/recall"): [
            ("/v1/recall", {"json": {"tenant": tenant, "query": "P1 backend port", "mode": "keyword"}}),
            ("/v1/recall", {"json": {"tenant": tenant, "query": "user:1 seat", "mode": "exact"}}),
        ],
        ("POST", "/v1/context"): [
            ("/v1/context", {"json": {"tenant": tenant, "subject": "user:1", "question": "seat", "format": "json"}})
        ],
        ("POST", "/v1/events"): [("/v1/events", {"json": {"events": [event(tenant=tenant, event_id=unique("down"))]}})],
        ("DELETE", "/v1/subjects/{subject}"): [("/v1/subjects/user:1", q)],
        ("GET", "/v1/events/{event_id}"): [("/v1/events/some-event-id", q)],
        ("POST", "/v1/keys"): [("/v1/keys", {"json": {"tenant": tenant, "subjects": ["user:1"]}})],
        ("POST", "/v1/keys/retire"): [
            ("/v1/keys/retire", {"json": {"tenant": tenant, "subject": "user:1", "erasure_id": unique("erase")}})
        ],
        ("GET", "/v1/erasures"): [("/v1/erasures", q)],
        ("GET", "/v1/erasures/{erasure_id}"): [("/v1/erasures/some-erasure-id", q)],
        ("GET", "/v1/dead-letters"): [("/v1/dead-letters", q)],
        ("GET", "/v1/dead-letters/{partition}/{offset}"): [("/v1/dead-letters/0/0", q)],
        ("POST", "/v1/dead-letters/redrive"): [
            ("/v1/dead-letters/redrive", {"json": {"tenant": tenant, "partition": 0, "offset": 0, "event": event()}})
        ],
        ("POST", "/v1/dead-letters/discard"): [
            ("/v1/dead-letters/discard", {"json": {"tenant": tenant, "partition": 0, "offset": 0, "reason": "r"}})
        ],
        ("POST", "/v1/receipts/verify"): [("/v1/receipts/verify", {"json": {"tenant": tenant, "receipt": receipt}})],
        ("POST", "/v1/receipts/replay"): [
            (
                "/v1/receipts/replay",
                {"json": {"tenant": tenant, "receipt": receipt, "request": {"subject": "user:1"}}},
            )
        ],
        # no key, and what no store serves
        ("GET", "/v1/health"): [("/v1/health", {})],
        ("GET", "/v1/schema/event"): [("/v1/schema/event", {})],
        ("GET", "/"): [("/", {})],
        ("GET", "/openapi.json"): [("/openapi.json", {})],
        ("GET", "/docs"): [("/docs", {})],
        ("GET", "/docs/static"): [("/docs/static/swagger-ui.css", {})],
        ("GET", "/console"): [("/console", {})],
        ("GET", "/console/static"): [("/console/static/console.js", {})],
        ("GET", "/metrics"): [("/metrics", {})],
    }


@pytest.fixture(scope="module")
def receipt(client: TestClient) -> dict[str, Any]:
    """A receipt of tenant A, as a facts answer gives it (for the receipt routes), signed."""
    r = client.get("/v1/subjects/user:1/facts", params={"tenant": A}, headers=HA)
    assert r.status_code == 200, r.text
    assert r.json()["receipt"]["signature"] is not None, r.text
    return r.json()["receipt"]


def test_every_route_is_in_the_class_tests(base_settings: Settings, receipt: dict[str, Any]) -> None:
    """A new route must be given requests in `_routes`, or this fails (and so every class test here covers it)."""
    routes, listed = app_routes(base_settings), set(_routes(A, receipt))
    assert not routes - listed, f"routes missing from _routes: {sorted(routes - listed)}"
    assert not listed - routes, f"_routes names no route of the app: {sorted(listed - routes)}"
    named = TENANTLESS.union(*NEEDS.values())
    assert not named - routes, f"TENANTLESS or NEEDS name no route of the app: {sorted(named - routes)}"


# the routes that take no tenant: the public ones, and the list of the key's own tenants
TENANTLESS: set[Route] = {
    ("GET", "/v1/tenants"),
    ("GET", "/v1/health"),
    ("GET", "/v1/schema/event"),
    ("GET", "/"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/static"),
    ("GET", "/console"),
    ("GET", "/console/static"),
    ("GET", "/metrics"),
}


def test_class7_a_key_never_reaches_another_tenant_on_any_route(client: TestClient, receipt: dict[str, Any]) -> None:
    """Key A naming tenant B is a 403 naming the tenant field on every route that takes a tenant; nothing published."""
    before = end_offsets(client.app.state.settings)
    for route, requests in _routes(B, receipt).items():
        if route in TENANTLESS:
            continue
        for url, kw in requests:
            item = assert_error(client.request(route[0], url, headers=HA, **kw), 403, "forbidden_tenant")
            assert item["field"] is not None and item["field"].endswith("tenant"), (route, item)
    assert end_offsets(client.app.state.settings) == before, "a refused request published something"


@pytest.mark.parametrize("malformed", ["ac|me", "acme\n", "ac me", "x" * 129, "acme\u0000"])
def test_class7_a_tenant_no_key_could_hold_is_a_422_naming_it_not_a_403(
    client: TestClient, receipt: dict[str, Any], malformed: str
) -> None:
    """A tenant the contract could never take (a `|`, white space, too long, a NUL) is malformed in itself: every
    route that takes a tenant refuses it with a 422 naming the tenant field, as for any malformed request, never
    the 403 of a tenant the key may not use; nothing published."""
    before = end_offsets(client.app.state.settings)
    for route, requests in _routes(malformed, receipt).items():
        if route in TENANTLESS:
            continue
        for url, kw in requests:
            r = client.request(route[0], url, headers=HA, **kw)
            assert r.status_code == 422, (route, r.status_code, r.text)
            item = r.json()["detail"][0]
            assert item["field"] is not None and item["field"].endswith("tenant"), (route, item)
    assert end_offsets(client.app.state.settings) == before, "a refused request published something"


# which routes need which store (the others still answer, below 500, when it is down)
_PG = {
    ("GET", "/v1/subjects/{subject}/facts"),
    ("GET", "/v1/subjects/{subject}/events"),
    ("GET", "/v1/facts/{memory_id}/history"),
    ("GET", "/v1/stats"),
    ("GET", "/v1/stats/consistency"),
    ("GET", "/v1/subjects"),
    ("GET", "/v1/events/{event_id}"),
    ("POST", "/v1/recall"),  # the vocabulary
    ("POST", "/v1/context"),
    ("POST", "/v1/keys"),
    ("POST", "/v1/keys/retire"),
    ("GET", "/v1/erasures"),
    ("GET", "/v1/erasures/{erasure_id}"),
    ("GET", "/v1/dead-letters"),
    ("GET", "/v1/dead-letters/{partition}/{offset}"),
    ("POST", "/v1/dead-letters/redrive"),
    ("POST", "/v1/dead-letters/discard"),
    ("POST", "/v1/receipts/verify"),
    ("POST", "/v1/receipts/replay"),
}
NEEDS: dict[str, set[Route]] = {
    "postgres": _PG,
    "elasticsearch": {
        ("GET", "/v1/stats"),
        ("GET", "/v1/stats/consistency"),
        ("POST", "/v1/recall"),
        ("POST", "/v1/context"),  # its question's recall
    },
    "kafka": {("GET", "/v1/stats"), ("POST", "/v1/events"), ("DELETE", "/v1/subjects/{subject}")},
}
DOWN = {
    "postgres": {"pg_dsn": f"postgresql://ledger:ledger@{DEAD}/ledger"},
    "elasticsearch": {"es_url": f"http://{DEAD}"},
    "kafka": {"kafka_bootstrap": DEAD},
}


@pytest.mark.parametrize("store", ["postgres", "elasticsearch", "kafka"])
def test_class8_a_store_that_is_down_is_a_prompt_503_naming_it_on_every_route(
    trust_settings: Settings, receipt: dict[str, Any], store: str
) -> None:
    settings = trust_settings.model_copy(update=DOWN[store])
    needs = NEEDS[store] | {("GET", "/v1/health")}
    with TestClient(create_app(settings)) as c:
        for route, requests in _routes(A, receipt).items():
            for url, kw in requests:
                method = route[0]
                t0 = time.monotonic()
                r = c.request(method, url, headers=HA, **kw)
                took = time.monotonic() - t0
                assert took < PROMPT_S, f"{method} {url} with {store} down took {took:.1f}s"
                # an exact question naming an entity id is answered from PostgreSQL's current state, index or not
                exact_by_id = url == "/v1/recall" and kw["json"]["mode"] == "exact"
                if store == "elasticsearch" and exact_by_id:
                    assert r.status_code == 200 and "exact_postgres" in r.json()["trace"]["stages_ms"], r.text[:300]
                elif route in needs:
                    item = assert_error(r, 503, "store_unavailable", None)
                    assert item["message"].startswith(f"{store}: "), (method, url, item)
                    assert "Traceback" not in r.text
                else:
                    assert r.status_code < 500, f"{method} {url} with {store} down: {r.status_code} {r.text[:300]}"
                if store == "postgres" and url == "/v1/events":  # the door check is skipped, never blocking
                    assert r.status_code == 200, r.text
                    assert r.json()["idempotency_checked"] is False and "postgres" in r.json()["idempotency_note"]
                if url == "/v1/health":
                    assert not r.json()["parts"][store]["ok"], r.text[:300]


def test_health_says_degraded_while_the_elasticsearch_cluster_is_red(client: TestClient) -> None:
    """A cluster that answers but is red (a primary shard unassigned: here an index whose shard may live on no node)
    fails searches and writes: the health part is not ok (503 naming elasticsearch), as infra counts it down."""
    from projections.search.client import es_client

    settings: Settings = client.app.state.settings
    red = unique("red")
    with es_client(settings, 10) as es:
        es.indices.create(
            index=red,
            settings={"number_of_shards": 1, "number_of_replicas": 0, "routing.allocation.require._name": "nowhere"},
            wait_for_active_shards="0",
        )
        try:
            wait_for(lambda: es.cluster.health()["status"] == "red", 30, what="the cluster red")
            r = client.get("/v1/health")
            assert r.status_code == 503 and r.json()["status"] == "degraded", r.text
            part = r.json()["parts"]["elasticsearch"]
            assert not part["ok"] and "red" in part["error"], part
            item = assert_error(r, 503, "store_unavailable", None)
            assert item["message"].startswith("elasticsearch: "), item
        finally:
            es.indices.delete(index=red)
    wait_for(lambda: client.get("/v1/health").status_code == 200, 30, what="health ok again")


def test_class8_inputs_that_were_500_or_503_are_4xx_naming_the_field(client: TestClient) -> None:
    before = end_offsets(client.app.state.settings)
    cases = [  # (method, url, kwargs, field)
        ("GET", "/v1/subjects/a%00b/facts", {"params": {"tenant": A}}, "subject"),
        ("GET", "/v1/subjects/a%00b/events", {"params": {"tenant": A}}, "subject"),
        ("DELETE", "/v1/subjects/a%00b", {"params": {"tenant": A}}, "subject"),
        ("DELETE", "/v1/subjects/ab", {"params": {"tenant": A, "reason": "nul\x00"}}, "reason"),
        ("GET", "/v1/facts/m%00/history", {"params": {"tenant": A}}, "memory_id"),
        ("GET", "/v1/stats", {"params": {"tenant": "a\x00"}}, "tenant"),
        ("POST", "/v1/recall", {"json": {"tenant": A, "query": "x", "subject": "s\x00"}}, "subject"),
        ("POST", "/v1/recall", {"json": {"tenant": A, "query": "x", "filters": {"key": ["k", "\x00"]}}}, "filters.key"),
        ("POST", "/v1/recall", {"json": {"tenant": A, "query": "x", "filters": {"tags": "t\x00"}}}, "filters.tags"),
        ("GET", "/v1/subjects/s/facts", {"params": {"tenant": A, "as_of": "9999-12-31T23:59:59-01:00"}}, "as_of"),
        ("GET", "/v1/subjects/s/facts", {"params": {"tenant": A, "known_at": "0001-01-01T00:00:00+01:00"}}, None),
        ("GET", "/v1/subjects/s/events", {"params": {"tenant": A, "to": "0001-01-01T00:00:00+01:00"}}, "to"),
        ("POST", "/v1/recall", {"json": {"tenant": A, "query": "x", "as_of": "9999-12-31T23:59:59-01:00"}}, "as_of"),
    ]
    for method, url, kw, field in cases:
        item = assert_error(client.request(method, url, headers=HA, **kw), 422)
        assert item["code"] in ("unstorable_text", "invalid_time"), (url, item)
        if field is not None:
            assert item["field"] == field, (url, item)
    events = [  # values the broker "refused" with a retryable 503 before: bad input is the caller's 4xx
        (event(value=10**30), "number_out_of_range", "events.0.value"),
        (event(value={"n": 2**64}), "number_out_of_range", "events.0.value.n"),
        (event(value=_nested(300)), "too_deep", None),
        (event(observed_at="9999-12-31T23:59:59-01:00"), "invalid_time", "events.0.observed_at"),
        (event(valid_to="0001-01-01T00:00:00+01:00"), "invalid_time", "events.0.valid_to"),
        (event(subject="user\x00:1"), "unstorable_text", "events.0.subject"),
        (event(value={"k\x00": 1}), "unstorable_text", None),
    ]
    for body, code, field in events:
        r = client.post("/v1/events", json={"events": [body]}, headers=HA)
        item = assert_error(r, 422, code)
        assert item["field"].startswith("events.0"), item
        if field is not None:
            assert item["field"] == field, item
        assert r.json()["results"][0]["error"] == item
    # the same verdicts from a request large enough to be judged in a child process, with a value nested deeper
    # than pickle goes (which the standard parser reads): judged in this process instead
    copies = JUDGED_IN_A_CHILD // len(events) + 1
    r = client.post("/v1/events", json={"events": [e for e, _, _ in events] * copies + [_nested(600)]}, headers=HA)
    assert r.status_code == 422, r.text[:300]
    codes = [result["error"]["code"] for result in r.json()["results"]]
    assert codes == [code for _, code, _ in events] * copies + ["not_an_object"], codes
    big = [event(value=_nested(600)) if i == 7 else e for i, (e, _, _) in enumerate(events * copies)]
    r = client.post("/v1/events", json={"events": big}, headers=HA)
    assert [result["error"]["code"] for result in r.json()["results"]][7] == "too_deep", r.text[:300]
    assert end_offsets(client.app.state.settings) == before, "a refused request published something"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# what a client's JSON may spell that orjson refuses and the standard parser reads (NaN, an infinity, a lone
# surrogate, an integer outside 64 bits), and what no store holds (NUL)
_ONLY_THE_STANDARD_PARSER_READS = (b"NaN", b"-Infinity", b"1e400", b'"\\ud800"', b"9" * 30, b'"\\u0000"')
_MARK = "__hostile__"


def _places(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, bool]]:
    """(path, is_object) of every value in `value`: each leaf, and each object (given a key of its own)."""
    if isinstance(value, dict):
        yield path, True
        for k, v in value.items():
            yield from _places(v, (*path, k))
    elif isinstance(value, list) and value:
        yield from _places(value[0], (*path, 0))
    else:
        yield path, False


def _marked(body: Any, path: tuple, is_object: bool) -> bytes:
    """`body` as JSON with `_MARK` in its place: the leaf at `path`, or a key added to the object there."""
    if is_object:
        marked = orjson.dumps(with_value_at(body, (*path, _MARK), 1))
        return marked.replace(orjson.dumps(_MARK) + b":", b'"\\udc00":')
    return orjson.dumps(with_value_at(body, path, _MARK))


def test_class8_any_body_field_given_what_only_the_standard_parser_reads_is_4xx_never_500(
    client: TestClient, receipt: dict[str, Any]
) -> None:
    """Every field of every JSON body (each leaf at any depth, and a lone-surrogate key in each object), given each
    value a client's JSON may spell that no store or canonical JSON holds: a 4xx in the one shape, or an answer,
    never a server error (a receipt's canonical JSON raised on a lone surrogate or a long integer)."""
    tried, unnamed = 0, []
    for (method, _), requests in _routes(A, receipt).items():
        for url, kw in requests:
            if "json" not in kw:
                continue
            for path, is_object in _places(kw["json"]):
                raw = _marked(kw["json"], path, is_object)
                for literal in _ONLY_THE_STANDARD_PARSER_READS if not is_object else (b"1",):
                    content = raw.replace(orjson.dumps(_MARK), literal)
                    headers = {**HA, "content-type": "application/json"}
                    r = client.request(method, url, content=content, headers=headers)
                    tried += 1
                    where = (url, path, literal)
                    assert r.status_code < 500, (where, r.text[:300])
                    if r.status_code >= 400:
                        assert_error(r, r.status_code)
                        # the README: a lone surrogate is unstorable_text (a time, a token, a signature may
                        # refuse it first, as what it is not)
                        said = [(i["code"], i["message"]) for i in r.json()["detail"] if "unicode" in i["message"]]
                        if literal == b'"\\ud800"' and any(code != "unstorable_text" for code, _ in said):
                            unnamed.append((where, r.text[:300]))
                    elif url == "/v1/events":  # accepted: what it held was storable (never one of these)
                        raise AssertionError((where, r.text[:300]))
    assert tried > 300, tried
    assert unnamed == [], "\n".join(map(str, unnamed))


# -- accepted, then dead-lettered ---------------------------------------------------------------


def test_class4_what_the_worker_would_dead_letter_is_refused_at_the_door(client: TestClient) -> None:
    settings = client.app.state.settings
    before = end_offsets(settings)
    too_big = [
        event(value="x" * (300 * 1024)),  # a 300 KB value
        event(value="x" * MAX_EVENT_BYTES),  # the value alone fills the record
        event(aliases=[f"{i:03}" + "a" * 250 for i in range(64)], value=["v" * 4000] * 62),  # every field in limits
        event(content="c" * 16_000, value={f"k{i}": "v" * 1000 for i in range(250)}),
    ]
    for body in too_big:
        r = client.post("/v1/events", json={"events": [body]}, headers=HA)
        item = assert_error(r, 422, "too_large", "events.0")
        assert str(MAX_EVENT_BYTES) in item["message"]
    deep = client.post("/v1/events", json={"events": [event(value=_nested(33))]}, headers=HA)
    assert_error(deep, 422, "too_deep")
    assert end_offsets(settings) == before, "nothing of a refused request is published"

    # in a batch: the good ones are published, the oversized one is refused alone, naming it
    batch = [event("user:7", event_id="fits-1"), event("user:7", value="y" * MAX_EVENT_BYTES), event("user:8")]
    r = client.post("/v1/events", json={"events": batch}, headers=HA)
    assert r.status_code == 207, r.text
    results = r.json()["results"]
    assert [x["accepted"] for x in results] == [True, False, True]
    assert results[1]["error"]["code"] == "too_large" and results[1]["error"]["field"] == "events.1"
    published = {decode(rec.value).event_id for rec in read_topic(settings)}
    assert {results[0]["event_id"], results[2]["event_id"]} <= published
    assert results[1]["event_id"] not in published


# -- silent changes ------------------------------------------------------------------------------


def test_class9_nothing_is_silently_changed(client: TestClient) -> None:
    json_headers = {**HA, "Content-Type": "application/json"}
    template = (
        b'{"events": [{"type": "memory.asserted", "tenant": "tenant-a", "subject": "u", "key": "k", '
        b'"content": "c", "value": %s}]}'
    )
    # and what the stores would read as another number: -0.0 (jsonb keeps 0), 1e-400 (a double reads 0)
    tiny_fraction = b"0." + b"0" * 400 + b"1"  # written out, no exponent
    for literal in (
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e999",
        b'{"x": [NaN]}',
        b"-0.0",
        b"1e-400",
        b"[-0.0]",
        tiny_fraction,
    ):
        r = client.post("/v1/events", content=template % literal, headers=json_headers)
        item = assert_error(r, 422, "number_out_of_range")
        assert item["field"].startswith("events.0.value"), item

    times = ["1700000000", "1700000000000", "2026-01-01T00:00Z", "2026-01-01T00:00:00.1234567Z", "2026-01-01T00:00:00"]
    times += ["2026-01-01", "2026-13-01T00:00:00Z", "yesterday"]
    for bad in times:
        for name, url in (("as_of", "facts"), ("known_at", "facts"), ("from", "events"), ("to", "events")):
            r = client.get(f"/v1/subjects/u/{url}", params={"tenant": A, name: bad}, headers=HA)
            assert_error(r, 422, "invalid_time", name)
        r = client.post("/v1/recall", json={"tenant": A, "query": "k", "as_of": bad}, headers=HA)
        assert_error(r, 422, "invalid_time", "as_of")
        r = client.post("/v1/events", json={"events": [event(observed_at=bad)]}, headers=HA)
        assert_error(r, 422, "invalid_time", "events.0.observed_at")
    r = client.post("/v1/recall", json={"tenant": A, "query": "k", "as_of": 1700000000}, headers=HA)
    assert_error(r, 422, "invalid_time", "as_of")
    ok = client.get(
        "/v1/subjects/u/facts", params={"tenant": A, "as_of": "2026-01-01T01:00:00.123456+01:00"}, headers=HA
    )
    assert ok.status_code == 200 and ok.json()["as_of"] == "2026-01-01T00:00:00.123456Z"
    r = client.get(
        "/v1/subjects/u/events",
        params={"tenant": A, "from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
        headers=HA,
    )
    assert_error(r, 422, "invalid_range", "to")

    # a clock in the future would win over every later update: refused beyond the configured skew
    skew = client.app.state.settings.max_future_skew_s
    for future in ("2099-01-01T00:00:00Z", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + skew + 120))):
        r = client.post("/v1/events", json={"events": [event(observed_at=future)]}, headers=HA)
        assert_error(r, 422, "clock_skew", "events.0.observed_at")
    near = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))  # within the window: fine
    assert client.post("/v1/events", json={"events": [event(observed_at=near)]}, headers=HA).status_code == 200

    # explicit null for a defaulted field is "absent", not refused
    nulls = event("user:nulls", event_id=None, scope=None, observed_at=None, kind=None, entities=None, source=None)
    r = client.post(
        "/v1/events", json={"events": [nulls, event("user:nulls2", importance=None, tags=None)]}, headers=HA
    )
    assert r.status_code == 200, r.text
    assert all(x["accepted"] and x["event_id"] for x in r.json()["results"])


# -- DELETE of a subject with / -------------------------------------------------------------------


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """The app under a real uvicorn on an ephemeral loopback port (the path is decoded once, as in production;
    Starlette's TestClient decodes it twice, which would hide the difference between %2F and %252F)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, 0.05, "uvicorn to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_class9_a_query_parameter_no_route_takes_is_refused_naming_it(client: TestClient) -> None:
    """Every operation that reads a query, given one more parameter it does not take (a misspelled `as_of`, or one
    another route takes): 422 `unknown_field` naming it, before any store is asked, as a body's unknown field is.
    Ignored, it would answer another question than the one asked (`asof=` gave today's facts)."""
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    asked = bodies = 0
    for template, ops in paths.items():
        path = template.replace("{", "").replace("}", "")  # any value of a path parameter: refused before routing
        for method, op in ops.items():
            taken = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            if not taken and "requestBody" not in op:
                continue  # reads no input at all (health, the schema, the tenants): a cache-buster changes nothing
            for extra in ("asof", "after" if "after" not in taken else "known_atx", "Tenant"):
                params = {"tenant": A, extra: "x"} if "tenant" in taken else {extra: "x"}
                r = client.request(method.upper(), path, params=params, headers=HA, json={})
                item = assert_error(r, 422, "unknown_field", extra)
                if taken:
                    assert sorted(taken) == item["message"].split("takes: ")[1].split(", "), item
                asked += 1
            bodies += not taken
            if "tenant" in taken:  # the last of two is not taken silently: no parameter takes a list
                r = client.request(method.upper(), path + "?tenant=" + A + "&tenant=" + A, headers=HA)
                assert_error(r, 422, "invalid_value", "tenant")
    assert asked >= 3 * 20 and bodies >= 8, (asked, bodies)  # the routes that read a query or a body
    # a subject ending like a more literal template of another method is still this route's
    r = client.delete("/v1/subjects/u%2Ffacts", params={"tenant": A, "reasn": "x"}, headers=HA)
    assert_error(r, 422, "unknown_field", "reasn")
    r = client.get("/v1/health", params={"nocache": "1"})  # reads no input: a probe's cache-buster changes nothing
    assert r.status_code in (200, 503), r.text


def test_class10_delete_takes_subjects_with_slashes_as_get_reads_them(trust_settings: Settings) -> None:
    cases = [  # (path as sent on the wire, the subject it names)
        ("/v1/subjects/team/alpha", "team/alpha"),
        ("/v1/subjects/team%2Fbeta", "team/beta"),
        ("/v1/subjects/team%252Fgamma", "team%2Fgamma"),  # an encoded %: the literal subject, not team/gamma
        ("/v1/subjects/a/b/c/?literal=true", "a/b/c/"),  # a trailing slash: part of the subject when said literally
        ("/v1/subjects/x/facts?literal=true", "x/facts"),  # a read route's path: erased only when said literally
        ("/v1/subjects/x%2Fevents?literal=true", "x/events"),
        ("/v1/subjects/facts", "facts"),  # a segment of that name alone is a subject like any other
    ]
    answered = {}
    with live_server(create_app(trust_settings)) as url, httpx.Client(base_url=url, headers=HA, timeout=30) as http:
        refused = ("/v1/subjects/x/facts", "/v1/subjects/x/y/events", "/v1/subjects/x%2Ffacts", "/v1/subjects/x/facts/")
        for path in (*refused, "/v1/subjects/user:1/", "/v1/subjects/x//"):
            # the facts or events of x as GET reads them, or x with a URL's trailing slash: never the erasure of
            # another subject, nothing published
            r = http.delete(path, params={"tenant": A, "reason": "test", "literal": "false"})
            assert_error(r, 422, "invalid_value", "subject")
            assert "literal=true" in r.json()["detail"][0]["message"], r.text
            r = http.delete(path, params={"tenant": B})  # another tenant's is a 403 first, whatever the path
            assert_error(r, 403, "forbidden_tenant", "tenant")
        # the 422's advice, sent as written, erases the subject it names (a dot segment too, which a client would
        # otherwise resolve against the segment before it)
        meant = {"/v1/subjects/q%3Fx%23y%25/facts": "q?x#y%", "/v1/subjects/b//facts": "b/"}
        meant |= {"/v1/subjects/x%2F.%2Ffacts": "x/.", "/v1/subjects/y%2F..%2Fevents": "y/.."}
        for path, subject in meant.items():
            r = http.delete(path, params={"tenant": A})
            advice = re.search(r"DELETE (\S+);", r.json()["detail"][0]["message"])
            assert r.status_code == 422 and advice, r.text
            advised, _, query = advice.group(1).partition("?")
            r = http.delete(advised, params=dict(parse_qsl(query)))
            assert r.status_code == 202 and r.json()["subject"] == subject, (advice.group(1), r.text)
            answered[r.json()["event_id"]] = subject
        r = http.delete("/v1/subjects/%20/facts", params={"tenant": A})  # a blank subject meant: no request erases it
        assert_error(r, 422, "invalid_value", "subject")
        assert "DELETE" not in r.json()["detail"][0]["message"] and "literal=true" in r.text, r.text
        for path, subject in cases:
            path, _, query = path.partition("?")
            r = http.delete(path, params={"tenant": A, "reason": "test", **dict([query.split("=")] if query else [])})
            assert r.status_code == 202, f"{path}: {r.status_code} {r.text}"
            assert r.json()["subject"] == subject, (path, r.json())
            answered[r.json()["event_id"]] = subject
            read = http.get(path + "/facts", params={"tenant": A})  # GET reads the same subject
            assert read.status_code == 200 and read.json()["subject"] == subject, (path, read.text)
        assert_error(http.delete("/v1/subjects/", params={"tenant": A}), 422, "invalid_value", "subject")  # no subject
    on_topic = {e.event_id: e.subject for e in (decode(rec.value) for rec in read_topic(trust_settings))}
    assert {eid: on_topic.get(eid) for eid in answered} == answered, "the tombstones name exactly those subjects"
    assert not {"x/y/events", "x/facts/", "user:1/", "x//"} & set(on_topic.values()), "a refused one published nothing"


# -- idempotency at the door, with the projector applying the events --------------------------


@pytest.fixture(scope="module")
def applied(base_settings: Settings) -> Iterator[Pipeline]:
    """The app and the projector on private names (no indexer: these checks read PostgreSQL)."""
    with pipeline(base_settings.private(unique("door"), api_keys=KEYS), indexer=False, app=True) as p:
        yield p


def test_class10_an_erasure_of_a_look_alike_spelling_is_refused_naming_the_subject_meant(applied: Pipeline) -> None:
    """The class: a subject with no event, erased while another subject of the tenant reads the same (its case,
    width, Unicode form, white space at its ends, invisible characters or a dash's kind aside), used to answer 202
    and purge nothing while the subject meant stayed readable. Over HTTP and MCP it is a 422 naming the subject
    meant; said literally, it is erased as asked; a subject with events of its own, or one another tenant holds, is
    erased as ever."""
    c = applied.client
    real = "user:Café-5"  # NFC
    sharp = "user:Straße-5"  # a sharp s: casefold reads it `ss`, as recall reads ids
    other_tenant = "user:ümlaut"
    r = c.post("/v1/events", json={"events": [event(real, event_id="LA1"), event(sharp, event_id="LA3")]}, headers=HA)
    assert r.status_code == 200, r.text
    # a thousand subjects that mention the id, sorted before the one meant: the check must not stop at them
    mentions = [event(f"user:A{n:04d}", event_id=f"LAM{n}", entities=[real.upper()]) for n in range(1000)]
    r = c.post("/v1/events", json={"events": mentions}, headers=HA)
    assert r.status_code == 200, r.text[:300]
    r = c.post("/v1/events", json={"events": [event(other_tenant, tenant=B, event_id="LA2")]}, headers=HB)
    assert r.status_code == 200, r.text
    applied.caught_up(90)
    spellings = [
        "USER:CAFÉ-5",
        "user:Cafe\u0301-5",
        " user:Café-5",
        "user:Café-5\t",
        "user:Café-5\u00a0",
        "user:Ｃafé-５",
        "user:Café-5\u200b",  # invisible characters, and a dash of another kind: on a screen, the same id
        "\u2060user:Café\u00ad-5",
        "user:Café\u20115",
        "user:Café\u22125",
        "user:Café\ufe325",  # a compatibility form of a dash (NFKC reads it `–`)
    ]
    meant = {s: real for s in spellings} | {s: sharp for s in ("USER:STRASSE-5", "user:strasse-5", f"{sharp}\u2003")}
    for spelling, subject in meant.items():
        assert spelling != subject
        r = c.delete(f"/v1/subjects/{quote(spelling, safe='')}", params={"tenant": A}, headers=HA)
        item = assert_error(r, 422, "invalid_value", "subject")
        assert repr(subject) in item["message"] and "literal=true" in item["message"], (spelling, item)
        done = asyncio.run(_mcp_forget(applied, {"tenant": A, "subject": spelling, "erase_subject": True}))
        assert done.is_error and repr(subject) in done.content[0].text, (spelling, done)
    assert [f["value"] for f in c.get(f"/v1/subjects/{quote(real)}/facts", params={"tenant": A}, headers=HA)
            .json()["facts"]] == ["window"]  # fmt: skip
    before = end_offsets(applied.settings)
    r = c.delete(f"/v1/subjects/{quote(spellings[0])}", params={"tenant": A, "literal": "true"}, headers=HA)
    assert r.status_code == 202 and r.json()["subject"] == spellings[0], r.text
    assert sum(end_offsets(applied.settings).values()) == sum(before.values()) + 1
    r = c.delete(f"/v1/subjects/{quote(other_tenant.upper())}", params={"tenant": A}, headers=HA)
    assert r.status_code == 202, r.text  # B's subject is nothing of A's
    refused_only = "USER:café-5"  # only a refused record (a conflicting re-use of LA1) filed under it: a record
    reused = event(refused_only, event_id="LA1", value="other")
    [letter] = publish_raw(applied.settings, [(f"{A}|{refused_only}".encode(), orjson.dumps(reused))])
    applied.caught_up(90)
    r = c.delete(f"/v1/subjects/{quote(refused_only)}", params={"tenant": A}, headers=HA)
    assert r.status_code == 202 and r.json()["subject"] == refused_only, (letter, r.text)
    r = c.delete(f"/v1/subjects/{quote(real)}", params={"tenant": A}, headers=HA)
    assert r.status_code == 202 and r.json()["subject"] == real, r.text
    applied.caught_up(90)
    assert c.get(f"/v1/subjects/{quote(real)}/facts", params={"tenant": A}, headers=HA).json()["facts"] == []


def test_class2_the_same_event_asked_at_once_or_again_before_it_is_applied_is_published_once(applied: Pipeline) -> None:
    """The class: a door published again an event claimed and not seen applied yet, so identical requests in flight
    at once (six MCP `remember`s) each wrote a record and were each told another position. Within one process they
    wait for the first publish and are answered its position, one of them as the original; so is a retry made
    before the event is applied. Nothing but the first reaches the topic."""
    from api.writes import publish_events

    sent = event("user:co1", event_id="CO1")

    async def storm() -> list[dict[str, Any]]:
        async with Resources.open(applied.settings, warm_embedder=False) as res:
            asks = [publish_events(res, frozenset({A}), [dict(sent)]) for _ in range(8)]
            answers = [body for _, body in await asyncio.gather(*asks)]
            _, again = await publish_events(res, frozenset({A}), [dict(sent)])
            return [body["results"][0] for body in [*answers, again]]

    before = sum(end_offsets(applied.settings).values())
    results = asyncio.run(storm())
    assert all(r["accepted"] for r in results), results
    assert len({(r["partition"], r["offset"]) for r in results}) == 1, results
    assert sum(not r["duplicate"] for r in results) == 1, results
    assert sum(end_offsets(applied.settings).values()) == before + 1


def test_a_page_cursor_past_the_log_is_refused_naming_it(applied: Pipeline) -> None:
    """The class: a cursor is a place in the log; one no page gave (a partition the projection never took a record
    of, an offset past its position) read as a page, empty as if the subject had nothing more, or the rest of the
    log after it. Every list paged by a place refuses it (the audit replay's `cursor`, the dead letters' `after`
    over HTTP and MCP) with a 422 naming it; a cursor at the last event still reads the empty last page."""
    c = applied.client
    r = c.post("/v1/events", json={"events": [event("user:cur", event_id=f"CUR{n}") for n in range(2)]}, headers=HA)
    assert r.status_code == 200, r.text
    applied.caught_up(90)
    ends = end_offsets(applied.settings)
    page = c.get("/v1/subjects/user:cur/events", params={"tenant": A}, headers=HA).json()
    last = page["events"][-1]
    r = c.get("/v1/subjects/user:cur/events", params={"tenant": A, "cursor": f"{last['partition']}:{last['offset']}"},
              headers=HA)  # fmt: skip
    assert r.status_code == 200 and r.json()["events"] == [] and r.json()["more"] is False, r.text
    for cursor in (f"{max(ends) + 1}:0", f"{last['partition']}:{ends[last['partition']] + 5}", "0:99999999999"):
        # (the last: a page of the subject's events would follow it, every partition after 0 being later)
        r = c.get("/v1/subjects/user:cur/events", params={"tenant": A, "cursor": cursor}, headers=HA)
        item = assert_error(r, 422, "invalid_value", "cursor")
        assert "past what the projection has applied" in item["message"], (cursor, item)
        r = c.get("/v1/dead-letters", params={"tenant": A, "after": cursor}, headers=HA)
        item = assert_error(r, 422, "invalid_value", "after")
        assert "past what the projection has applied" in item["message"], (cursor, item)
        done = asyncio.run(_mcp_tool(applied, "dead_letters", {"tenant": A, "after": cursor}))
        assert done.is_error and "past what the projection has applied" in done.content[0].text, (cursor, done)
    r = c.get("/v1/dead-letters", params={"tenant": A, "after": f"{last['partition']}:{last['offset']}"}, headers=HA)
    assert r.status_code == 200, r.text


def test_every_integer_parameter_takes_digits_only(applied: Pipeline) -> None:
    """The class: pydantic reads a parameter's `1.0`, `+1`, `-0`, ` 1`, `1_0` or another script's digits as an integer
    (while `1e3` is refused), so `limit=1.0` answered a page where a body's `1.0` for an integer is `wrong_type`.
    Every integer query or path parameter of every GET route (from the OpenAPI document) refuses them so, naming
    itself, and the document still states its bounds as JSON Schema's `minimum`/`maximum`."""
    c = applied.client
    spec = c.get("/openapi.json").json()
    checked = 0
    for path, methods in spec["paths"].items():
        operation = methods.get("get")
        if operation is None:
            continue
        for param in operation.get("parameters", []):
            schemas = [param["schema"], *param["schema"].get("anyOf", [])]
            if param["in"] not in ("query", "path") or "integer" not in [x.get("type") for x in schemas]:
                continue
            assert not {"ge", "le", "gt", "lt"} & {k for x in schemas for k in x}, (path, param)
            for bad in ("1.0", "+1", "-0", " 1", "1_0", "\u0661"):
                url = re.sub(r"\{[^}]+\}", "1", path.replace("{" + param["name"] + "}", quote(bad)))
                query = {"tenant": A} | ({param["name"]: bad} if param["in"] == "query" else {})
                r = c.get(url, params=query, headers=HA)
                assert_error(r, 422, "wrong_type", param["name"])
            checked += 1
    assert checked >= 10, checked


async def _mcp_forget(applied: Pipeline, arguments: dict[str, Any]) -> Any:
    return await _mcp_tool(applied, "forget", arguments)


async def _mcp_tool(applied: Pipeline, name: str, arguments: dict[str, Any]) -> Any:
    from api.mcp.tools import TOOLS, run_tool

    async with Resources.open(applied.settings, warm_embedder=False) as res:
        return await run_tool({t.name: t for t in TOOLS}[name], res, frozenset({A}), arguments)


def test_class2_3_7_idempotency_by_tenant_and_event_id_at_the_door(applied: Pipeline) -> None:
    settings, c = applied.settings, applied.client
    first = [event("user:1", event_id="E1"), event("user:2", event_id="E2", key="pref.drink", value="tea")]
    r = c.post("/v1/events", json={"events": first}, headers=HA)
    assert r.status_code == 200, r.text
    placed = {x["event_id"]: (x["partition"], x["offset"]) for x in r.json()["results"]}
    assert all(not x["duplicate"] for x in r.json()["results"])
    applied.caught_up(90)

    # retries: the same id again, with the same content or not
    before = end_offsets(settings)
    batch = [
        event("user:1", event_id="E1"),  # a retry: answered from the store
        {**event("user:2", event_id="E2", key="pref.drink", value="tea"), "observed_at": None},  # a retry too
        event("user:1", event_id="E1", value="aisle"),  # the same id, other content
        event("user:9", event_id="E2", key="pref.drink", value="tea"),  # other subject
        {**event("user:2", event_id="E2", key="pref.drink", value="tea"), "type": "memory.confirmed"},
    ]
    r = c.post("/v1/events", json={"events": batch}, headers=HA)
    assert r.status_code == 207, r.text
    res = r.json()["results"]
    assert r.json()["idempotency_checked"] is True
    for i in (0, 1):
        assert res[i]["accepted"] and res[i]["duplicate"], res[i]
        assert (res[i]["partition"], res[i]["offset"]) == placed[res[i]["event_id"]]
    for i in (2, 3, 4):
        assert not res[i]["accepted"], res[i]
        assert res[i]["error"]["code"] == "event_id_conflict" and res[i]["error"]["field"] == f"events.{i}.event_id"
    assert end_offsets(settings) == before, "a retry or a conflict must publish nothing"

    # within one request: the second of two identical events is a duplicate, of two different ones a conflict
    r = c.post(
        "/v1/events",
        json={
            "events": [
                event("user:3", event_id="E3"),
                event("user:3", event_id="E3"),
                event("user:3", event_id="E3", value="x"),
            ]
        },
        headers=HA,
    )
    res = r.json()["results"]
    assert [x["accepted"] for x in res] == [True, True, False] and res[1]["duplicate"]
    assert (res[0]["partition"], res[0]["offset"]) == (res[1]["partition"], res[1]["offset"])
    assert res[2]["error"]["code"] == "event_id_conflict" and "events.0" in res[2]["error"]["message"]
    assert sum(1 for rec in read_topic(settings) if decode(rec.value).event_id == "E3") == 1

    # a retry of what the ledger holds is a duplicate wherever it stands: after another content of its id too (it was
    # refused as a conflict with that one, which the ledger refused, where [stored, other] answered it a duplicate)
    before = end_offsets(settings)
    for batch in ([event("user:1", event_id="E1", value="aisle"), event("user:1", event_id="E1")],
                  [event("user:1", event_id="E1"), event("user:1", event_id="E1", value="aisle")]):  # fmt: skip
        res = c.post("/v1/events", json={"events": batch}, headers=HA).json()["results"]
        stored, other = (res[1], res[0]) if batch[0]["value"] == "aisle" else (res[0], res[1])
        assert stored["accepted"] and stored["duplicate"], res
        assert (stored["partition"], stored["offset"]) == placed["E1"], res
        assert not other["accepted"] and other["error"]["code"] == "event_id_conflict", res
    # an attacker's 999 contents of one stored id, the stored one last: asked of the ledger together, not one by one
    many = [event("user:1", event_id="E1", value=f"v{n}") for n in range(999)] + [event("user:1", event_id="E1")]
    res = c.post("/v1/events", json={"events": many}, headers=HA).json()["results"]
    assert res[-1]["accepted"] and res[-1]["duplicate"] and (res[-1]["partition"], res[-1]["offset"]) == placed["E1"]
    assert {r["error"]["code"] for r in res[:-1]} == {"event_id_conflict"}, res[:3]
    assert end_offsets(settings) == before, "a retry or a conflict must publish nothing"

    # another tenant's ids are its own, and nothing tells it that tenant A has them
    theirs = [event("user:1", tenant=B, event_id="E1", value="aisle"), event("user:2", tenant=B, event_id="E2")]
    r = c.post("/v1/events", json={"events": theirs}, headers=HB)
    assert r.status_code == 200, r.text
    assert [x["duplicate"] for x in r.json()["results"]] == [False, False]
    assert A not in r.text
    applied.caught_up(90)
    fa = c.get("/v1/subjects/user:1/facts", params={"tenant": A}, headers=HA).json()["facts"]
    fb = c.get("/v1/subjects/user:1/facts", params={"tenant": B}, headers=HB).json()["facts"]
    assert [f["value"] for f in fa] == ["window"] and [f["value"] for f in fb] == ["aisle"], (fa, fb)
    r = c.post("/v1/events", json={"events": [event("user:1", tenant=B, event_id="E1", value="window")]}, headers=HB)
    assert r.json()["results"][0]["error"]["code"] == "event_id_conflict"  # against B's own E1 only
    assert A not in r.text and "window seats" not in r.json()["results"][0]["error"]["message"]

    # after an erasure, re-sending a pre-erasure event is answered, not applied again
    r = c.delete("/v1/subjects/user:1", params={"tenant": A}, headers=HA)
    assert r.status_code == 202
    applied.caught_up(90)
    before = end_offsets(settings)
    r = c.post("/v1/events", json={"events": [event("user:1", event_id="E1")]}, headers=HA)
    assert r.status_code == 200, r.text
    [res] = r.json()["results"]
    assert res["accepted"] and res["duplicate"] and res["erased"], res
    assert end_offsets(settings) == before, "an erased event was republished"
    assert c.get("/v1/subjects/user:1/facts", params={"tenant": A}, headers=HA).json()["facts"] == []
    # a genuinely new event about the subject is applied
    r = c.post("/v1/events", json={"events": [event("user:1", event_id="E1-new", value="aisle")]}, headers=HA)
    assert r.status_code == 200 and not r.json()["results"][0]["duplicate"]
    applied.caught_up(90)
    facts = wait_for(
        lambda: c.get("/v1/subjects/user:1/facts", params={"tenant": A}, headers=HA).json()["facts"],
        30,
        0.2,
        "the new fact",
    )
    assert [f["value"] for f in facts] == ["aisle"]


def test_class9_a_float_past_64_bits_reads_back_as_the_float_it_was(applied: Pipeline) -> None:
    """PostgreSQL's jsonb keeps a number as a decimal, so 1e19 came back as the integer 10000000000000000000, which
    the door itself refuses (outside signed 64 bits): a client could not re-send what it read. Each such float reads
    back as itself, and re-sending what was read under the same id is a duplicate, not a conflict."""
    c = applied.client
    floats = [9223372036854775807.0, 1e19, 18446744073709551615.0, -1e19, 1.5e308, 123.25]
    events = [event("user:f", event_id=f"F{i}", key=f"num.k{i}", value=v) for i, v in enumerate(floats)]
    r = c.post("/v1/events", json={"events": events}, headers=HA)
    assert r.status_code == 200, r.text
    applied.caught_up(90)
    facts = {f["key"]: f["value"] for f in c.get("/v1/subjects/user:f/facts", params={"tenant": A}, headers=HA)
             .json()["facts"]}  # fmt: skip
    for i, v in enumerate(floats):
        assert facts[f"num.k{i}"] == v and type(facts[f"num.k{i}"]) is float, (v, facts)
    again = [event("user:f", event_id=f"F{i}", key=f"num.k{i}", value=facts[f"num.k{i}"]) for i in range(len(floats))]
    r = c.post("/v1/events", json={"events": again}, headers=HA)
    assert r.status_code == 200 and all(x["duplicate"] for x in r.json()["results"]), r.text
