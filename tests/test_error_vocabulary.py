"""One vocabulary of error codes for every door, documented, and every error bounded, on the real servers.

`api.errors.ERROR_CODES` is the vocabulary. Proved here:
- the README's table is that vocabulary, row for row (so the documentation cannot drift from the code);
- no code literal in the API, the MCP server or the event contract is outside it (read from the source);
- every operation of the app's OpenAPI spec and every MCP tool, sent a missing required field, an unknown field
  and a value of the wrong type for each of its fields, answers codes of the vocabulary only, naming the field
  (`missing_field`, `unknown_field`, ...: never pydantic's `missing`, `extra_forbidden`, `int_parsing`);
- with a key bound to thousands of tenants, and with garbage arguments of 100,000 characters, no error message is longer
  than `MAX_MESSAGE_CHARS` and no field longer than `MAX_FIELD_CHARS`; a call without `tenant` says how many
  tenants the key has and where they are listed, never the list.
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api.errors import _STATUS_CODES, ERROR_CODES, MAX_FIELD_CHARS, MAX_MESSAGE_CHARS
from api.main import create_app
from producers.settings import REPO_ROOT, Settings
from tests.conftest import unique
from tests.support.servers import McpHttpServer, tool_body
from tests.support.stores import private_ledger

TENANT = "vocab"
MANY = [TENANT, *(f"tenant-{i:05d}-of-a-key-bound-to-many" for i in range(2000))]
KEYS = {"k-one": [TENANT], "k-many": MANY}
UNKNOWN = "zz_not_a_field"
VOCABULARY_HEADER = "| code | when |"
HUGE = "x" * 100_000  # every field of a tool this long stays within the SDK's 4 MiB request limit


def _check_items(detail: Any, where: Any) -> list[dict[str, Any]]:
    """The items of an error body: in the one shape, codes of the vocabulary, message and field bounded."""
    assert isinstance(detail, list) and detail, where
    for item in detail:
        assert set(item) == {"code", "field", "message"}, (where, item)
        assert item["code"] in ERROR_CODES, (where, item)
        assert len(item["message"]) <= MAX_MESSAGE_CHARS, (where, item["code"], len(item["message"]))
        assert item["field"] is None or len(item["field"]) <= MAX_FIELD_CHARS, (where, item["code"])
        assert item["field"] is None or not _TYPE_LABEL.search(item["field"]), (where, item)  # the caller's path
    return detail


# what pydantic names a union's member by in an error's path (`tags.str`, `tags.list[str].0`): never a request's field
_TYPE_LABEL = re.compile(r"(^|\.)(str|int|float|bool|none|list|dict|function-\w+|nullable|constrained-\w+)(\[|\.|$)")


def test_a_text_too_long_or_a_bad_offset_is_told_in_the_callers_terms(vocab_settings: Settings) -> None:
    """A text past its limit is counted in characters wherever the limit sits (a path, a query parameter, a body
    field checked after a validator of its own), and a time's impossible UTC offset is said as an offset, not in
    Python's words."""
    key = {"X-API-Key": next(iter(KEYS))}
    with TestClient(create_app(vocab_settings)) as client:
        long = "s" * 300
        for method, url, kwargs, field in (
            ("GET", f"/v1/subjects/{long}/facts", {"params": {"tenant": TENANT}}, "subject"),
            ("GET", "/v1/subjects", {"params": {"tenant": TENANT, "prefix": long}}, "prefix"),
            ("POST", "/v1/recall", {"json": {"tenant": TENANT, "query": "q", "subject": long}}, "subject"),
        ):
            resp = client.request(method, url, headers=key, **kwargs)
            (item,) = _check_items(resp.json()["detail"], url)
            assert item["field"] == field and "300" in item["message"], item
            assert "characters" in item["message"] and "items" not in item["message"], item
        params = {"tenant": TENANT, "as_of": "2026-01-01T00:00:00+24:00"}
        resp = client.get("/v1/subjects/x/facts", params=params, headers=key)
        (item,) = _check_items(resp.json()["detail"], params)
        assert item["field"] == "as_of" and "offset" in item["message"] and "timedelta" not in item["message"], item


def test_a_value_inside_a_field_of_several_types_is_named_by_the_callers_path(vocab_settings: Settings) -> None:
    """A recall filter takes a string or a list of strings: a wrong value in either is named as the caller wrote
    it (`filters.tags`, `filters.key.0`), not by the type pydantic tried."""
    with TestClient(create_app(vocab_settings)) as client:
        for filters, fields in (
            ({"tags": [["x"]]}, {"filters.tags", "filters.tags.0"}),
            ({"key": [None]}, {"filters.key", "filters.key.0"}),
            ({"tags": 5}, {"filters.tags"}),
        ):
            body = {"tenant": TENANT, "query": "q", "filters": filters}
            resp = client.post("/v1/recall", json=body, headers={"X-API-Key": next(iter(KEYS))})
            assert resp.status_code == 422, resp.text
            items = _check_items(resp.json()["detail"], filters)
            assert {i["field"] for i in items} == fields, items


# -- the vocabulary, documented and used ----------------------------------------------------------------------


@pytest.mark.unit
def test_the_readme_table_is_the_vocabulary() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    start = lines.index(VOCABULARY_HEADER) + 2  # the header, then its |---| line
    table = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        code, meaning = re.fullmatch(r"\| `([a-z_]+)` \| (.+) \|", line).groups()
        table[code] = meaning
    assert table == ERROR_CODES


def _literal_codes(path: Path) -> set[tuple[str, int]]:
    """(code, line) of every error code written as a literal in `path`: the code argument of ApiError,
    InvalidEvent, PydanticCustomError and the contract's `_refuse`, and any `"code": "..."` of a dict."""
    found: set[tuple[str, int]] = set()
    positions = {"ApiError": 1, "InvalidEvent": 0, "PydanticCustomError": 0, "_refuse": 0}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            at = positions.get(name or "")
            args = [*node.args[at : at + 1]] if at is not None else []
            args += [k.value for k in node.keywords if k.arg == "code" and at is not None]
            found |= {(a.value, node.lineno) for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code" and isinstance(value, ast.Constant):
                    found.add((value.value, node.lineno))
    return found


@pytest.mark.unit
def test_no_code_in_the_source_is_outside_the_vocabulary() -> None:
    sources = [*sorted((REPO_ROOT / "api").rglob("*.py")), REPO_ROOT / "producers" / "contract.py"]
    outside = [
        (str(path.relative_to(REPO_ROOT)), line, code)
        for path in sources
        for code, line in _literal_codes(path)
        if code not in ERROR_CODES
    ]
    assert outside == []
    assert set(_STATUS_CODES.values()) <= set(ERROR_CODES)  # the codes of a bare HTTP status
    sdk = (REPO_ROOT / "producers" / "sdk.py").read_text()  # a refused publish is `publish_<PublishError.code>`
    publish = set(re.findall(r"`code`: ([a-z_ |]+)\.", sdk)[0].replace(" ", "").split("|"))
    assert publish and {f"publish_{c}" for c in publish} <= set(ERROR_CODES), publish


# -- the probes: a missing field, an unknown field, a wrong type ----------------------------------------------


def _resolve(node: Any, components: dict[str, Any]) -> Any:
    if isinstance(node, dict) and "$ref" in node:
        return _resolve(components[node["$ref"].rsplit("/", 1)[-1]], components)
    return node


def _kind(schema: dict[str, Any]) -> str | None:
    """The JSON type of `schema` (its one non-null branch); None for any value, or several types (nothing is wrong)."""
    branches = [b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"] or [schema]
    types = {b.get("type") for b in branches}
    return branches[0].get("type") if len(types) == 1 else None


WRONG = {"string": 12345, "integer": "twelve", "number": "twelve", "boolean": "maybe", "array": 7, "object": 7}
RIGHT = {"string": "x", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


def _probes(schema: dict[str, Any], *, fill: bool = False) -> list[tuple[str, dict[str, Any], str, str | None]]:
    """(what, arguments, field, code wanted: None for the wrong type's own) for an object schema: a missing
    required field, an unknown field, a value of the wrong type for each typed field. `tenant` is given (the
    key's one tenant) unless it is the field probed; with `fill`, so are the other required fields (for a door
    that names the first mistake only)."""
    props = schema.get("properties", {})
    base = {"tenant": TENANT} if "tenant" in props else {}
    required = schema.get("required", [])
    if fill:
        base |= {name: RIGHT.get(_kind(props[name]) or "", "x") for name in required if name != "tenant"}
    probes: list[tuple[str, dict[str, Any], str, str | None]] = []
    missing = next((name for name in required if name != "tenant"), "tenant" if "tenant" in required else None)
    if missing is not None:
        probes.append(("missing", {k: v for k, v in base.items() if k != missing}, missing, "missing_field"))
    probes.append(("unknown", {**base, UNKNOWN: 1}, UNKNOWN, "unknown_field"))
    for name, node in props.items():
        if _kind(node) is not None:
            probes.append((f"wrong type of {name}", {**base, name: WRONG[_kind(node)]}, name, None))
    return probes


def _named(items: list[dict[str, Any]], field: str, code: str | None) -> bool:
    """Whether an item names `field` with `code` (a wrong type: any code of a value the field does not take)."""
    codes = {code} if code is not None else {"wrong_type", "invalid_value", "unknown_value", "invalid_time"}
    return any(i["field"] == field and i["code"] in codes for i in items)


@pytest.fixture(scope="module")
def vocab_settings(base_settings: Settings) -> Iterator[Settings]:
    # both keys get the operator tools too: every tool's arguments are judged (an agent's key is refused them first)
    vocab = base_settings.private(unique("vocab"), api_keys=KEYS, mcp_admin_keys=list(KEYS))
    with private_ledger(vocab) as settings:
        yield settings


def test_every_route_answers_bad_input_in_the_vocabulary_naming_the_field(vocab_settings: Settings) -> None:
    with TestClient(create_app(vocab_settings)) as client:
        spec = client.get("/openapi.json").json()
        components = spec["components"]["schemas"]
        probed = 0
        for path, item in spec["paths"].items():
            for method, op in item.items():
                url = path
                params = [p for p in op.get("parameters", []) if p["in"] in ("path", "query")]
                for p in params:
                    url = url.replace("{" + p["name"] + "}", "x")
                for key in KEYS:
                    headers = {"X-API-Key": key}
                    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
                    if body is not None:
                        probes = [(w, a, f, c, True, {"json": a}) for w, a, f, c in _probes(_resolve(body, components))]
                    else:
                        query = {p["name"]: p for p in params if p["in"] == "query"}
                        as_schema = {
                            "properties": {name: _resolve(p["schema"], components) for name, p in query.items()},
                            "required": [name for name, p in query.items() if p.get("required")],
                        }
                        probes = [  # an unknown query parameter is ignored, as HTTP does; any text is a string
                            (w, a, f, c, _kind(as_schema["properties"].get(f, {})) != "string", {"params": a})
                            for w, a, f, c in _probes(as_schema)
                            if w != "unknown"
                        ]
                    for what, _, field, code, strict, send in probes:
                        resp = client.request(method.upper(), url, headers=headers, **send)
                        where = (method, path, key, what)
                        if resp.status_code < 400:
                            assert not strict, (where, resp.text[:300])
                            continue  # text in a query string where text goes
                        items = _check_items(resp.json()["detail"], where)
                        if strict and resp.status_code == 422:
                            assert _named(items, field, code), (where, items)
                        probed += 1
        assert probed > 60, probed  # every operation was probed, not a few


def _error_items(body: Any) -> list[dict[str, Any]]:
    """Every error item anywhere in a JSON body (`detail`, and each refused event's `error` of /v1/events)."""
    if isinstance(body, list):
        return [item for value in body for item in _error_items(value)]
    if not isinstance(body, dict):
        return []
    own = [body] if {"code", "field", "message"} <= set(body) else []
    return own + [item for value in body.values() for item in _error_items(value)]


def test_no_route_error_is_unbounded_with_many_tenants_or_garbage_input(vocab_settings: Settings) -> None:
    long = HUGE[:10_000]  # a URL's path and query stay within the client's 64 KiB
    asserted = {"type": "memory.asserted", "tenant": TENANT, "subject": "s", "key": "k", "content": "c"}
    garbage_events = [
        {HUGE: 1},
        {"type": HUGE, "tenant": TENANT, "subject": HUGE},
        {**asserted, HUGE: 1},
        {**asserted, "value": {HUGE: "\0"}},
        {**asserted, "tenant": "x" + HUGE},
    ]
    checked = 0
    with TestClient(create_app(vocab_settings)) as client:
        spec = client.get("/openapi.json").json()
        for path, item in spec["paths"].items():
            for method, op in item.items():
                params = [p for p in op.get("parameters", []) if p["in"] in ("path", "query")]
                url = path
                for p in params:
                    url = url.replace("{" + p["name"] + "}", long if p["in"] == "path" else "x")
                query = {p["name"]: long for p in params if p["in"] == "query"}
                sends: list[dict[str, Any]] = [{"params": query}]
                if "requestBody" in op:
                    sends += [{"json": {HUGE: HUGE, "tenant": HUGE}}, {"content": HUGE.encode()}]
                    if path == "/v1/events":
                        sends += [{"json": {"events": [event]}} for event in garbage_events]
                        sends.append({"json": {"events": garbage_events}})
                for key in KEYS:
                    for send in sends:
                        resp = client.request(method.upper(), url, headers={"X-API-Key": key}, **send)
                        items = _error_items(resp.json()) if resp.status_code >= 400 else []
                        if items:
                            _check_items(items, (method, path, key, list(send)))
                            checked += 1
    assert checked > 40, checked


# -- the MCP tools --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_url(vocab_settings: Settings) -> Iterator[str]:
    with McpHttpServer(vocab_settings) as server:
        yield server.url
        server.check()


async def _calls(url: str, key: str, plan: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Each (label, tool, arguments) of `plan(tools)` called with `key`: (label, structured error body)."""
    out = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            tools = (await client.list_tools()).tools
            for label, tool, arguments in plan(tools):
                result = await client.call_tool(tool, arguments)
                assert result.is_error, (label, result.structured_content)
                out.append((label, tool_body(result)))
    return out


def test_every_mcp_tool_answers_bad_arguments_in_the_vocabulary_naming_the_field(mcp_url: str) -> None:
    def plan(tools: list[Any]) -> Iterator[tuple[Any, str, dict[str, Any]]]:
        assert len(tools) >= 7
        for tool in tools:
            for what, arguments, field, code in _probes(tool.input_schema, fill=True):
                yield (tool.name, what, field, code), tool.name, arguments

    results = asyncio.run(_calls(mcp_url, "k-one", plan))
    for (tool, what, field, code), body in results:
        items = _check_items(body.get("detail"), (tool, what))
        assert _named(items, field, code), (tool, what, items)


def test_no_mcp_error_is_unbounded_with_many_tenants_or_garbage_arguments(mcp_url: str) -> None:
    def plan(tools: list[Any]) -> Iterator[tuple[Any, str, dict[str, Any]]]:
        for tool in tools:
            yield (tool.name, "no tenant"), tool.name, {}
            yield (tool.name, "garbage"), tool.name, {HUGE: HUGE, "tenant": HUGE}
            yield (tool.name, "garbage values"), tool.name, dict.fromkeys(tool.input_schema["properties"], HUGE)
            yield (tool.name, "a foreign tenant"), tool.name, {"tenant": "x" + HUGE[:127]}

    results = asyncio.run(_calls(mcp_url, "k-many", plan))
    for (tool, what), body in results:
        items = _check_items(body.get("detail"), (tool, what))
        if what == "no tenant":
            assert (items[0]["code"], items[0]["field"]) == ("missing_field", "tenant"), items
            assert str(len(MANY)) in items[0]["message"] and "GET /v1/tenants" in items[0]["message"], items
            assert MANY[1] not in items[0]["message"], items


@pytest.mark.unit
def test_a_stores_error_names_its_class_once() -> None:
    """kafka-python's errors begin their text with their class: a 503 said `KafkaTimeoutError: KafkaTimeoutError:`."""
    from kafka.errors import KafkaTimeoutError

    from api.errors import store_unavailable

    for exc, reason in (
        (KafkaTimeoutError("Unable to bootstrap"), "(KafkaTimeoutError: Unable to bootstrap)"),
        (ConnectionRefusedError("refused"), "(ConnectionRefusedError: refused)"),
        (TimeoutError(), "(TimeoutError)"),
    ):
        message = store_unavailable("kafka", exc).item()["message"]
        assert message.endswith(reason), message
