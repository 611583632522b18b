"""The ledger's MCP tools: each is one request model of api.requests (or the event contract) and one call of
api.reads / api.writes, the functions the HTTP routes call, so both front ends give the same answers.

A tool's input and output schemas are its model's and its route's response model's (references inlined); a bad
argument or a failure is a tool error shaped like the API's (`{"status", "detail"}`), never a crash. Reads wait
for the session's last write (`SessionTokens`), so a recall right after a remember answers with it. The tools and
the routes they mirror: docs/mcp.md.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from api import dead_letters, reads, receipts, writes
from api.access import caller_of
from api.errors import ApiError, error_body, store_failure, validation_items
from api.requests import (
    ContextBody,
    EventStatusParams,
    FactsPage,
    ForgetParams,
    HistoryPage,
    RecallAtBody,
    RecallBody,
    ReceiptBody,
    ReplayBody,
    inline_refs,
)
from api.resources import Resources
from api.schemas import (
    ContextResponse,
    DeadLetterAction,
    DeadLetterRecord,
    DeadLettersResponse,
    ErasureResponse,
    EventResult,
    EventStatus,
    FactsResponse,
    HistoryResponse,
    PublishResponse,
    RecallResponse,
    ReceiptReplay,
    ReceiptVerification,
)
from producers.consistency import merge_tokens
from producers.contract import EventType
from producers.event_schema import event_schema

__all__ = ["SESSIONS", "TOOLS", "SessionTokens", "ToolSpec", "error_result", "run_tool"]

log = logging.getLogger(__name__)

Run = Callable[[Resources, frozenset[str], Any], Awaitable[Any]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what a model reads (name, description, schema, annotations), what it runs and what it answers."""

    name: str
    title: str
    description: str
    schema: dict[str, Any]
    annotations: ToolAnnotations
    validate: Callable[[dict[str, Any]], Any]  # arguments (tenant filled in) -> the validated parameters
    run: Run
    output: dict[str, Any] | None = None  # the JSON schema of what it answers (tests require one of every tool)
    admin: bool = False  # an operator tool: only keys of settings.mcp_admin_keys may call it (api.mcp.auth)


def _optional_tenant(prop: dict[str, Any]) -> dict[str, Any]:
    """A tool's `tenant`: left out or null (mcp.auth), the key's one tenant is meant."""
    constraints = {k: v for k, v in prop.items() if k not in ("anyOf", "description", "title", "default")}
    branches = prop.get("anyOf") or [constraints]
    if not any(branch.get("type") == "null" for branch in branches):
        branches = [*branches, {"type": "null"}]
    return {
        "anyOf": branches,
        "description": "the tenant; may be left out (or null) when the API key is bound to one tenant",
    }


def _schema(model: type[BaseModel], *, drop: tuple[str, ...] = ()) -> dict:
    """The model's JSON schema for a tool: references inlined, `drop` left out, `tenant` optional. The arguments'
    descriptions are the model's fields' (the HTTP API's OpenAPI has the same)."""
    schema = inline_refs(model.model_json_schema())
    props = {k: v for k, v in schema["properties"].items() if k not in drop}
    props["tenant"] = _optional_tenant(props["tenant"])
    required = [k for k in schema.get("required", []) if k in props and k != "tenant"]
    out = {"type": "object", "properties": props, "additionalProperties": False}
    return out | ({"required": required} if required else {})


def _model(model: type[BaseModel], allowed: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """Validation by `model`, refusing the arguments the tool's schema leaves out (as `unknown_field`)."""
    names = set(allowed["properties"])

    def validate(arguments: dict[str, Any]) -> Any:
        extra = sorted(set(arguments) - names)
        if extra:
            raise ApiError(422, "unknown_field", "not an argument of this tool (see the tool's schema)", extra[0])
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
    "value": "the value: text, a number, true/false, a list or an object (any JSON; an integer within signed 64 "
    "bits, nested at most 32 levels); a new value for the same subject/key/scope supersedes the old one",
    "content": "the memory as one sentence in natural language (searched by recall)",
    "kind": "state (default; a new value supersedes), preference (with valid_to: a temporary override), "
    "event, or episodic (append-only, no key)",
    "entities": "ids the memory is about besides the subject (exact recall cues), e.g. P1",
    "aliases": "other names of the key or value a question may use (exact recall cues)",
    "tags": "free labels recall can filter on (filters.tags)",
    "source": "where the memory comes from",
    "confidence": "0 to 1; default 0.8, and 1.0 for an explicit source (the only value it may have then)",
    "importance": "0 to 1, default 0.5: a ranking prior of recall",
    "valid_from": "when it became true (RFC 3339 with an offset; default: now)",
    "valid_to": "when it stops being true (RFC 3339); a preference with valid_to overrides only inside its window",
    "observed_at": "when it was learnt (RFC 3339; default: now)",
}
_SOURCE_NOTES = {
    "type": "explicit (the user said it; confidence 1.0), inferred (concluded, e.g. by a model), imported (from "
    "another system), or system (the default: recorded by a service)",
    "service": "the service or agent that recorded it, e.g. chat",
    "ref": "where exactly: a message, document or ticket id",
    "actor": "who said or did it, e.g. a user id",
}
# what `value` may hold, spelled out (the contract types it as any JSON; a model needs the choices)
_JSON_VALUE = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "object", "array", "null")]}


_REMEMBER_REQUIRED = ("event_id", "subject", "content")


def _remember_schema() -> dict[str, Any]:
    """The event contract's published schema (what it takes: null for "not given" too), with notes for a model."""
    schema = inline_refs(event_schema())
    props = {k: schema["properties"][k] for k in _REMEMBER_FIELDS}
    for name, note in _REMEMBER_NOTES.items():
        props[name] = {**props[name], "description": note}
    props["value"] = {**{k: v for k, v in props["value"].items() if k != "anyOf"}, **_JSON_VALUE}
    for name in _REMEMBER_REQUIRED:  # a memory has them: no null
        node = props[name]
        kept = [branch for branch in node.get("anyOf", []) if branch.get("type") != "null"]
        if kept:
            props[name] = {**{k: v for k, v in node.items() if k not in ("anyOf", "default")}, **kept[0]}
    source = next(branch for branch in props["source"].get("anyOf", [props["source"]]) if "properties" in branch)
    source["properties"] = {k: {**v, "description": _SOURCE_NOTES[k]} for k, v in source["properties"].items()}
    props["tenant"] = _optional_tenant(props["tenant"])
    return {
        "type": "object",
        "properties": props,
        "required": list(_REMEMBER_REQUIRED),
        "additionalProperties": False,
    }


REMEMBER_SCHEMA = _remember_schema()


def _remember_event(arguments: dict[str, Any]) -> dict[str, Any]:
    """The event the door judges (the contract validates it there, naming the field)."""
    extra = sorted(set(arguments) - set(REMEMBER_SCHEMA["properties"]))
    if extra:
        raise ApiError(422, "unknown_field", "not a field of a memory (see the tool's schema)", extra[0])
    if arguments.get("event_id") is None:
        raise ApiError(
            422, "missing_field", "choose an id for the memory: a retry with the same id is safe", "event_id"
        )
    if not isinstance(arguments["event_id"], str):
        raise ApiError(422, "wrong_type", "event_id is text: the id you chose for the memory", "event_id")
    return {"type": EventType.ASSERTED.value, **arguments}


# -- the tools ------------------------------------------------------------------------------------------------

_RECALL = _schema(RecallBody, drop=("as_of", "known_at"))
_RECALL_AT = _schema(RecallAtBody)
_FACTS = _schema(FactsPage)
_HISTORY = _schema(HistoryPage)
_FORGET = _schema(ForgetParams)
_CONTEXT = _schema(ContextBody)
_EVENT_STATUS = _schema(EventStatusParams)
_DEAD_LETTERS = _schema(dead_letters.DeadLettersParams)
_DEAD_LETTER = _schema(dead_letters.DeadLetterParams)
_REDRIVE = _schema(dead_letters.RedriveParams)
_DISCARD = _schema(dead_letters.DiscardParams)
_VERIFY = _schema(ReceiptBody)
_REPLAY = _schema(ReplayBody)


# -- what the tools answer ------------------------------------------------------------------------------------


def _output(model: type[BaseModel], *, drop: tuple[str, ...] = (), add: dict[str, Any] | None = None) -> dict:
    """A response model's JSON schema as a tool's output schema: references inlined, `drop` left out, `add` added."""
    schema = inline_refs(model.model_json_schema(mode="serialization"))
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in drop} | (add or {})
    schema["required"] = [k for k in schema.get("required", []) if k not in drop]
    return schema


# remember: the door's result of its one event; a refused event is a tool error, so no `accepted` and no `error`
_REMEMBERED = _output(
    EventResult,
    drop=("accepted", "error"),
    add={k: _output(PublishResponse)["properties"][k] for k in ("idempotency_note", "consistency_token")},
)
_ACTION = {
    "retract": "a memory.retracted of the fact, version or episode is in the ledger",
    "erase": "a subject.erased of the subject is in the ledger",
}
_FORGOTTEN = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": list(_ACTION),
            "description": "; ".join(f"{k}: {v}" for k, v in _ACTION.items()),
        }
    },
    "required": ["action"],
    "anyOf": [
        _REMEMBERED  # a retraction: the door's result of its event, as remember's
        | {
            "properties": _REMEMBERED["properties"]
            | {
                "action": {"const": "retract", "description": _ACTION["retract"]},
                "target_note": {
                    "type": "string",
                    "description": "PostgreSQL could not be asked whether the target exists: published unchecked",
                },
            }
        },
        _output(ErasureResponse, add={"action": {"const": "erase", "description": _ACTION["erase"]}}),
    ],
}


class SessionTokens:
    """The last writes of each session (caller key, tenant) as one consistency token, for its reads to wait for.

    Bounded (the least recently written sessions are forgotten first: their reads then wait for nothing, as a
    new session's); a token only names ledger positions, so keeping it tells no one anything."""

    def __init__(self, size: int = 10_000) -> None:
        self._tokens: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def wrote(self, tenants: frozenset[str], tenant: str, token: str | None) -> None:
        if token is None:
            return
        key = (caller_of(tenants), tenant)
        with self._lock:
            merged = merge_tokens(self._tokens.pop(key, None), token)
            assert merged is not None
            self._tokens[key] = merged
            while len(self._tokens) > self._size:
                self._tokens.popitem(last=False)

    def after(self, tenants: frozenset[str], tenant: str, given: str | None) -> str | None:
        """What a read of this session waits for: its last writes and the `after` it gave."""
        with self._lock:
            last = self._tokens.get((caller_of(tenants), tenant))
        return merge_tokens(last, given)


SESSIONS = SessionTokens()


def _waiting(tenants: frozenset[str], p: Any) -> Any:
    """The read's parameters with `after` = the session's last writes and the one given."""
    after = SESSIONS.after(tenants, p.tenant, p.after)
    return p if after == p.after else p.model_copy(update={"after": after})


async def _remember(res: Resources, tenants: frozenset[str], event: dict[str, Any]) -> dict[str, Any]:
    try:
        done = await writes.publish_one(res, tenants, event)
    except ApiError as exc:  # a refusal of the event as a whole (too large once encoded) names the tool's arguments
        if exc.status != 422 or exc.field is not None:
            raise
        raise ApiError(exc.status, exc.code, exc.message, "arguments", headers=exc.headers) from None
    SESSIONS.wrote(tenants, event["tenant"], done.get("consistency_token"))
    return done


async def _recall(res: Resources, tenants: frozenset[str], body: RecallBody) -> dict[str, Any]:
    return await reads.recall(res, tenants, _waiting(tenants, body))


async def _facts(res: Resources, tenants: frozenset[str], p: FactsPage) -> dict[str, Any]:
    p = _waiting(tenants, p)
    return await reads.subject_facts(
        res, tenants, p.tenant, p.subject, p.as_of, p.known_at, p.after, offset=p.offset, limit=p.limit
    )


async def _history(res: Resources, tenants: frozenset[str], p: HistoryPage) -> dict[str, Any]:
    p = _waiting(tenants, p)
    return await reads.history(res, tenants, p.tenant, p.memory_id, p.after, offset=p.offset, limit=p.limit)


async def _forget(res: Resources, tenants: frozenset[str], p: ForgetParams) -> dict[str, Any]:
    # what it retracts may be this session's own `remember`: looked for once the projection has the session's writes
    done = await writes.forget(res, tenants, p, after=SESSIONS.after(tenants, p.tenant, None))
    SESSIONS.wrote(tenants, p.tenant, done.get("consistency_token"))
    return done


async def _context(res: Resources, tenants: frozenset[str], body: ContextBody) -> CallToolResult:
    block = await reads.context(res, tenants, _waiting(tenants, body))
    text = block.text if body.format == "text" else orjson.dumps(block.doc).decode()
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=block.doc)


async def _event_status(res: Resources, tenants: frozenset[str], p: EventStatusParams) -> dict[str, Any]:
    return await writes.event_status(res, tenants, p.tenant, p.event_id)


async def _dead_letters(res: Resources, tenants: frozenset[str], p: dead_letters.DeadLettersParams) -> dict[str, Any]:
    return await dead_letters.list_letters(res, tenants, p.tenant, p.state, p.after, p.limit)


async def _dead_letter(res: Resources, tenants: frozenset[str], p: dead_letters.DeadLetterParams) -> dict[str, Any]:
    return await dead_letters.open_letter(res, tenants, p.tenant, p.partition, p.offset)


async def _redrive(res: Resources, tenants: frozenset[str], p: dead_letters.RedriveParams) -> dict[str, Any]:
    done = await dead_letters.redrive_dead_letter(res, tenants, p.tenant, p.partition, p.offset, p.event)
    SESSIONS.wrote(tenants, p.tenant, done.get("consistency_token"))
    return done


async def _discard(res: Resources, tenants: frozenset[str], p: dead_letters.DiscardParams) -> dict[str, Any]:
    done = await dead_letters.discard_dead_letter(res, tenants, p.tenant, p.partition, p.offset, p.reason)
    SESSIONS.wrote(tenants, p.tenant, done.get("consistency_token"))
    return done


async def _verify_receipt(res: Resources, tenants: frozenset[str], p: ReceiptBody) -> dict[str, Any]:
    return await receipts.verify(res, tenants, p)


async def _replay_receipt(res: Resources, tenants: frozenset[str], p: ReplayBody) -> dict[str, Any]:
    return await receipts.replay(res, tenants, p)


def _hints(*, read_only: bool, destructive: bool = False, idempotent: bool = True) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent, open_world_hint=False
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Remember",
        "Store a fact (subject, key, value) or an episode (kind episodic) in long-term memory; "
        "retrying with the same event_id is safe; this session's later reads see it (they wait for it briefly).",
        REMEMBER_SCHEMA,
        _hints(read_only=False, destructive=False, idempotent=True),
        _remember_event,
        _remember,
        _REMEMBERED,
    ),
    ToolSpec(
        "recall",
        "Recall",
        "Find the memories that answer a question, exact matches first, each hit saying why it matched; pass "
        "subject when the question is about one subject (a user, a project).",
        _RECALL,
        _hints(read_only=True),
        _model(RecallBody, _RECALL),
        _recall,
        _output(RecallResponse),
    ),
    ToolSpec(
        "recall_at",
        "Recall as of a time",
        "Recall as the facts stood at a past valid time (as_of), optionally as the ledger knew them at known_at.",
        _RECALL_AT,
        _hints(read_only=True),
        _model(RecallAtBody, _RECALL_AT),
        _recall,
        _output(RecallResponse),
    ),
    ToolSpec(
        "facts",
        "Facts of a subject",
        "List a subject's facts in force now (or at as_of, optionally as known at known_at): its profile, a page "
        "at a time (limit, default 100; page.next_offset is the next page's offset).",
        _FACTS,
        _hints(read_only=True),
        _model(FactsPage, _FACTS),
        _facts,
        _output(FactsResponse),
    ),
    ToolSpec(
        "fact_history",
        "History of a fact",
        "Show every version of one fact (by memory_id), oldest first, with when each held and what replaced it, a "
        "page at a time (limit, default 100; page.next_offset is the next page's offset).",
        _HISTORY,
        _hints(read_only=True),
        _model(HistoryPage, _HISTORY),
        _history,
        _output(HistoryResponse),
    ),
    ToolSpec(
        "forget",
        "Forget",
        "Retract a fact, one version of it or an episode so it is no longer in force, or erase everything about a "
        "subject permanently; answers when the ledger has it (effect pending: event_status says what it did).",
        _FORGET,
        _hints(read_only=False, destructive=True, idempotent=False),
        _model(ForgetParams, _FORGET),
        _forget,
        _FORGOTTEN,
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
        _output(ContextResponse),
    ),
    ToolSpec(
        "event_status",
        "Status of an event",
        "Tell what became of an event you published, by its event_id: pending, applied (with its effect), "
        "duplicate (its subject was erased), dead_lettered (with the reason), or unknown.",
        _EVENT_STATUS,
        _hints(read_only=True),
        _model(EventStatusParams, _EVENT_STATUS),
        _event_status,
        _output(EventStatus),
    ),
    ToolSpec(
        "verify_receipt",
        "Verify a receipt",
        "Check the receipt an answer (recall, facts, fact_history, context) came with: whether it is this ledger's "
        "signature and whether every memory it cites is still in the ledger as it was (or was erased since, and when).",
        _VERIFY,
        _hints(read_only=True),
        _model(ReceiptBody, _VERIFY),
        _verify_receipt,
        _output(ReceiptVerification),
    ),
    ToolSpec(
        "replay_receipt",
        "Replay a receipt",
        "Re-derive the answer a receipt came with, as the ledger knew it then, from the same arguments, and tell "
        "whether it is the same answer (part by part).",
        _REPLAY,
        _hints(read_only=True),
        _model(ReplayBody, _REPLAY),
        _replay_receipt,
        _output(ReceiptReplay),
    ),
    ToolSpec(
        "dead_letters",
        "Dead letters (operators)",
        "List the tenant's dead letters (records the ledger's worker refused) with their reason, field and ledger "
        "position, and whether each is open, redriven or discarded.",
        _DEAD_LETTERS,
        _hints(read_only=True),
        _model(dead_letters.DeadLettersParams, _DEAD_LETTERS),
        _dead_letters,
        _output(DeadLettersResponse),
        admin=True,
    ),
    ToolSpec(
        "dead_letter",
        "Open a dead letter (operators)",
        "Show one dead letter by its partition and offset, with the refused record's fields as far as they decode.",
        _DEAD_LETTER,
        _hints(read_only=True),
        _model(dead_letters.DeadLetterParams, _DEAD_LETTER),
        _dead_letter,
        _output(DeadLetterRecord),
        admin=True,
    ),
    ToolSpec(
        "redrive_dead_letter",
        "Re-drive a dead letter (operators)",
        "Publish the corrected event for an open dead letter, linked to it; the letter reads redriven once the "
        "worker applied the event (event_status says what it did).",
        _REDRIVE,
        _hints(read_only=False, destructive=False, idempotent=True),
        _model(dead_letters.RedriveParams, _REDRIVE),
        _redrive,
        _output(DeadLetterAction),
        admin=True,
    ),
    ToolSpec(
        "discard_dead_letter",
        "Discard a dead letter (operators)",
        "Close an open dead letter without a correction, with a reason (an event on the ledger; nothing is deleted).",
        _DISCARD,
        _hints(read_only=False, destructive=False, idempotent=True),
        _model(dead_letters.DiscardParams, _DISCARD),
        _discard,
        _output(DeadLetterAction),
        admin=True,
    ),
)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def error_result(status: int, *items: dict[str, Any]) -> CallToolResult:
    """A tool error in the API's one error shape, with the status the HTTP route would have answered, as its text.

    No structured content: clients check a result's structured content against the tool's output schema (the
    success shape) even when it is an error, and would answer their own validation failure instead of this one."""
    body = {"status": status, **error_body(*items)}
    return CallToolResult(content=[TextContent(type="text", text=_json(body))], is_error=True)


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
            if isinstance(exc, psycopg.OperationalError):
                res.postgres_failed()  # the other idle connections may have been ended with this one
            return error_result(503, failure.item())
        log.error("mcp %s: unhandled %s", spec.name, type(exc).__name__, exc_info=exc)
        message = f"internal error ({type(exc).__name__}); it is logged"
        return error_result(500, {"code": "internal_error", "field": None, "message": message})
    if isinstance(result, CallToolResult):
        return result
    text = await run_in_threadpool(_json, result)  # a subject's whole profile can be megabytes: off the event loop
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=result)
