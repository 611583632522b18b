"""Request models: what the routes' bodies and the MCP tools' arguments may hold, validated once.

The HTTP routes validate their bodies with these models (FastAPI), and the MCP server (api.mcp)
validates each tool's arguments with the same ones, so a bad argument is refused by the same rule
with the same code and field either way (api.errors.validation_items). The GET routes declare their
parameters in their signatures; the models of their parameters here (`FactsParams`, `HistoryParams`)
use the same validators and limits (`TENANT`, `SUBJECT`, `Storable`, `Time`), for the MCP tools.

Time fields are the contract's strict RFC 3339 (`api.deps.Time`): a Unix number is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from api.deps import Storable, Time, storable
from producers.contract import Kind, SourceType
from projections.search.recall import Mode, RecallFilters
from projections.search.recall.neighbours import MAX_CONTEXT_TURNS

__all__ = [
    "MEMORY_ID",
    "SUBJECT",
    "TENANT",
    "ContextBody",
    "FactsParams",
    "Filters",
    "ForgetParams",
    "HistoryParams",
    "RecallAtBody",
    "RecallBody",
    "inline_refs",
]

# the limits the routes' path and query parameters declare too (api.routes.subjects, facts, erasure)
TENANT = {"min_length": 1, "max_length": 128}
SUBJECT = {"min_length": 1, "max_length": 256}
MEMORY_ID = {"min_length": 1, "max_length": 256}

_Values = str | list[str] | None


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with its `$defs` references inlined: embedded as it is in the OpenAPI spec (the events
    route) and in an MCP tool's input schema, where a client may not resolve references."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                return resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: resolve(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def _as_tuple(v: _Values) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def _not_blank(v: str | None) -> str | None:
    if v is not None and not v.strip():
        raise ValueError("must not be blank")
    return v


class Filters(BaseModel):
    """Each filter takes one value or a list (any of them matches)."""

    model_config = ConfigDict(extra="forbid")

    kind: _Values = None
    key: _Values = None
    scope: _Values = None
    tags: _Values = None
    source_type: _Values = None

    @field_validator("kind", "key", "scope", "tags", "source_type")
    @classmethod
    def _storable(cls, v: _Values) -> _Values:
        for text in _as_tuple(v):  # a NUL could not be compared by PostgreSQL: 422 naming the filter
            storable(text)
        return v

    @field_validator("kind", "source_type")
    @classmethod
    def _known_values(cls, v: _Values, info: ValidationInfo) -> _Values:
        allowed = (Kind if info.field_name == "kind" else SourceType)._value2member_map_
        bad = [k for k in _as_tuple(v) if k not in allowed]
        if bad:
            raise ValueError(f"unknown {info.field_name} {bad[0]!r}: one of {', '.join(allowed)}")
        return v

    def to_engine(self) -> RecallFilters:
        return RecallFilters(**{name: _as_tuple(getattr(self, name)) for name in RecallFilters.__dataclass_fields__})


class RecallBody(BaseModel):
    """`POST /v1/recall`; the MCP `recall` tool (without the times) and `recall_at` (`RecallAtBody`)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subject: Storable | None = Field(default=None, **SUBJECT)
    query: Storable = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=5, ge=1, le=100)
    as_of: Time | None = Field(default=None, description="valid time: RFC 3339 with seconds and an offset")
    known_at: Time | None = Field(
        default=None,
        description="transaction time: each hit as the ledger knew it then (events observed by known_at)",
    )
    mode: Mode = "auto"
    filters: Filters | None = None
    explain: bool = Field(
        default=False, description="list each stage's candidates (ids, stage score, best first; up to 20) in the trace"
    )
    rerank: bool | None = Field(
        default=None, description="rerank the first fuzzy hits with the cross-encoder (null: LEDGER_RERANK_ENABLED)"
    )
    context_turns: int = Field(
        default=0,
        ge=0,
        le=MAX_CONTEXT_TURNS,
        description="with each episode hit, this many neighbouring turns on each side (same tenant and source "
        "service, observed within LEDGER_RECALL_CONTEXT_WINDOW_S), as its `context`",
    )

    _query_not_blank = field_validator("query")(_not_blank)


class RecallAtBody(RecallBody):
    """The MCP `recall_at` tool: recall as of a valid time (required here), optionally as known at a later one."""

    as_of: Time = Field(description="valid time: RFC 3339 with seconds and an offset")


class FactsParams(BaseModel):
    """`GET /v1/subjects/{subject}/facts` as one model (the MCP `facts` tool)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subject: Storable = Field(**SUBJECT)
    as_of: Time | None = Field(default=None, description="valid time (default now)")
    known_at: Time | None = Field(default=None, description="only what was observed by this transaction time")


class HistoryParams(BaseModel):
    """`GET /v1/facts/{memory_id}/history` as one model (the MCP `fact_history` tool)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    memory_id: Storable = Field(**MEMORY_ID)


class ForgetParams(BaseModel):
    """The MCP `forget` tool: retract a fact (`key`, optionally one `target_version`) or erase the subject.

    A retraction is a `memory.retracted` event through the publish door (api.writes.publish_events);
    an erasure is `DELETE /v1/subjects/{subject}` (api.writes.erase_subject). Exactly one of `key`
    and `erase_subject` (api.writes.forget says which is missing or too many).
    """

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subject: Storable = Field(**SUBJECT)
    key: Storable | None = Field(default=None, min_length=1, max_length=256)
    scope: Storable = Field(default="", max_length=256)
    target_version: Storable | None = Field(default=None, min_length=1, max_length=64)
    erase_subject: bool = False
    reason: Storable | None = Field(default=None, max_length=1024)
    event_id: Storable | None = Field(default=None, min_length=1, max_length=128)


ContextFormat = Literal["text", "json"]


class ContextBody(BaseModel):
    """`POST /v1/context` and the MCP `context` tool: a prompt-ready memory block (api.context)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subject: Storable = Field(**SUBJECT)
    question: Storable | None = Field(
        default=None, min_length=1, max_length=2000, description="recall hits for it are listed first"
    )
    budget_tokens: int = Field(
        default=1000, ge=64, le=32_000, description="the whole block, counted with the embedding model's tokenizer"
    )
    format: ContextFormat = Field(default="text", description="text: the block to paste; json: the same, structured")
    include_history: bool = Field(default=False, description="also superseded, retracted and shadowed versions")
    as_of: Time | None = Field(default=None, description="valid time (default now; pass it for reproducible blocks)")
    top_k: int = Field(default=5, ge=1, le=50, description="recall hits for the question")
    mode: Mode = "auto"

    _question_not_blank = field_validator("question")(_not_blank)
