"""The MCP server through an independent client: the official MCP Inspector's CLI, over both transports.

The Inspector (npm `@modelcontextprotocol/inspector`, one exact version in tests/mcp_inspector/package.json and its
lock) is installed by `make install`; missing, these tests fail (CI installs it), they never skip. It is given the
server as docs/mcp.md tells a client to: an `mcpServers` file with a Streamable HTTP entry (the URL of
`ledger mcp --transport http`, a child on a free port as tests/test_mcp.py starts it, and the API key as the
bearer) and a stdio entry (the venv's `ledger mcp`, the settings in `env`), one Inspector run per request.

On each transport: `tools/list` answers every tool and the Inspector's own schema check (`--strict`) finds nothing
to warn about; `tools/call` of every tool with valid arguments (tests/test_mcp_tool_schemas.calls) answers
structured content that the Inspector's client accepted against the tool's output schema, and that validates here
against that schema in strict mode: every object closed, so a field the schema does not declare fails too; a
refused call reaches the client as a tool error carrying the API's error shape, not as the client's own
output-schema failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from api.mcp.tools import TOOLS
from producers.settings import REPO_ROOT, Settings
from tests.conftest import unique
from tests.support import pipeline, publish_raw
from tests.support.servers import McpHttpServer
from tests.test_mcp_tool_schemas import SETTLE_AFTER, calls, dead_letter_records

KEY = "k-inspector"
TRANSPORTS = ["http", "stdio"]
FOLDER = REPO_ROOT / "tests" / "mcp_inspector"
INSPECTOR = FOLDER / "node_modules" / ".bin" / "mcp-inspector"
TOOL_ERROR_EXIT = 5  # the Inspector CLI's exit code for a call answered with isError: true
TIMEOUT_S = 180  # one run; a stdio run starts the server (its stores, its models) first


@pytest.fixture(scope="module")
def stack(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not INSPECTOR.exists():
        pytest.fail(f"the MCP Inspector is not installed ({INSPECTOR.relative_to(REPO_ROOT)}): run `make install`")
    settings = base_settings.private(unique("mcpi"), api_keys={KEY: ["acme"]}, mcp_admin_keys=[KEY])
    home = tmp_path_factory.mktemp("inspector")
    with pipeline(settings) as pipe, McpHttpServer(settings) as server:
        servers = {
            "http": {"type": "http", "url": server.url, "headers": {"Authorization": f"Bearer {KEY}"}},
            "stdio": {
                "command": str(Path(sys.executable).parent / "ledger"),
                "args": ["mcp"],
                "env": settings.as_env(mcp_api_key=KEY),
            },
        }
        config = home / "mcp.json"
        config.write_text(json.dumps({"mcpServers": servers}))
        # no keychain, and a client config of its own (not the machine user's); --config is read, never written
        env = os.environ | {"MCP_INSPECTOR_SECRET_STORE": "memory", "MCP_CLIENT_CONFIG_PATH": str(home / "client.json")}
        yield {"settings": settings, "pipe": pipe, "server": server, "config": config, "env": env}
        server.check()


def inspect(stack: dict[str, Any], transport: str, method: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """One Inspector CLI run of `method` on the transport's server: (exit code, its JSON answer, its stderr)."""
    argv = [str(INSPECTOR), "--cli", "--config", str(stack["config"]), "--server", transport, "--method", method]
    done = subprocess.run(
        [*argv, "--format", "json", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        env=stack["env"],
    )
    try:
        answer = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        answer = {"not_json": done.stdout[-2000:]}
    return done.returncode, answer, done.stderr


def call(stack: dict[str, Any], transport: str, tool: str, arguments: dict[str, Any]) -> tuple[int, dict, str]:
    return inspect(stack, transport, "tools/call", "--tool-name", tool, "--tool-args-json", json.dumps(arguments))


def strict(node: Any) -> Any:
    """The schema with every object closed (`additionalProperties: false` where it lists properties): the response
    models let a client ignore fields it does not know, so only here does an undeclared field fail. An object
    composed of branches (anyOf, oneOf, allOf) is closed in each branch, which lists all of its fields."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "patternProperties"):
            out[key] = {name: strict(schema) for name, schema in value.items()}
        elif key in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf", "not", "contains"):
            out[key] = strict(value)
        else:
            out[key] = value
    if "properties" in node and not any(k in node for k in ("anyOf", "oneOf", "allOf")):
        out["additionalProperties"] = False
    return out


@pytest.mark.unit
def test_strict_closes_every_object_and_keeps_the_rest() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {}}, "additionalProperties": True}},
        "additionalProperties": True,
    }
    validator = jsonschema.Draft202012Validator(strict(schema))
    assert validator.is_valid({"a": {"b": 1}})
    assert not validator.is_valid({"a": {"b": 1, "c": 2}}) and not validator.is_valid({"a": {}, "d": 1})
    composed = {"type": "object", "properties": {"k": {}}, "anyOf": [{"properties": {"k": {}, "x": {}}}]}
    assert jsonschema.Draft202012Validator(strict(composed)).is_valid({"k": 1, "x": 2})
    assert not jsonschema.Draft202012Validator(strict(composed)).is_valid({"k": 1, "y": 2})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_inspector_lists_every_tool_and_finds_nothing_to_warn_about(stack: dict[str, Any], transport: str) -> None:
    code, answer, stderr = inspect(stack, transport, "tools/list", "--strict")
    assert code == 0, (answer, stderr[-3000:])
    assert {t["name"] for t in answer["result"]["tools"]} == {spec.name for spec in TOOLS}
    # --strict prints each schema portability problem as `Warning: tool "..."` or `Error: tool "..."`, on stderr
    problems = [line for line in stderr.splitlines() if line.startswith(("Warning: tool", "Error: tool"))]
    assert problems == [], stderr[-3000:]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_tool_called_through_the_inspector_answers_its_output_schema_strictly(
    stack: dict[str, Any], transport: str
) -> None:
    subject = f"user:{transport}-{uuid.uuid4().hex[:8]}"
    publish_raw(stack["settings"], dead_letter_records(subject))  # this run's two open dead letters
    stack["pipe"].settle()  # ... and the earlier run's actions on its own applied: only these two are open
    code, listed, stderr = inspect(stack, transport, "tools/list")
    assert code == 0, stderr[-3000:]
    tools = {t["name"]: t for t in listed["result"]["tools"]}
    plan = calls(subject)
    assert {name for name, _ in plan} == set(tools), "each tool needs valid arguments in test_mcp_tool_schemas.calls"
    done: dict[str, Any] = {}
    wrong: list[tuple[str, Any]] = []
    for name, arguments in plan:
        code, answer, stderr = call(stack, transport, name, arguments(done))
        result = answer.get("result") or {}
        body = result.get("structuredContent")
        if code != 0 or result.get("isError") or body is None:
            wrong.append((name, code, answer, stderr[-1500:]))
            break  # the calls after it build on its answer
        validator = jsonschema.Draft202012Validator(strict(tools[name]["outputSchema"]))
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
        if errors:
            wrong.append((name, errors[:5]))
        done[name] = body
        if name in SETTLE_AFTER:
            stack["pipe"].settle()
    assert wrong == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_call_reaches_the_inspector_as_the_apis_error(stack: dict[str, Any], transport: str) -> None:
    """A tool error carries the API's error shape as its text and no structured content, which a client would check
    against the tool's output schema (the success shape) and replace with its own validation failure."""
    code, answer, stderr = call(stack, transport, "recall", {"query": "x", "top_k": 0})
    result = answer.get("result") or {}
    assert code == TOOL_ERROR_EXIT and result.get("isError") is True, (answer, stderr[-3000:])
    assert "structuredContent" not in result, result
    body = json.loads(result["content"][0]["text"])
    assert body["status"] == 422 and body["detail"][0] | {"message": ""} == {
        "code": "invalid_value",
        "field": "top_k",
        "message": "",
    }, body
