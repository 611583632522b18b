"""The ledger's MCP tools: each is one request model of api.requests (or the event contract) and one call of
api.reads / api.writes, the functions the HTTP routes call.

| tool | runs | like |
|---|---|---|
| remember | api.writes.publish_one (a memory.asserted through the publish door) | POST /v1/events |
| recall | api.reads.recall (valid time now) | POST /v1/recall |
| recall_at | api.reads.recall with as_of (and known_at) | POST /v1/recall |
| facts | api.reads.subject_facts | GET /v1/subjects/{s}/facts |
| fact_history | api.reads.history | GET /v1/facts/{id}/history |
| forget | api.writes.forget: a memory.retracted through the door, or erasure | POST /v1/events, DELETE |
| context | api.reads.context | POST /v1/context |

A tool's input schema is its model's JSON schema (references inlined), with `tenant` optional (api.mcp.auth);
its arguments are validated by that model, so a bad one is a tool error whose body is the API's one error
shape plus the status the route would answer: `{"status": 422, "detail": [{"code", "field", "message"}]}`.
A result is the route's body, as structured content and as its JSON text (the context tool's text is the
block itself). Nothing a caller sends crashes the server: an unexpected failure is a 500-shaped tool error,
logged; a store that is down is the 503 naming it (api.errors.store_failure).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ValidationError

from api import reads, writes
from api.errors import ApiError, error_body, store_failure, validation_items
from api.requests import (
    ContextBody,
    FactsParams,
    ForgetParams,
    HistoryParams,
    RecallAtBody,
    RecallBody,
    inline_refs,
)
from api.resources import Resources
from producers.contract import EventType, MemoryEvent

__all__ = ["TOOLS", "ToolSpec", "error_result", "run_tool"]

log = logging.getLogger(__name__)

Run = Callable[[Resources, frozenset[str], Any], Awaitable[Any]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what a model reads (name, description, schema, annotations) and what it runs."""

    name: str
    title: str
    description: str
    schema: dict[str, Any]
    annotations: ToolAnnotations
    validate: Callable[[dict[str, Any]], Any]  # arguments (tenant filled in) -> the validated parameters
    run: Run


def _schema(model: type[BaseModel], *, drop: tuple[str, ...] = (), notes: dict[str, str] | None = None) -> dict:
    """The model's JSON schema for a tool: references inlined, `drop` left out, `tenant` optional, `notes` added."""
    schema = inline_refs(model.model_json_schema())
    props = {k: v for k, v in schema["properties"].items() if k not in drop}
    for name, note in (notes or {}).items():
        props[name] = {**props[name], "description": note}
    props["tenant"] = {
        **props["tenant"],
        "description": "the tenant; may be left out when the API key is bound to one tenant",
    }
    required = [k for k in schema.get("required", []) if k in props and k != "tenant"]
    out = {"type": "object", "properties": props, "additionalProperties": False}
    return out | ({"required": required} if required else {})


def _model(model: type[BaseModel], allowed: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """Validation by `model`, refusing the arguments the tool's schema leaves out (as `extra_forbidden`)."""
    names = set(allowed["properties"])

    def validate(arguments: dict[str, Any]) -> Any:
        extra = sorted(set(arguments) - names)
        if extra:
            raise ApiError(422, "extra_forbidden", "Extra inputs are not permitted", extra[0])
        return model.model_validate(arguments)

    return validate


# -- remember: a memory.asserted through the door --------------------------------------------------------------

_REMEMBER_FIELDS = (
    "event_id",
    "tenant",
    "subject",
    "key",
    "scope",
    "value",
    "content",
    "kind",
    "entities",
    "aliases",
    "tags",
    "source",
    "confidence",
    "importance",
    "valid_from",
    "valid_to",
    "observed_at",
)
_REMEMBER_NOTES = {
    "event_id": "an id you choose for this memory (e.g. a UUID); send the same id and content again to retry safely",
    "subject": "what the memory is about, e.g. user:42 or project:P1",
    "key": "the attribute, e.g. pref.seat or project.port; leave out for an episode (kind episodic)",
    "scope": "narrows the key (e.g. a context like work/home); the same key in two scopes are two facts",
    "value": "the value (any JSON); a new value for the same subject/key/scope supersedes the old one",
    "content": "the memory as one sentence in natural language (searched by recall)",
    "kind": "state (default; a new value supersedes), preference (with valid_to: a temporary override), "
    "event, or episodic (append-only, no key)",
    "entities": "ids the memory is about besides the subject (exact recall cues), e.g. P1",
    "aliases": "other names of the key or value a question may use (exact recall cues)",
    "valid_from": "when it became true (RFC 3339 with an offset; default: now)",
    "valid_to": "when it stops being true (RFC 3339); a preference with valid_to overrides only inside its window",
    "observed_at": "when it was learnt (RFC 3339; default: now)",
}


def _remember_schema() -> dict[str, Any]:
    schema = inline_refs(MemoryEvent.model_json_schema())
    props = {k: schema["properties"][k] for k in _REMEMBER_FIELDS}
    for name, note in _REMEMBER_NOTES.items():
        props[name] = {**props[name], "description": note}
    props["tenant"] = {**props["tenant"], "description": "the tenant; may be left out when the key has one tenant"}
    return {
        "type": "object",
        "properties": props,
        "required": ["event_id", "subject", "content"],
        "additionalProperties": False,
    }


REMEMBER_SCHEMA = _remember_schema()


def _remember_event(arguments: dict[str, Any]) -> dict[str, Any]:
    """The event the door judges (the contract validates it there, naming the field)."""
    extra = sorted(set(arguments) - set(REMEMBER_SCHEMA["properties"]))
    if extra:
        raise ApiError(422, "unknown_field", "not a field of a memory (see the tool's schema)", extra[0])
    if not isinstance(arguments.get("event_id"), str):
        raise ApiError(
            422, "missing_field", "choose an id for the memory: a retry with the same id is safe", "event_id"
        )
    return {"type": EventType.ASSERTED.value, **arguments}


# -- the tools ------------------------------------------------------------------------------------------------

_RECALL = _schema(RecallBody, drop=("as_of", "known_at"))
_RECALL_AT = _schema(RecallAtBody)
_FACTS = _schema(FactsParams)
_HISTORY = _schema(HistoryParams)
_FORGET = _schema(
    ForgetParams,
    notes={
        "key": "the fact to retract (with scope); leave out with erase_subject",
        "target_version": "retract only this version (a version_id from facts or fact_history)",
        "erase_subject": "true: erase everything about the subject, permanently (right to be forgotten)",
        "event_id": "an id you choose for the retraction (optional)",
    },
)
_CONTEXT = _schema(ContextBody)


async def _remember(res: Resources, tenants: frozenset[str], event: dict[str, Any]) -> dict[str, Any]:
    return await writes.publish_one(res, tenants, event)


async def _recall(res: Resources, tenants: frozenset[str], body: RecallBody) -> dict[str, Any]:
    return await reads.recall(res, tenants, body)


async def _facts(res: Resources, tenants: frozenset[str], p: FactsParams) -> dict[str, Any]:
    return await reads.subject_facts(res, tenants, p.tenant, p.subject, p.as_of, p.known_at)


async def _history(res: Resources, tenants: frozenset[str], p: HistoryParams) -> dict[str, Any]:
    return await reads.history(res, tenants, p.tenant, p.memory_id)


async def _forget(res: Resources, tenants: frozenset[str], p: ForgetParams) -> dict[str, Any]:
    return await writes.forget(res, tenants, p)


async def _context(res: Resources, tenants: frozenset[str], body: ContextBody) -> CallToolResult:
    block = await reads.context(res, tenants, body)
    text = block.text if body.format == "text" else orjson.dumps(block.doc).decode()
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=block.doc)


def _hints(*, read_only: bool, destructive: bool = False, idempotent: bool = True) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent, open_world_hint=False
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Remember",
        "Store a fact (subject, key, value) or an episode (kind episodic) in long-term memory; "
        "retrying with the same event_id is safe.",
        REMEMBER_SCHEMA,
        _hints(read_only=False, destructive=False, idempotent=True),
        _remember_event,
        _remember,
    ),
    ToolSpec(
        "recall",
        "Recall",
        "Find the memories that answer a question, exact matches first, each hit saying why it matched.",
        _RECALL,
        _hints(read_only=True),
        _model(RecallBody, _RECALL),
        _recall,
    ),
    ToolSpec(
        "recall_at",
        "Recall as of a time",
        "Recall as the facts stood at a past valid time (as_of), optionally as the ledger knew them at known_at.",
        _RECALL_AT,
        _hints(read_only=True),
        _model(RecallAtBody, _RECALL_AT),
        _recall,
    ),
    ToolSpec(
        "facts",
        "Facts of a subject",
        "List a subject's facts in force now (or at as_of, optionally as known at known_at): its profile.",
        _FACTS,
        _hints(read_only=True),
        _model(FactsParams, _FACTS),
        _facts,
    ),
    ToolSpec(
        "fact_history",
        "History of a fact",
        "Show every version of one fact (by memory_id), oldest first, with when each held and what replaced it.",
        _HISTORY,
        _hints(read_only=True),
        _model(HistoryParams, _HISTORY),
        _history,
    ),
    ToolSpec(
        "forget",
        "Forget",
        "Retract a fact (or one version of it) so it is no longer in force, or erase everything about a "
        "subject permanently.",
        _FORGET,
        _hints(read_only=False, destructive=True, idempotent=False),
        _model(ForgetParams, _FORGET),
        _forget,
    ),
    ToolSpec(
        "context",
        "Memory context block",
        "Get a prompt-ready block of what is known about a subject (facts relevant to the question first), "
        "within a token budget.",
        _CONTEXT,
        _hints(read_only=True),
        _model(ContextBody, _CONTEXT),
        _context,
    ),
)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def error_result(status: int, *items: dict[str, Any]) -> CallToolResult:
    """A tool error in the API's one error shape, with the status the HTTP route would have answered."""
    body = {"status": status, **error_body(*items)}
    return CallToolResult(content=[TextContent(type="text", text=_json(body))], structured_content=body, is_error=True)


async def run_tool(
    spec: ToolSpec, res: Resources, tenants: frozenset[str], arguments: dict[str, Any]
) -> CallToolResult:
    """Validate, run, answer: the route's body, or the error the route would have answered (never an exception)."""
    try:
        params = spec.validate(arguments)
        result = await spec.run(res, tenants, params)
    except ApiError as exc:
        return error_result(exc.status, exc.item())
    except ValidationError as exc:
        return error_result(422, *validation_items(exc.errors()))
    except Exception as exc:  # noqa: BLE001 - a tool answers every failure; a store failure is a 503, the rest 500
        failure = store_failure(exc)
        if failure is not None:
            log.warning("mcp %s: %s", spec.name, failure.message)
            return error_result(503, failure.item())
        log.error("mcp %s: unhandled %s", spec.name, type(exc).__name__, exc_info=exc)
        message = f"internal error ({type(exc).__name__}); it is logged"
        return error_result(500, {"code": "internal_error", "field": None, "message": message})
    if isinstance(result, CallToolResult):
        return result
    return CallToolResult(content=[TextContent(type="text", text=_json(result))], structured_content=result)
