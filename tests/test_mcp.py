"""The MCP server (`ledger mcp`, api.mcp) with the SDK's own client, over stdio and Streamable HTTP, on the real stack.

One private ledger for the module: a worker and an indexer (tests.support.pipeline), the MCP server over
Streamable HTTP and the HTTP API as children on free ports, and, per stdio test, `ledger mcp` spawned by the
SDK's stdio client. Keys: one bound to acme, one to globex, one to both.

What is proved, on both transports: every tool is listed with its JSON schema and annotations; each tool
runs and answers what the HTTP route answers (remember -> the door, recall = POST /v1/recall, ...); a bad
argument is a tool error in the API's error shape naming the field, and the server keeps serving; another
tenant's data is never reachable, also with a key bound to two tenants (which must name one per call).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp_types import JSONRPCResponse

from api.mcp import server as mcp_server
from producers.settings import Settings
from tests.conftest import unique
from tests.support import asserted, at, pipeline
from tests.support.servers import ApiServer, McpHttpServer, mcp_stdio, tool_body

KEYS = {"k-acme": ["acme"], "k-globex": ["globex"], "k-both": ["acme", "globex"]}
TRANSPORTS = ["stdio", "http"]
TOOLS = {"remember", "recall", "recall_at", "facts", "fact_history", "forget", "context", "event_status"}
TOOLS |= {"verify_receipt", "replay_receipt"}
# the operator tools (the dead-letter workflow; tests/test_dead_letters.py): listed to every key, run for admins only
TOOLS |= {"dead_letters", "dead_letter", "redrive_dead_letter", "discard_dead_letter"}


def _seed() -> list:
    return [
        asserted(
            "project:P1",
            "project.backend_port",
            8080,
            0,
            content="P1 backend port is 8080",
            aliases=["backend port"],
            entities=["P1"],
        ),
        asserted(
            "project:P1",
            "project.backend_port",
            9090,
            5,
            content="P1 backend port is 9090",
            aliases=["backend port"],
            entities=["P1"],
        ),
        asserted(
            "project:G1",
            "project.backend_port",
            7000,
            0,
            tenant="globex",
            content="G1 backend port is 7000 (globex secret)",
            aliases=["backend port"],
            entities=["G1"],
        ),
    ]


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("mcp"), api_keys=KEYS)
    with pipeline(settings, seed=_seed()) as pipe:
        with McpHttpServer(settings) as server, ApiServer(settings) as api:
            yield {"settings": settings, "pipe": pipe, "mcp_url": server.url, "api_url": api.url, "server": server}


@asynccontextmanager
async def connect(stack: dict[str, Any], transport: str, key: str) -> AsyncIterator[Client]:
    """The SDK's client on `transport`, acting with `key` (stdio: the spawned server's key; http: the bearer)."""
    if transport == "stdio":
        async with Client(mcp_stdio(stack["settings"], key), read_timeout_seconds=120) as client:
            yield client
        return
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        async with Client(streamable_http_client(stack["mcp_url"], http_client=http)) as client:
            yield client


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any], str]:
    """(is_error, structured content, text) of one tool call."""
    r = await client.call_tool(tool, arguments)
    text = r.content[0].text if r.content else ""
    return bool(r.is_error), tool_body(r), text


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _api(stack: dict[str, Any], method: str, path: str, key: str = "k-acme", **kwargs: Any) -> httpx.Response:
    return httpx.request(method, stack["api_url"] + path, headers={"X-API-Key": key}, timeout=60, **kwargs)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_tool_is_listed_with_its_schema_and_annotations(stack: dict[str, Any], transport: str) -> None:
    async def scenario() -> list[Any]:
        async with connect(stack, transport, "k-acme") as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in run(scenario())}
    assert set(tools) == TOOLS
    for t in tools.values():
        assert t.description and "\n" not in t.description, t.name  # one line, for a model
        assert t.input_schema["type"] == "object" and t.input_schema["properties"], t.name
        assert "$ref" not in str(t.input_schema), t.name  # references inlined
        assert "tenant" not in t.input_schema.get("required", []), t.name  # a one-tenant key may leave it out
        a = t.annotations
        assert a is not None and None not in (a.read_only_hint, a.destructive_hint, a.idempotent_hint), t.name
    for name in ("recall", "recall_at", "facts", "fact_history", "context"):
        assert tools[name].annotations.read_only_hint is True
    assert tools["forget"].annotations.destructive_hint is True and tools["forget"].annotations.read_only_hint is False
    assert (
        tools["remember"].annotations.idempotent_hint is True and tools["remember"].annotations.read_only_hint is False
    )
    assert set(tools["remember"].input_schema["required"]) == {"event_id", "subject", "content"}
    assert "as_of" not in tools["recall"].input_schema["properties"]
    assert {"as_of", "known_at"} <= set(tools["recall_at"].input_schema["properties"])
    assert tools["recall"].input_schema["properties"]["top_k"]["maximum"] == 100  # the route's own limits


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_tool_runs_the_code_the_http_routes_run(stack: dict[str, Any], transport: str) -> None:
    pipe = stack["pipe"]
    subject = f"user:{transport}-{uuid.uuid4().hex[:6]}"
    seat = {
        "event_id": f"seat-{subject}",
        "subject": subject,
        "key": "pref.seat",
        "value": "window",
        "content": f"{subject} prefers window seats",
        "aliases": ["seat"],
        "source": {"type": "explicit", "service": "chat", "ref": "msg-1"},
        "valid_from": "2026-03-01T00:00:00Z",
    }

    async def scenario() -> None:
        async with connect(stack, transport, "k-acme") as client:
            error, first, _ = await call(client, "remember", seat)
            assert not error and first["duplicate"] is False and first["partition"] is not None, first
            error, again, _ = await call(client, "remember", seat)  # a retry: answered from the ledger or the SDK
            assert not error and again["event_id"] == first["event_id"] and again["memory_id"] == first["memory_id"]
            error, conflict, _ = await call(client, "remember", {**seat, "value": "aisle"})
            assert error and conflict["detail"][0] == {**conflict["detail"][0], "code": "event_id_conflict"}
            assert conflict["detail"][0]["field"] == "event_id" and conflict["status"] == 422
            episode = {"event_id": f"ep-{subject}", "subject": subject, "kind": "episodic", "content": "flew to Oslo"}
            error, ep, _ = await call(client, "remember", episode)
            assert not error and ep["version_id"], ep
            await asyncio.to_thread(pipe.settle)

            error, hits, _ = await call(client, "recall", {"query": f"which seat does {subject} prefer?"})
            assert not error and hits["hits"][0]["memory_id"] == first["memory_id"], hits
            routed = _api(
                stack, "POST", "/v1/recall", json={"tenant": "acme", "query": f"which seat does {subject} prefer?"}
            )
            assert [(h["version_id"], h["match"]["stage"]) for h in hits["hits"]] == [
                (h["version_id"], h["match"]["stage"]) for h in routed.json()["hits"]
            ]

            before = {"query": "P1 backend port", "as_of": at(2).isoformat()}
            error, past, _ = await call(client, "recall_at", before)
            assert not error and past["hits"][0]["value"] == 8080, past
            error, now, _ = await call(client, "recall_at", {**before, "as_of": at(30).isoformat()})
            assert not error and now["hits"][0]["value"] == 9090
            known = {**before, "as_of": at(30).isoformat(), "known_at": at(1).isoformat()}
            error, then, _ = await call(client, "recall_at", known)  # the 9090 update was not observed by day 1
            assert not error and then["hits"][0]["value"] == 8080 and then["trace"]["known_at"], then
            routed = _api(stack, "POST", "/v1/recall", json={"tenant": "acme", **known})
            assert [h["value"] for h in routed.json()["hits"]] == [h["value"] for h in then["hits"]]

            error, facts, _ = await call(client, "facts", {"subject": subject})
            assert not error and {f["key"] for f in facts["facts"]} == {"pref.seat", None}
            # the tool answers a page (100 unless told): the route asked for the same page answers the same
            assert facts["page"] == {"offset": 0, "limit": 100, "total": 2, "next_offset": None}, facts["page"]
            params = {"tenant": "acme", "as_of": facts["as_of"], "limit": 100}
            # the session waited for its own remember (api.mcp.tools.SessionTokens): said so, the rest alike
            assert facts.pop("consistency")["stage"] == "projection"
            routed = _api(stack, "GET", f"/v1/subjects/{subject}/facts", params=params).json()
            # each answer has its own receipt (issued then, signed), of the same answer
            assert routed.pop("receipt")["answer_digest"] == facts.pop("receipt")["answer_digest"]
            assert routed == facts
            error, chain, _ = await call(client, "fact_history", {"memory_id": first["memory_id"]})
            assert not error and [v["value"] for v in chain["versions"]] == ["window"]
            url = f"/v1/facts/{first['memory_id']}/history"
            assert chain.pop("consistency")["stage"] == "projection"
            routed = _api(stack, "GET", url, params={"tenant": "acme", "limit": 100}).json()
            assert routed.pop("receipt")["answer_digest"] == chain.pop("receipt")["answer_digest"]
            assert routed == chain

            ask = {"subject": subject, "question": "which seat?", "as_of": "2026-06-01T00:00:00Z"}
            error, block, text = await call(client, "context", ask)
            assert not error and text.startswith("<<<LEDGER MEMORY ") and '"pref.seat" = "window"' in text
            assert text == block["text"]
            routed = _api(stack, "POST", "/v1/context", json={"tenant": "acme", **ask})
            assert routed.text == text  # byte for byte the route's block

            error, gone, _ = await call(client, "forget", {"subject": subject, "key": "pref.seat", "reason": "moved"})
            assert not error and gone["action"] == "retract" and gone["effect"] == "pending" and gone["event_id"], gone
            await asyncio.to_thread(pipe.settle)
            error, facts, _ = await call(client, "facts", {"subject": subject})
            assert not error and [f["key"] for f in facts["facts"]] == [None]  # the episode stays
            erase = {"subject": subject, "erase_subject": True, "event_id": f"erase-{subject}"}
            error, erased, _ = await call(client, "forget", erase)
            assert not error and erased["action"] == "erase" and erased["type"] == "subject.erased", erased
            await asyncio.to_thread(pipe.settle)
            error, facts, _ = await call(client, "facts", {"subject": subject})
            assert not error and facts["facts"] == []
            error, again, _ = await call(client, "forget", erase)  # a retry, once it is applied: says so
            assert not error and again["duplicate"] is True and again["effect"] == "applied", again
            assert (again["partition"], again["offset"]) == (erased["partition"], erased["offset"]), again

    run(scenario())


BAD = [
    ("recall", {"query": "x", "top_k": 0}, "top_k", "invalid_value"),
    ("recall", {"tenant": "", "query": "x"}, "tenant", "invalid_value"),  # validated before tenancy, as HTTP does
    ("recall", {"top_k": 3}, "query", "missing_field"),
    ("recall", {"query": "   "}, "query", "invalid_value"),
    ("recall", {"query": "x", "as_of": "2026-01-01T00:00:00Z"}, "as_of", "unknown_field"),
    ("recall", {"query": "x", "filters": {"kind": "gossip"}}, "filters.kind", "invalid_value"),
    ("recall_at", {"query": "x", "as_of": 1700000000}, "as_of", "invalid_time"),
    ("recall_at", {"query": "x"}, "as_of", "missing_field"),
    ("facts", {"subject": "a\u0000b"}, "subject", "unstorable_text"),
    ("facts", {"subject": "s", "known_at": "yesterday"}, "known_at", "invalid_time"),
    ("fact_history", {"memory_id": "no-such-fact"}, "memory_id", "not_found"),
    ("remember", {"subject": "s", "content": "c", "key": "k"}, "event_id", "missing_field"),
    ("remember", {"event_id": "e1", "subject": "s", "content": "c"}, "key", "missing_field"),
    (
        "remember",
        {"event_id": "e2", "subject": "s", "key": "k", "content": "c", "value": {"x": "\u0000"}},
        "value.x",
        "unstorable_text",
    ),
    (
        "remember",
        {"event_id": "e3", "subject": "s", "key": "k", "content": "c", "type": "subject.erased"},
        "type",
        "unknown_field",
    ),
    (
        "remember",
        {"event_id": "e4", "subject": "s", "key": "k", "content": "c", "valid_from": "2026-01-01"},
        "valid_from",
        "invalid_time",
    ),
    ("forget", {"subject": "s"}, "key", "missing_field"),
    ("forget", {"subject": "s", "key": "k", "erase_subject": True}, "key", "invalid_value"),
    ("forget", {"subject": "s", "key": "k", "literal": True}, "literal", "invalid_value"),  # never ignored
    ("context", {"subject": "s", "budget_tokens": 10}, "budget_tokens", "invalid_value"),
    ("context", {"subject": "s", "format": "xml"}, "format", "unknown_value"),
    # too large only once encoded as one event, each field within its own limit: the event as a whole
    (
        "remember",
        {
            "event_id": "e5",
            "subject": "s",
            "key": "k",
            "content": "c",
            "value": {f"f{i}": "v" * 10_000 for i in range(30)},
        },
        "arguments",
        "too_large",
    ),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_bad_argument_is_a_tool_error_naming_the_field(stack: dict[str, Any], transport: str) -> None:
    async def scenario() -> list[tuple[str, Any]]:
        wrong = []
        async with connect(stack, transport, "k-acme") as client:
            for tool, arguments, field, code in BAD:
                error, body, text = await call(client, tool, arguments)
                item = (body.get("detail") or [{}])[0]
                if not (error and item.get("field") == field and item.get("code") == code and field in text):
                    wrong.append((tool, arguments, body))
                assert body.get("status") in (404, 422), body
            error, body, _ = await call(client, "recall", {"query": "P1 backend port"})  # still serving
            assert not error and body["hits"], body
        return wrong

    assert run(scenario()) == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_another_tenants_data_is_never_reachable(stack: dict[str, Any], transport: str) -> None:
    async def scenario() -> None:
        async with connect(stack, transport, "k-globex") as client:
            error, body, _ = await call(client, "recall", {"query": "P1 backend port"})  # the key's own tenant
            assert not error and all(h["subject"] == "project:G1" for h in body["hits"]), body
            for tool, arguments in (
                ("recall", {"tenant": "acme", "query": "P1 backend port"}),
                ("recall_at", {"tenant": "acme", "query": "P1 backend port", "as_of": at(2).isoformat()}),
                ("facts", {"tenant": "acme", "subject": "project:P1"}),
                ("context", {"tenant": "acme", "subject": "project:P1", "question": "backend port"}),
                ("remember", {"tenant": "acme", "event_id": "x1", "subject": "s", "key": "k", "content": "c"}),
                ("forget", {"tenant": "acme", "subject": "project:P1", "erase_subject": True}),
            ):
                error, body, _ = await call(client, tool, arguments)
                assert error and body["status"] == 403, (tool, body)
                assert body["detail"][0] == {**body["detail"][0], "code": "forbidden_tenant", "field": "tenant"}
            error, facts, _ = await call(client, "facts", {"subject": "project:P1"})  # globex has no such subject
            assert not error and facts["facts"] == []
        async with connect(stack, transport, "k-both") as client:
            error, body, _ = await call(client, "recall", {"query": "backend port"})
            assert error and body["detail"][0]["code"] == "missing_field" and body["detail"][0]["field"] == "tenant"
            error, body, _ = await call(client, "recall", {"tenant": "globex", "query": "backend port"})
            assert not error and body["hits"] and all("globex" in h["content"] for h in body["hits"]), body
            error, body, _ = await call(client, "recall", {"tenant": "acme", "query": "backend port"})
            assert not error and body["hits"] and not any("globex" in h["content"] for h in body["hits"]), body

    run(scenario())
    assert not _api(stack, "POST", "/v1/recall", key="k-globex", json={"tenant": "acme", "query": "x"}).is_success


# every way a caller can fail to present a known key: missing, wrong, malformed
REFUSED_AUTH: list[tuple[dict[str, str], str]] = [
    ({}, "missing"),
    ({"X-API-Key": "k-acme"}, "missing"),  # the HTTP API's other header: the MCP endpoint reads Authorization only
    ({"Authorization": ""}, "missing"),
    ({"Authorization": "Bearer nope"}, "unknown"),
    ({"Authorization": "bearer nope"}, "unknown"),
    ({"Authorization": "Bearer dev-key"}, "unknown"),  # a key of another deployment
    ({"Authorization": "Bearer k-acme-and-more"}, "unknown"),
    ({"Authorization": "Bearer"}, "malformed"),
    ({"Authorization": "Basic ay1hY21lOg=="}, "malformed"),
    ({"Authorization": "k-acme"}, "malformed"),  # a bare key
    ({"Authorization": "Token k-acme"}, "malformed"),
]
SAYS = {"missing": "missing API key", "unknown": "unknown API key", "malformed": "Bearer <API key>"}
# where an MCP client looks for an OAuth authorization server after a 401 (RFC 9728, RFC 8414, the SDKs' fallbacks)
OAUTH_DISCOVERY = [
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
    "/register",
    "/authorize",
    "/token",
]


def test_http_refuses_a_missing_wrong_or_malformed_bearer_as_the_api_does(stack: dict[str, Any]) -> None:
    """A 401 in the API's one error shape (code unauthorized, field Authorization, a message saying what is wrong),
    on every method, with the HTTP API's bare `Bearer` challenge: no OAuth error, scope or resource metadata that
    would send an MCP client into a login, and no authorization server to discover."""
    from api.schemas import ErrorBody

    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    api = _api(stack, "GET", "/v1/tenants", key="nope")
    assert api.status_code == 401 and api.headers["www-authenticate"] == "Bearer", api.headers
    wrong = []
    for auth, kind in REFUSED_AUTH:
        for method in ("POST", "GET", "DELETE"):
            body = {"json": ping} if method == "POST" else {}
            r = httpx.request(method, stack["mcp_url"], headers={**headers, **auth}, timeout=30, **body)
            shape = r.json() if r.headers.get("content-type") == "application/json" else None
            item = (shape or {"detail": [{}]})["detail"][0]
            if not (
                r.status_code == 401
                and ErrorBody.model_validate(shape).model_dump() == shape
                and (item["code"], item["field"]) == ("unauthorized", "Authorization")
                and SAYS[kind] in item["message"]
                and r.headers.get_list("www-authenticate") == [api.headers["www-authenticate"]]
            ):
                wrong.append((auth, method, r.status_code, dict(r.headers), r.text[:300]))
    assert wrong == []
    base = stack["mcp_url"].removesuffix("/mcp")
    found = {path: httpx.get(base + path, timeout=30).status_code for path in OAUTH_DISCOVERY}
    assert set(found.values()) == {404}, found
    stack["server"].check()


def test_the_transports_own_refusals_are_in_the_one_error_shape(stack: dict[str, Any]) -> None:
    """What the SDK's transport refuses before any tool runs (a content type it does not read, a body over its
    limit) comes in the API's one error shape, not as plain text; its JSON-RPC errors stay JSON-RPC."""
    from api.schemas import ErrorBody

    auth = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    ping = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    over = b" " * (5 * 1024 * 1024) + ping

    def chunked() -> Iterator[bytes]:  # no Content-Length: read to the limit, never further
        for start in range(0, len(over), 64 * 1024):
            yield over[start : start + 64 * 1024]

    json_type = {"content-type": "application/json"}
    no_id = b'{"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": {"name": "nope", "arguments": {}}}'
    for headers, content, status, code, field in (
        ({"content-type": "text/plain"}, ping, 400, "bad_request", None),
        (json_type, over, 413, "too_large", "body"),
        (json_type, chunked(), 413, "too_large", "body"),
        ({**json_type, "origin": "http://evil.example.com"}, ping, 403, "forbidden", "Origin"),
        ({**json_type, "origin": "http://evil.example.com"}, no_id, 403, "forbidden", "Origin"),  # before judging
        ({"content-type": "text/plain"}, no_id, 400, "bad_request", None),
        ({**json_type, "host": "evil.example.com"}, ping, 421, "bad_request", "Host"),
    ):
        r = httpx.post(stack["mcp_url"], headers={**auth, **headers}, content=content, timeout=60)
        assert r.status_code == status and r.headers["content-type"] == "application/json", (r.status_code, r.text)
        shape = r.json()
        assert ErrorBody.model_validate(shape).model_dump() == shape, shape
        assert (shape["detail"][0]["code"], shape["detail"][0]["field"]) == (code, field), shape
        assert shape["detail"][0]["message"], shape
    r = httpx.post(stack["mcp_url"], headers={**auth, "content-type": "application/json"}, content=b"{", timeout=60)
    assert r.json()["error"]["code"] == -32700, r.text  # not JSON: the protocol's own parse error


def test_a_lone_surrogate_in_any_argument_is_a_tool_error_naming_it(stack: dict[str, Any]) -> None:
    """JSON may escape a lone surrogate (a JavaScript string cut inside an emoji); the SDK's parser refuses the whole
    message as a parse error, so such a tool call gets the tool error any bad argument gets: 422 unstorable_text
    naming the argument, as the HTTP API names the field. A surrogate pair is text like any other."""
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    headers["content-type"] = "application/json"
    for tool, arguments, field in (
        ("facts", b'{"subject": "user:\\ud800x"}', "subject"),
        ("recall", b'{"query": "caf\\udce9", "top_k": 3}', "query"),
        ("remember", b'{"event_id": "e1", "subject": "u", "content": "c", "value": {"a": ["\\udbff"]}}', "value"),
        ("recall", b'{"\\ud800": 1, "query": "q"}', "arguments"),
    ):
        call = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
        r = httpx.post(stack["mcp_url"], headers=headers, content=call % (tool.encode(), arguments), timeout=60)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["id"] == 7 and answer["result"]["isError"], answer
        body = orjson.loads(answer["result"]["content"][0]["text"])
        assert body["status"] == 422 and body["detail"][0]["code"] == "unstorable_text", body
        assert body["detail"][0]["field"] == field, body
    pair = b'{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "recall", "arguments": '
    pair += b'{"query": "tea \\ud83d\\ude00"}}}'
    r = httpx.post(stack["mcp_url"], headers=headers, content=pair, timeout=60)
    assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text


def test_a_call_of_no_tool_or_with_arguments_that_are_no_object_is_a_tool_error_in_the_one_shape(
    stack: dict[str, Any],
) -> None:
    """The SDK answers a tool name nobody has in plain text, arguments that are no object with a JSON-RPC error, and
    arguments nested past its parser's depth with a parse error of valid JSON; over HTTP each is the tool error of
    the API's one shape, naming what is wrong, like any bad call, however the method's name is escaped. A
    notification (no id) is answered nothing, as any notification."""
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    headers["content-type"] = "application/json"
    deep = {n: b"[" * n + b"1" + b"]" * n for n in (150, 1000)}
    too_deep = ".".join(["value"] + ["0"] * 32)
    for name, arguments, status, code, field in (
        (b'"nope"', b"{}", 404, "not_found", "name"),
        (b'"recall"', b'["q"]', 422, "not_an_object", "arguments"),
        (b'"recall"', b'"q"', 422, "not_an_object", "arguments"),
        (b'"nope"', b'["q"]', 404, "not_found", "name"),
        (b"null", b"{}", 422, "missing_field", "name"),
        (b"5", b"{}", 422, "wrong_type", "name"),
        *(
            (b'"remember"', b'{"subject": "u", "key": "k", "content": "c", "value": %s}' % v, 422, "too_deep", too_deep)
            for v in deep.values()
        ),
    ):
        for method in (b'"tools/call"', b'"tools\\/call"', b'"tools\\u002fcall"'):
            params = b'"params": {"name": %s, "arguments": %s}' % (name, arguments)
            call = b'{"jsonrpc": "2.0", "id": 9, "method": %s, %s}' % (method, params)
            r = httpx.post(stack["mcp_url"], headers=headers, content=call, timeout=60)
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["id"] == 9 and answer["result"]["isError"], answer
            body = orjson.loads(answer["result"]["content"][0]["text"])
            got = (body["status"], body["detail"][0]["code"], body["detail"][0]["field"])
            assert got == (status, code, field), (method, body)
            notified = b'{"jsonrpc": "2.0", "method": %s, %s}' % (method, params)
            r = httpx.post(stack["mcp_url"], headers=headers, content=notified, timeout=60)
            assert (r.status_code, r.content) == (202, b""), (method, name, r.status_code, r.text[:300])


def test_a_number_that_reads_as_zero_is_refused_by_remember_as_by_the_http_api(stack: dict[str, Any]) -> None:
    """The SDK's parser reads 1e-400 as 0.0 before a tool sees it; the HTTP API refuses the literal by name
    (`number_out_of_range`), and so does `remember`, at any depth of its value. A small number that is one stays."""
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    headers["content-type"] = "application/json"
    for n, (value, refused) in enumerate(
        (
            (b"1e-400", "value"),
            (b"-2.5E-0400", "value"),
            (b'{"a": [1, 1e-400]}', "value.a.1"),
            (b"0." + b"0" * 400 + b"1", "value"),
            (b"1e-300", None),
        )
    ):
        arguments = b'{"event_id": "tiny-%d", "subject": "user:tiny", "key": "k%d", "content": "c", "value": %s}'
        call = b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "remember", "arguments": %s}}'
        r = httpx.post(stack["mcp_url"], headers=headers, content=call % (arguments % (n, n, value)), timeout=60)
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        if refused is None:
            assert not result.get("isError"), result
            continue
        body = orjson.loads(result["content"][0]["text"])
        got = (body["status"], body["detail"][0]["code"], body["detail"][0]["field"])
        assert got == (422, "number_out_of_range", refused), body
    # a re-drive's event is its `event` argument, named so; its other arguments are no event's, judged by the tool
    for arguments, refused in (
        (b'{"partition": 0, "offset": 0, "event": {"subject": "u", "value": [1e-400]}}', "event.value.0"),
        (b'{"partition": 1e-400, "offset": 0, "event": {"subject": "u"}}', None),
    ):
        call = b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "redrive_dead_letter", '
        r = httpx.post(stack["mcp_url"], headers=headers, content=call + b'"arguments": %s}}' % arguments, timeout=60)
        body = orjson.loads(r.json()["result"]["content"][0]["text"])
        item = body["detail"][0]
        if refused is None:
            assert item["code"] != "number_out_of_range", body
        else:
            assert (body["status"], item["code"], item["field"]) == (422, "number_out_of_range", refused), body


def test_a_receipt_naming_a_member_twice_is_refused_at_both_doors(stack: dict[str, Any]) -> None:
    """Parsers differ on a name given twice in one object (orjson keeps the last, others the first): a receipt with a
    second `answer_digest` verified here as `valid` while its holder's parser could read the other one. Both doors
    refuse such a body, wherever the name repeats (the envelope, the receipt, a cited event, the answer), naming it;
    the same receipt spelled otherwise but once (an escaped name) still verifies."""
    headers = {"authorization": "Bearer k-acme", "x-api-key": "k-acme", "content-type": "application/json"}
    facts = httpx.get(f"{stack['api_url']}/v1/subjects/project:P1/facts", params={"tenant": "acme"}, headers=headers)
    assert facts.status_code == 200, facts.text
    answer = facts.json()
    receipt = answer.pop("receipt")
    assert receipt["cited"], receipt
    body = orjson.dumps({"tenant": "acme", "receipt": receipt, "answer": answer})
    asked = orjson.dumps({"tenant": "acme", "receipt": receipt, "request": {"subject": "project:P1"}})
    zeros = b'"' + b"0" * 64 + b'"'

    def doubled(raw: bytes, name: bytes, value: bytes, first: bytes = zeros) -> bytes:
        out = raw.replace(b'"%s":%s' % (name, value), b'"%s":%s,"%s":%s' % (name, first, name, value), 1)
        assert out != raw, name
        return out

    def twice(raw: bytes) -> dict[str, bytes]:
        return {
            "answer_digest": doubled(raw, b"answer_digest", orjson.dumps(receipt["answer_digest"])),
            "tenant": doubled(raw, b"tenant", b'"acme"', b'"globex"'),
            "digest": doubled(raw, b"digest", orjson.dumps(receipt["cited"][0]["digest"])),
            "subject": doubled(raw, b"subject", b'"project:P1"', b'"x"'),
            "signature": doubled(raw, b"signature", orjson.dumps(receipt["signature"]), b'"AAAA"'),
            # the repeated name spelled otherwise: a parser reads the escape as the letter
            "answer": doubled(raw, b"answer", b'"facts"', b'"recall"').replace(b'"answer":"r', b'"\\u0061nswer":"r'),
        }

    call = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
    mcp_headers = {**headers, "accept": "application/json, text/event-stream"}
    for path, raw in (("verify", body), ("replay", asked)):
        for name, hostile in twice(raw).items():
            r = httpx.post(f"{stack['api_url']}/v1/receipts/{path}", headers=headers, content=hostile, timeout=60)
            item = r.json()["detail"][0]
            assert (r.status_code, item["code"], item["field"]) == (422, "invalid_value", "body"), (name, r.text)
            assert repr(name) in item["message"], (name, item)
            tool = b"verify_receipt" if path == "verify" else b"replay_receipt"
            r = httpx.post(stack["mcp_url"], headers=mcp_headers, content=call % (tool, hostile), timeout=60)
            result = orjson.loads(r.json()["result"]["content"][0]["text"])
            item = result["detail"][0]
            assert (result["status"], item["code"], item["field"]) == (422, "invalid_value", "arguments"), result
    escaped = body.replace(b'"answer_digest":', b'"\\u0061nswer_digest":')  # one name, spelled otherwise
    verified = []
    for raw in (body, escaped):
        r = httpx.post(f"{stack['api_url']}/v1/receipts/verify", headers=headers, content=raw, timeout=60)
        assert r.status_code == 200 and r.json()["answer"] is True, r.text
        verified.append(r.json())
        r = httpx.post(stack["mcp_url"], headers=mcp_headers, content=call % (b"verify_receipt", raw), timeout=60)
        verified.append(r.json()["result"]["structuredContent"])
    assert all(v == verified[0] for v in verified), verified
    r = httpx.post(f"{stack['api_url']}/v1/receipts/replay", headers=headers, content=asked, timeout=60)
    assert r.status_code == 200 and r.json()["same"] is True, r.text


# tool calls the SDK would answer in its own words, or run with what its parser made of them (tests above)
_REFUSED_CALLS = {
    "tiny number": ("remember", b'{"subject": "user:s", "key": "k", "content": "c", "value": [1, 1e-400]}'),
    "unknown tool": ("no_such_tool", b"{}"),
    "arguments not an object": ("recall", b"[1]"),
    "lone surrogate": ("recall", b'{"tenant": "acme", "query": "\\ud800"}'),
    "nested past the parser": ("remember", b'{"subject": "u", "value": ' + b"[" * 120 + b"]" * 120 + b"}"),
    "repeated name": ("verify_receipt", b'{"tenant": "acme", "tenant": "acme", "receipt": {}}'),
}


# the per-request envelope of the protocol version that needs no initialize (the SDK's own client sends it)
_ENVELOPE = (
    b', "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", '
    b'"io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}, '
    b'"io.modelcontextprotocol/clientCapabilities": {}}'
)


def _stdio_exchange(params: Any, sent: bytes, last: int) -> tuple[list[dict[str, Any]], bytes]:
    """`ledger mcp` over stdio given the lines `sent`: its answers, up to the one with id `last`, and its stderr.
    stdin stays open until that answer came (a client that closes it leaves calls in flight unanswered)."""
    import subprocess
    import tempfile
    import threading

    with tempfile.TemporaryFile() as errors:
        server = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)  # fmt: skip
        assert server.stdin is not None and server.stdout is not None
        stdin = server.stdin

        def write() -> None:  # meanwhile the answers are read: neither pipe fills
            with contextlib.suppress(BrokenPipeError):
                stdin.write(sent)
                stdin.flush()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            said: list[dict[str, Any]] = []
            while not said or said[-1].get("id") != last:
                line = server.stdout.readline()
                assert line, said
                said.append(orjson.loads(line))
            writer.join(timeout=120)
            stdin.close()
            assert server.wait(timeout=120) == 0
        finally:
            server.kill()
        errors.seek(0)
        return said, errors.read()


@pytest.mark.parametrize("handshake", ["initialize", "envelope"])
def test_stdio_refuses_what_the_http_door_refuses_in_the_same_words(stack: dict[str, Any], handshake: str) -> None:
    """The SDK's stdio transport parsed each line before any tool saw it, so what the HTTP door refuses in the one
    error shape was, over stdio, answered in the SDK's words ("Unknown tool: ...") or run as its parser read it (a
    `remember` of 1e-400 stored 0). Each call gets the same answer at both doors, and the session goes on: after an
    initialize, or with the protocol's per-request envelope and no initialize at all (the lines went unjudged until a
    `notifications/initialized` that such a client never sends)."""

    envelope = _ENVELOPE if handshake == "envelope" else b""
    call = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "%s", "arguments": %s'
    call += envelope + b"}}"
    lines = [call % (n, name.encode(), arguments) for n, (name, arguments) in enumerate(_REFUSED_CALLS.values())]
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    over_http = []
    for line in lines:
        r = httpx.post(stack["mcp_url"], headers={**headers, "content-type": "application/json"}, content=line)
        assert r.status_code == 200, r.text
        over_http.append(r.json()["result"])
    params = mcp_stdio(stack["settings"], "k-acme")
    if handshake == "initialize":
        hello = (
            b'{"jsonrpc": "2.0", "id": 100, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
            b'"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}\n'
            b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
        )
        early = call % (200, b"no_such_tool", b"{}") + b"\n"  # before initialize: the SDK's answer, as ever
    else:
        hello = b'{"jsonrpc": "2.0", "id": 100, "method": "server/discover", "params": {' + envelope[2:] + b"}}\n"
        early = b""
    # ids no JSON-RPC answer carries: each a JSON-RPC error naming none, and the server reads on
    odd = b"".join(call.replace(b"%d", id_) % (b"no_such_tool", b"{}") + b"\n" for id_ in (b"null", b"true", b"1.5"))
    after = b'{"jsonrpc": "2.0", "id": 101, "method": "tools/list", "params": {' + envelope[2:] + b"}}\n"
    said, _ = _stdio_exchange(params, early + hello + b"\n".join(lines) + b"\n" + odd + after, 101)
    answers = {m.get("id"): m for m in said}
    for n, (what, result) in enumerate(zip(_REFUSED_CALLS, over_http, strict=True)):
        assert result.get("isError") and set(result) == {"content", "isError"}, (what, result)  # as a tool's own
        assert answers[n]["result"] == result, (what, answers[n], result)
    if early:
        assert "error" in answers[200] and "result" not in answers[200], answers[200]
    no_id = [m["error"]["code"] for m in said if m.get("id") is None]
    assert no_id == [-32600] * 3, said
    assert len(answers[101]["result"]["tools"]) == len(TOOLS)


def test_a_request_whose_id_is_no_text_or_integer_gets_an_error_and_runs_nothing(stack: dict[str, Any]) -> None:
    """A request with an id of null, true, 1.5 or an object was taken for a notification: answered 202 and nothing,
    so a client waited for ever (a `remember` among them was never published). Each gets the JSON-RPC error -32600
    (id null), and nothing runs."""
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    headers["content-type"] = "application/json"
    for n, id_ in enumerate((None, True, 1.5, {"x": 1})):
        event_id = unique("odd-id")
        arguments = {"event_id": event_id, "subject": f"user:odd{n}", "key": "k", "value": n, "content": "odd id"}
        body = {
            "jsonrpc": "2.0",
            "id": id_,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": arguments},
        }
        r = httpx.post(stack["mcp_url"], headers=headers, content=orjson.dumps(body), timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600 and r.json()["id"] is None, (id_, r.text)
        status = _api(stack, "GET", f"/v1/events/{event_id}", params={"tenant": "acme"})
        assert status.status_code == 200 and status.json()["status"] == "unknown", (id_, status.text)


# lines that are no JSON-RPC message: the HTTP transport answers each with a JSON-RPC error (id null)
_NO_MESSAGE = {
    "invalid UTF-8 in a value": b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "remember", '
    b'"arguments": {"subject": "user:u", "key": "k", "content": "c", "value": "ab\xff\xfecd"}}}',
    "not JSON": b"not json",
    "nested past the parser": b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": ' + b"[" * 1100 + b"]" * 1100
    + b"}",
    "a batch": b'[{"jsonrpc": "2.0", "id": 9, "method": "ping"}]',
}  # fmt: skip


def test_stdio_answers_a_line_that_is_no_message_as_http_answers_that_body(stack: dict[str, Any]) -> None:
    """The SDK's stdio replaced invalid UTF-8 (a `remember` stored U+FFFD where its caller sent other bytes, which
    both HTTP doors refuse) and answered no line that was no message at all, nor a JSON "\r" inside one (read as a
    line break), so a caller waited forever. Each is now answered as the Streamable HTTP transport answers it."""

    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    over_http = []
    for line in _NO_MESSAGE.values():
        r = httpx.post(stack["mcp_url"], headers={**headers, "content-type": "application/json"}, content=line)
        over_http.append(r.json())
    params = mcp_stdio(stack["settings"], "k-acme")
    hello = (
        b'{"jsonrpc": "2.0", "id": 100, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
        b'"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}\n'
        b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
    )
    spaced = b'{"jsonrpc": "2.0", "id": 101,\r"method": "tools/call", "params": {"name": "nope", "arguments": {}}}\n'
    answers, stderr = _stdio_exchange(params, hello + b"\n".join(_NO_MESSAGE.values()) + b"\n" + spaced, 101)
    assert b"Traceback" not in stderr, stderr[-2000:]
    errors = [a for a in answers if a.get("id") is None]
    for what, http, stdio in zip(_NO_MESSAGE, over_http, errors, strict=True):
        assert http["id"] is None and stdio["error"] == http["error"], (what, stdio, http)
    assert next(a for a in answers if a.get("id") == 101)["result"]["isError"]  # a "\r" is JSON whitespace


def test_stdio_drops_a_line_longer_than_the_http_body_limit_and_reads_on(stack: dict[str, Any]) -> None:
    """A line had no bound: the stdio door held it whole, however long, where the HTTP door reads 4 MiB of a body. A
    longer line is answered as no message and dropped; one of exactly the limit is read, and so is the next."""

    from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE as limit

    params = mcp_stdio(stack["settings"], "k-acme")
    hello = (
        b'{"jsonrpc": "2.0", "id": 100, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
        b'"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}\n'
        b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
    )
    ping = b'{"jsonrpc": "2.0", "id": %d, "method": "ping"' % 1
    at_limit = ping + b" " * (limit - len(ping) - 1) + b"}"
    over = b'{"jsonrpc": "2.0", "id": 2, "method": "ping"' + b" " * limit + b"}"
    last = b'{"jsonrpc": "2.0", "id": 3, "method": "ping"}'
    answers, stderr = _stdio_exchange(params, hello + b"\n".join((at_limit, over, last)) + b"\n", 3)
    assert b"Traceback" not in stderr, stderr[-2000:]
    assert [a.get("id") for a in answers] == [100, 1, None, 3], answers
    assert answers[1]["result"] == {} and answers[3]["result"] == {}
    assert f"{limit:,} bytes" in answers[2]["error"]["message"] and answers[2]["error"]["code"] == -32600


def test_stdio_refuses_to_start_without_a_known_key(stack: dict[str, Any]) -> None:
    import subprocess

    params = mcp_stdio(stack["settings"], "nope")
    done = subprocess.run(
        [params.command, *params.args], env=params.env, cwd=params.cwd, capture_output=True, timeout=120, input=b""
    )
    assert done.returncode == 2 and b"unknown API key" in done.stderr, done.stderr[-2000:]
    assert b"LEDGER_MCP_API_KEY" in done.stderr and b"X-API-Key" not in done.stderr  # no header: the process's key
    assert done.stdout == b""  # stdout is the protocol: nothing else is ever written there


def test_infra_runs_the_mcp_service_beside_the_api(stack: dict[str, Any], tmp_path: Any) -> None:
    """`python -m infra up --service` starts the `mcp` part like the API: spawned by name, healthy over HTTP, stopped
    by its pid file (here on a private data dir and port, so the shared stack's pid files are never touched)."""
    from infra import service
    from infra import stack as infra_stack
    from tests.support.servers import free_port

    assert "mcp" in infra_stack.SERVICE_ORDER and infra_stack.SERVICE_ORDER.index(
        "mcp"
    ) > infra_stack.SERVICE_ORDER.index("api")
    base: Settings = stack["settings"]
    s = base.model_copy(update={"data_dir": tmp_path, "embed_model_dir": base.model_dir, "mcp_port": free_port()})
    try:
        service.start(s, "mcp", timeout=120)
        assert service.healthy(s, "mcp") and service.pid(s, "mcp") is not None
        assert service.describe(s, "mcp")["address"] == f"http://127.0.0.1:{s.mcp_port}/mcp"
    finally:
        assert service.stop(s, "mcp") or service.pid(s, "mcp") is None
    assert service.pid(s, "mcp") is None


_WIRE_RESULTS = [
    {"content": [{"type": "text", "text": '{"v":"东京 \\"q\\"\\n"}'}], "structuredContent": {"v": '东京 "q"\n'}},
    {"structuredContent": {"n": 1.5e-7, "big": 10**30, "whole": 400.0, "none": None, "deep": [[[{"a": []}]]]}},
    {"structuredContent": {"s": "\x00\u2028\ud7ff😀", "i": -(2**63)}},
]


@pytest.mark.parametrize("result", _WIRE_RESULTS, ids=["text-and-structured", "numbers", "odd-characters"])
def test_the_servers_json_response_says_what_the_sdks_would(result: dict[str, Any]) -> None:
    """The MCP server writes its JSON responses with orjson (api.mcp.server); the bytes must mean what the SDK's own
    `model_dump_json` means, with the SDK's headers, integers past 64 bits included."""
    assert StreamableHTTPServerTransport._create_json_response is mcp_server._json_response  # the server's, in effect
    message = JSONRPCResponse(jsonrpc="2.0", id=7, result=result)
    response = mcp_server._json_response(SimpleNamespace(mcp_session_id="s-1"), message)  # type: ignore[arg-type]
    assert json.loads(response.body) == json.loads(message.model_dump_json(by_alias=True, exclude_unset=True))
    assert response.headers["content-type"] == "application/json"
    assert response.headers["mcp-session-id"] == "s-1"
    assert int(response.headers["content-length"]) == len(response.body)


def test_a_body_sent_with_a_content_encoding_is_refused_as_the_api_refuses_it(stack: dict[str, Any]) -> None:
    """The MCP door read the body as it came: a tool call under `Content-Encoding: gzip` but not compressed was run
    (a `remember` written), a compressed one was a parse error. 415 naming the header, as the HTTP API answers."""
    import gzip

    call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    headers = {"authorization": "Bearer k-acme", "accept": "application/json, text/event-stream"}
    headers |= {"content-type": "application/json"}
    for coding, body in (("gzip", call), ("gzip", gzip.compress(call)), ("br", call)):
        r = httpx.post(stack["mcp_url"], headers={**headers, "content-encoding": coding}, content=body)
        assert r.status_code == 415, r.text
        assert r.json()["detail"][0] | {"message": ""} == {
            "code": "unsupported_media_type", "field": "Content-Encoding", "message": ""
        }, r.text  # fmt: skip
    assert httpx.post(stack["mcp_url"], headers={**headers, "content-encoding": "identity"}, content=call).is_success
