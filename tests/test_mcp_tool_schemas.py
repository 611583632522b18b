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
import re
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
from tests.support.servers import McpHttpServer, tool_body

KEY = "k-acme"
SUBJECT = f"user:{uuid.uuid4().hex[:8]}"

Args = Callable[[dict[str, Any]], dict[str, Any]]  # the answers so far (by tool) -> the arguments of the next call


def calls(subject: str) -> list[tuple[str, Args]]:
    """(tool, arguments) about `subject` of tenant acme, in call order; each tool at least once. A new tool needs its
    line here (tests/test_mcp_inspector.py calls the same list through the MCP Inspector). The operator tools act on
    the first two open dead letters (`dead_letter_records`, published by the fixture; its key is an operator's)."""
    seat = f"seat-{subject}"
    return [
        (
            "remember",
            lambda _: {
                "event_id": seat,
                "subject": subject,
                "key": "pref.seat",
                "value": {"side": "window", "row": 12},
                "content": f"{subject} prefers a window seat in row 12",
                "source": {"type": "explicit", "service": "chat"},
            },
        ),
        ("event_status", lambda _: {"event_id": seat}),
        ("recall", lambda _: {"query": "which seat does the user prefer?", "subject": subject, "mode": "hybrid"}),
        ("recall_at", lambda _: {"query": "seat", "as_of": datetime.now(UTC).isoformat(), "subject": subject}),
        ("facts", lambda _: {"subject": subject}),
        ("verify_receipt", lambda done: {"receipt": done["facts"]["receipt"]}),
        (
            "replay_receipt",  # the tool's page (limit 100 unless told) is a parameter of the answer, as it names it
            lambda done: {
                "receipt": done["facts"]["receipt"],
                "request": {"subject": subject, "limit": done["facts"]["page"]["limit"]},
            },
        ),
        ("fact_history", lambda done: {"memory_id": done["remember"]["memory_id"]}),
        ("context", lambda _: {"subject": subject, "question": "which seat?", "format": "json"}),
        ("context", lambda _: {"subject": subject, "question": "which seat?"}),
        ("forget", lambda _: {"subject": subject, "key": "pref.seat", "reason": "asked to"}),
        ("forget", lambda _: {"subject": subject, "erase_subject": True}),
        ("dead_letters", lambda _: {"state": "open"}),
        ("dead_letter", lambda done: _letter(done, 0)),
        (
            "redrive_dead_letter",
            lambda done: _letter(done, 0) | {"event": _wire(subject, content="a corrected record")},
        ),
        ("discard_dead_letter", lambda done: _letter(done, 1) | {"reason": "a test record"}),
    ]


CALLS = calls(SUBJECT)
SETTLE_AFTER = {"event_status"}  # the ledger applies the memory before the reads ask for it


def _wire(subject: str, **over: Any) -> dict[str, Any]:
    """A memory.asserted of acme about the subject's meal (`...` drops a field)."""
    event = {"type": "memory.asserted", "tenant": "acme", "subject": subject, "key": "pref.meal", "value": "veg"}
    return {k: v for k, v in (event | over).items() if v is not ...}


def dead_letter_records(subject: str, n: int = 2) -> list[tuple[bytes, bytes]]:
    """n records of acme without content, as a producer that skips the contract writes them: the worker refuses
    them, so they are open dead letters for the operator tools. They name a subject of their own: the plan erases
    `subject`, and an erasure takes the letters of the records naming it."""
    named = f"{subject}:letters"
    key = f"acme|{named}".encode()
    return [(key, orjson.dumps(_wire(named, event_id=f"dl-{subject}-{i}"))) for i in range(n)]


def _letter(done: dict[str, Any], n: int) -> dict[str, Any]:
    """The position of the n-th dead letter `dead_letters` listed."""
    letter = done["dead_letters"]["dead_letters"][n]
    return {"partition": letter["partition"], "offset": letter["offset"]}


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("mcps"), api_keys={KEY: ["acme"]}, mcp_admin_keys=[KEY])
    with pipeline(settings) as pipe, McpHttpServer(settings) as server:
        publish_raw(settings, dead_letter_records(SUBJECT))  # dead letters for the operator tools
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
    for branch in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
        yield from _nested(branch, path)
    if isinstance(node.get("items"), dict):
        yield from _nested(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):  # a mapping's values (e.g. a stage's candidates)
        yield from _nested(node["additionalProperties"], path + "{}")


def _enum(prop: dict[str, Any]) -> list[Any]:
    """The choices of a property, also when it is nullable (an enum in one branch of anyOf)."""
    return prop.get("enum") or [v for b in prop.get("anyOf", []) for v in b.get("enum", [])]


def test_every_property_is_described_and_every_choice_explained(stack: dict[str, Any]) -> None:
    """What a tool takes and what it answers: every property at any depth of both schemas has a description, and the
    description of a property with choices names each of them."""
    wrong: list[str] = []
    for tool in _tools(stack):
        if not tool.description or "\n" in tool.description:
            wrong.append(f"{tool.name}: no one-line description")
        for schema, side in ((tool.input_schema, "in"), (tool.output_schema or {}, "out")):
            for path, prop in _properties(schema, f"{tool.name}:{side}"):
                text = prop.get("description") or ""
                if not text.strip():
                    wrong.append(f"{path}: no description")
                missing = [v for v in _enum(prop) if v is not None and str(v) not in text]
                if missing:
                    wrong.append(f"{path}: the description does not explain {missing}")
    assert wrong == []


def test_nothing_a_model_reads_names_a_server_setting(stack: dict[str, Any]) -> None:
    """No LEDGER_ name anywhere in what the server tells a client (tools, titles, schemas, examples, instructions):
    a model cannot set the server's environment; a refusal's text is checked where it is raised."""

    async def work(client: Client) -> tuple[str, list[Any]]:
        return client.instructions or "", (await client.list_tools()).tools

    instructions, tools = asyncio.run(_session(stack["url"], work))
    text = orjson.dumps([t.model_dump(mode="json") for t in tools]).decode() + instructions
    assert tools and "LEDGER_" not in text, [m.start() for m in re.finditer("LEDGER_", text)][:5]


def test_a_memory_value_is_typed_as_json(stack: dict[str, Any]) -> None:
    """remember's `value` and every `value` a tool answers: one of the JSON types, never an empty schema."""
    typed = {"string", "number", "boolean", "object", "array", "null"}
    tools = _tools(stack)
    values = [("remember:in.value", next(t for t in tools if t.name == "remember").input_schema["properties"]["value"])]
    values += [(p, prop) for t in tools for p, prop in _properties(t.output_schema or {}, f"{t.name}:out")]
    values = [(p, prop) for p, prop in values if p.endswith(".value")]
    assert len(values) > 5, values
    for path, value in values:
        types = {b.get("type") for b in value.get("anyOf", [])} or {value.get("type")}
        assert types == typed, (path, value)


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


def _typed(prop: dict[str, Any]) -> set[str]:
    """The JSON types a property takes, also when it is nullable (a type in one branch of anyOf)."""
    types = prop.get("type")
    found = set(types if isinstance(types, list) else [types] if types else [])
    return found | {t for b in prop.get("anyOf", []) for t in ([b["type"]] if isinstance(b.get("type"), str) else [])}


def test_every_number_and_flag_argument_refuses_text_and_the_other_kind(stack: dict[str, Any]) -> None:
    """A tool's integer or boolean argument given as text, or as the other of the two, is `wrong_type` naming it,
    whichever tool (a page's `limit: true` was read as 1, `offset: "1"` as 1): what the README promises of JSON."""
    wrong = {"integer": ["1", True], "boolean": ["true", 1]}
    cases = [
        (tool.name, name, bad)
        for tool in _tools(stack)
        for name, prop in tool.input_schema.get("properties", {}).items()
        for kind in sorted(_typed(prop) - {"null"})
        if _typed(prop) - {"null"} == {kind} and kind in wrong  # a number or a flag, not any JSON (a memory's value)
        for bad in wrong[kind]
    ]
    assert len({(t, n) for t, n, _ in cases}) >= 10, cases  # the tools have that many numbers and flags at least

    async def work(client: Client) -> list[tuple[str, str, Any, Any]]:
        refused = []
        for tool, name, bad in cases:
            result = await client.call_tool(tool, {name: bad})
            body = tool_body(result) if result.is_error else {}
            items = [(d.get("code"), d.get("field")) for d in body.get("detail", [])]
            refused.append((tool, name, bad, ("wrong_type", name) in items or items))
        return refused

    outcome = asyncio.run(_session(stack["url"], work))
    assert [o for o in outcome if o[3] is not True] == [], outcome


def test_remember_takes_null_exactly_where_its_schema_says(stack: dict[str, Any]) -> None:
    """remember's input schema is the event contract's: a null stands for "not given" in every argument but the three
    a memory must have, so a memory sent with each of the others as null is the same event as without them (a
    retry: `duplicate`), and each of the three as null is refused naming it."""
    schema = next(t for t in _tools(stack) if t.name == "remember").input_schema
    required = set(schema["required"])
    nullable = {name for name, prop in schema["properties"].items() if "null" in _typed(prop)}
    assert nullable == set(schema["properties"]) - required, (required, nullable)
    subject = f"user:{uuid.uuid4().hex[:8]}"
    memory = {"event_id": f"null-{subject}", "subject": subject, "content": f"{subject} likes tea", "value": "tea"}
    memory["key"] = "pref.drink"

    async def work(client: Client) -> list[Any]:
        first = await client.call_tool("remember", memory | dict.fromkeys(nullable - {"value", "key"}))
        again = await client.call_tool("remember", memory)
        refused = [await client.call_tool("remember", memory | {name: None}) for name in sorted(required)]
        return [first, again, *refused]

    first, again, *refused = asyncio.run(_session(stack["url"], work))
    assert not first.is_error and not again.is_error, (tool_body(first), tool_body(again))
    assert tool_body(again)["duplicate"] is True, tool_body(again)
    for name, result in zip(sorted(required), refused, strict=True):
        assert result.is_error and tool_body(result)["detail"][0]["field"] == name, (name, tool_body(result))
