"""What a model reads of the MCP tools is enough to call them right, and what they answer is what they declare.

The tools are listed from a real MCP server (Streamable HTTP, on the module's private ledger), so a tool added
later is checked too without editing this file, except for one line of valid arguments in CALLS (a tool without
one fails the test). For every tool: a one-line description; every argument, at any depth, described; every
choice of an enum named in its argument's description (a model cannot guess what `hybrid` does); no server
setting's environment name in any description (the model cannot set it); an output schema; and a call with
valid arguments answers structured content that validates against that schema.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import jsonschema
import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from producers.settings import Settings
from tests.conftest import unique
from tests.support import pipeline, publish_raw
from tests.support.servers import McpHttpServer

KEY = "k-acme"
SUBJECT = f"user:{uuid.uuid4().hex[:8]}"
SEAT = f"seat-{SUBJECT}"

Args = Callable[[dict[str, Any]], dict[str, Any]]  # the answers so far (by tool) -> the arguments of the next call

# (tool, arguments), in call order; each tool at least once. A new tool needs its line here.
CALLS: list[tuple[str, Args]] = [
    (
        "remember",
        lambda _: {
            "event_id": SEAT,
            "subject": SUBJECT,
            "key": "pref.seat",
            "value": {"side": "window", "row": 12},
            "content": f"{SUBJECT} prefers a window seat in row 12",
            "source": {"type": "explicit", "service": "chat"},
        },
    ),
    ("event_status", lambda _: {"event_id": SEAT}),
    ("recall", lambda _: {"query": "which seat does the user prefer?", "subject": SUBJECT, "mode": "hybrid"}),
    ("recall_at", lambda _: {"query": "seat", "as_of": datetime.now(UTC).isoformat(), "subject": SUBJECT}),
    ("facts", lambda _: {"subject": SUBJECT}),
    ("fact_history", lambda done: {"memory_id": done["remember"]["memory_id"]}),
    ("context", lambda _: {"subject": SUBJECT, "question": "which seat?", "format": "json"}),
    ("context", lambda _: {"subject": SUBJECT, "question": "which seat?"}),
    ("forget", lambda _: {"subject": SUBJECT, "key": "pref.seat", "reason": "asked to"}),
    ("forget", lambda _: {"subject": SUBJECT, "erase_subject": True}),
    # the operator tools, on the two records the fixture dead-lettered (KEY is an operator key there)
    ("dead_letters", lambda _: {"state": "open"}),
    ("dead_letter", lambda done: _letter(done, 0)),
    ("redrive_dead_letter", lambda done: _letter(done, 0) | {"event": _wire(content="a corrected record")}),
    ("discard_dead_letter", lambda done: _letter(done, 1) | {"reason": "a test record"}),
]
SETTLE_AFTER = {"event_status"}  # the ledger applies the memory before the reads ask for it


def _wire(**over: Any) -> dict[str, Any]:
    """A memory.asserted of acme about SUBJECT's meal (`...` drops a field)."""
    event = {"type": "memory.asserted", "tenant": "acme", "subject": SUBJECT, "key": "pref.meal", "value": "veg"}
    return {k: v for k, v in (event | over).items() if v is not ...}


def _letter(done: dict[str, Any], n: int) -> dict[str, Any]:
    """The position of the n-th dead letter `dead_letters` listed."""
    letter = done["dead_letters"]["dead_letters"][n]
    return {"partition": letter["partition"], "offset": letter["offset"]}


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("mcps"), api_keys={KEY: ["acme"]}, mcp_admin_keys=[KEY])
    with pipeline(settings) as pipe, McpHttpServer(settings) as server:
        # two records without content, straight to Kafka: dead letters for the operator tools
        key = f"acme|{SUBJECT}".encode()
        publish_raw(settings, [(key, orjson.dumps(_wire(event_id=f"dl-{n}"))) for n in range(2)])
        pipe.settle()
        yield {"pipe": pipe, "url": server.url}


async def _session(url: str, work: Callable[[Client], Any]) -> Any:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await work(client)


def _tools(stack: dict[str, Any]) -> list[Any]:
    async def work(client: Client) -> list[Any]:
        return (await client.list_tools()).tools

    return asyncio.run(_session(stack["url"], work))


def _properties(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every property at any depth: nested objects, list items and anyOf branches."""
    for name, prop in schema.get("properties", {}).items():
        yield f"{path}.{name}", prop
        yield from _nested(prop, f"{path}.{name}")


def _nested(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from _properties(node, path)
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        yield from _nested(branch, path)
    if isinstance(node.get("items"), dict):
        yield from _nested(node["items"], path + "[]")


def _enum(prop: dict[str, Any]) -> list[Any]:
    """The choices of a property, also when it is nullable (an enum in one branch of anyOf)."""
    return prop.get("enum") or [v for b in prop.get("anyOf", []) for v in b.get("enum", [])]


def _descriptions(tool: Any) -> Iterator[tuple[str, str]]:
    yield tool.name, tool.description or ""
    for schema, side in ((tool.input_schema, "in"), (tool.output_schema or {}, "out")):
        for path, prop in _properties(schema, f"{tool.name}:{side}"):
            if prop.get("description"):
                yield path, prop["description"]


def test_every_argument_is_described_and_every_choice_explained(stack: dict[str, Any]) -> None:
    wrong: list[str] = []
    for tool in _tools(stack):
        if not tool.description or "\n" in tool.description:
            wrong.append(f"{tool.name}: no one-line description")
        for path, prop in _properties(tool.input_schema, tool.name):
            text = prop.get("description") or ""
            if not text.strip():
                wrong.append(f"{path}: no description")
            missing = [v for v in _enum(prop) if v is not None and str(v) not in text]
            if missing:
                wrong.append(f"{path}: the description does not explain {missing}")
    assert wrong == []


def test_no_description_names_a_server_setting(stack: dict[str, Any]) -> None:
    tools = _tools(stack)
    named = [(path, text) for tool in tools for path, text in _descriptions(tool) if "LEDGER_" in text]
    assert named == []


def test_a_memory_value_is_typed_as_json(stack: dict[str, Any]) -> None:
    value = next(t for t in _tools(stack) if t.name == "remember").input_schema["properties"]["value"]
    types = {b.get("type") for b in value.get("anyOf", [])} or {value.get("type")}
    assert types == {"string", "number", "boolean", "object", "array", "null"}, value


def test_every_tool_answers_what_its_output_schema_declares(stack: dict[str, Any]) -> None:
    tools = {t.name: t for t in _tools(stack)}
    assert {name for name, _ in CALLS} == set(tools), "each listed tool needs valid arguments in CALLS"
    undeclared = [name for name, t in tools.items() if not (t.output_schema or {}).get("properties")]
    assert undeclared == [], "every tool declares an output schema"
    for name, tool in tools.items():
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
        assert tool.output_schema["type"] == "object", name

    async def work(client: Client) -> list[tuple[str, Any]]:
        done: dict[str, Any] = {}
        wrong: list[tuple[str, Any]] = []
        for name, args in CALLS:
            result = await client.call_tool(name, args(done))
            body = result.structured_content
            if result.is_error or body is None:
                wrong.append((name, body))
                continue
            errors = [e.message for e in jsonschema.Draft202012Validator(tools[name].output_schema).iter_errors(body)]
            if errors:
                wrong.append((name, errors[:3]))
            done[name] = body
            if name in SETTLE_AFTER:
                await asyncio.to_thread(stack["pipe"].settle)
        return wrong

    assert asyncio.run(_session(stack["url"], work)) == []
