"""Request models: what the routes' bodies and the MCP tools' arguments may hold, validated once.

The HTTP routes and the MCP tools validate with the same models, so a bad argument is refused by the same rule
with the same code and field either way. The GET routes' parameters have models here too (`FactsParams`,
`HistoryParams`), with the same validators, for the MCP tools. Times are strict RFC 3339; `after` must be a token.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, TypeAdapter, ValidationInfo, field_validator

from api.consistency import After
from api.deps import CURSOR_NOTE, Cursor, Named, Storable, Time, storable
from producers.contract import MAX_VALUE_DEPTH, TENANT_MAX, TENANT_PATTERN, Kind, SourceType
from projections.search.recall import Mode, RecallFilters
from projections.search.recall.neighbours import MAX_CONTEXT_TURNS

__all__ = [
    "EVENT_ID",
    "LIMIT",
    "MEMORY_ID",
    "OFFSET",
    "SUBJECT",
    "TENANT",
    "ContextBody",
    "EventStatusParams",
    "EventsParams",
    "FactsPage",
    "FactsParams",
    "Filters",
    "ForgetParams",
    "HistoryPage",
    "HistoryParams",
    "RecallAtBody",
    "RecallBody",
    "ReceiptBody",
    "ReplayBody",
    "TenantRequest",
    "inline_refs",
]

# the limits the routes' path and query parameters declare too (api.routes.subjects, facts, erasure)
TENANT = {"min_length": 1, "max_length": TENANT_MAX, "pattern": TENANT_PATTERN}  # the contract's: malformed is a 422
SUBJECT = {"min_length": 1, "max_length": 256}
MEMORY_ID = {"min_length": 1, "max_length": 256}
EVENT_ID = {"min_length": 1, "max_length": 128}  # the contract's event_id
# a page of a listing (facts, a fact's history): where it starts and at most how many items it holds
OFFSET = {"ge": 0, "le": 1_000_000_000}
LIMIT = {"ge": 1, "le": 10_000}
# the MCP tools' pages are smaller: the SDK walks a tool's whole answer with pydantic on the event loop (tens of
# microseconds per item), so a page of a thousand facts holds the loop for tens of milliseconds, not a second
MCP_LIMIT = {"ge": 1, "le": 1_000}
MCP_DEFAULT_LIMIT = 100
OFFSET_NOTE = "skip this many items of the whole list: a page's start (the previous page's page.next_offset)"

_Values = str | list[str] | None

# what a model (and a generated client) reads of an argument; the MCP tools take theirs from these fields
TENANT_NOTE = "the tenant whose memory this is"
MODE_NOTE = (
    "how to search: auto (the default) tries the exact cues first (the ids, subjects, keys and aliases the query "
    "names) and falls back to keyword and semantic search only when they found nothing; exact: the exact cues "
    "only; keyword: full-text (BM25) search only; semantic: embedding similarity only; hybrid: the exact cues "
    "first, then keyword and semantic search fused, always"
)
MAX_FILTER_VALUES = 1_000  # values of one filter
MAX_FILTER_CHARS = 256  # a filter value's length: the longest key, scope or tag the contract stores
_ONE_OR_MORE = f"one value or a list of at most {MAX_FILTER_VALUES} (any of them matches)"


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


class TenantRequest(BaseModel):
    """A request about one tenant's memory: its tenant first, and a field it does not know refused (naming it)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(description=TENANT_NOTE, **TENANT)


class Filters(BaseModel):
    """Each filter takes one value or a list (any of them matches)."""

    model_config = ConfigDict(extra="forbid")

    kind: _Values = Field(default=None, description=f"the memory's kind: {', '.join(Kind)}; {_ONE_OR_MORE}")
    key: _Values = Field(default=None, description=f"the fact's key, e.g. pref.seat; {_ONE_OR_MORE}")
    scope: _Values = Field(default=None, description=f"the key's scope ('' for none); {_ONE_OR_MORE}")
    tags: _Values = Field(default=None, description=f"a tag the memory carries; {_ONE_OR_MORE}")
    source_type: _Values = Field(default=None, description=f"who said it: {', '.join(SourceType)}; {_ONE_OR_MORE}")

    @field_validator("kind", "key", "scope", "tags", "source_type")
    @classmethod
    def _storable(cls, v: _Values) -> _Values:
        values = _as_tuple(v)
        if len(values) > MAX_FILTER_VALUES:  # past Elasticsearch's terms limit a search fails: 422, never a 500
            raise ValueError(f"at most {MAX_FILTER_VALUES} values, got {len(values)}")
        for text in values:  # a NUL could not be compared by PostgreSQL: 422 naming the filter
            storable(text)
            if len(text) > MAX_FILTER_CHARS:  # longer than any stored key, scope or tag: it could match nothing
                raise ValueError(f"a value is at most {MAX_FILTER_CHARS} characters, got {len(text)}")
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


class RecallBody(TenantRequest):
    """`POST /v1/recall`; the MCP `recall` tool (without the times) and `recall_at` (`RecallAtBody`)."""

    subject: Named | None = Field(
        default=None,
        description="only this subject's memories, e.g. user:42. Pass it whenever the question is about one "
        "subject (a user, a project): without it every subject of the tenant is searched, and another subject's "
        "memories may answer",
        **SUBJECT,
    )
    query: Storable = Field(
        min_length=1, max_length=2000, description="the question or the words to look for, in natural language"
    )
    top_k: int = Field(default=5, ge=1, le=100, strict=True, description="at most this many hits, best first")
    as_of: Time | None = Field(default=None, description="valid time: RFC 3339 with seconds and an offset")
    known_at: Time | None = Field(
        default=None,
        description="transaction time: the answer as the ledger knew it then (events observed by known_at): its "
        "hits, their grouped episodes and context turns",
    )
    mode: Mode = Field(default="auto", description=MODE_NOTE)
    filters: Filters | None = Field(
        default=None, description="only memories matching every filter given (kind, key, scope, tags, source_type)"
    )
    explain: bool = Field(
        default=False,
        strict=True,
        description="list each stage's candidates (ids, stage score, best first; up to 20) in the trace",
    )
    rerank: bool | None = Field(
        default=None,
        strict=True,
        description="rerank the first keyword/semantic hits with the cross-encoder (null: as the server is set up)",
    )
    context_turns: int = Field(
        default=0,
        strict=True,
        ge=0,
        le=MAX_CONTEXT_TURNS,
        description="with each episode hit, this many neighbouring turns on each side (same tenant and source "
        "service, observed within the server's context window, 30 minutes by default), as its `context`",
    )
    after: After = None
    receipt: bool = Field(
        default=True,
        strict=True,
        description="false: answer without a receipt (what the answer reflects, signed)",
    )

    _query_not_blank = field_validator("query")(_not_blank)


class RecallAtBody(RecallBody):
    """The MCP `recall_at` tool: recall as of a valid time (required here), optionally as known at a later one."""

    as_of: Time = Field(description="valid time: RFC 3339 with seconds and an offset")


class FactsParams(TenantRequest):
    """`GET /v1/subjects/{subject}/facts` as one model (the MCP `facts` tool)."""

    subject: Named = Field(description="the subject whose facts are listed, e.g. user:42", **SUBJECT)
    as_of: Time | None = Field(default=None, description="valid time (default now)")
    known_at: Time | None = Field(default=None, description="only what was observed by this transaction time")
    offset: int = Field(default=0, strict=True, description=OFFSET_NOTE, **OFFSET)
    limit: int | None = Field(
        default=None, strict=True, description="at most this many facts (default: every one)", **LIMIT
    )
    after: After = None


class FactsPage(FactsParams):
    """The MCP `facts` tool: FactsParams with a page bounded by default (MCP_LIMIT)."""

    limit: int = Field(  # type: ignore[assignment]
        default=MCP_DEFAULT_LIMIT, strict=True, description="at most this many facts (page on with offset)", **MCP_LIMIT
    )


class HistoryParams(TenantRequest):
    """`GET /v1/facts/{memory_id}/history` as one model (the MCP `fact_history` tool)."""

    memory_id: Named = Field(description="the fact's memory_id (as remember, recall and facts answer it)", **MEMORY_ID)
    offset: int = Field(default=0, strict=True, description=OFFSET_NOTE, **OFFSET)
    limit: int | None = Field(
        default=None, strict=True, description="at most this many versions (default: every one)", **LIMIT
    )
    after: After = None


class HistoryPage(HistoryParams):
    """The MCP `fact_history` tool: HistoryParams with a page bounded by default (MCP_LIMIT)."""

    limit: int = Field(  # type: ignore[assignment]
        default=MCP_DEFAULT_LIMIT,
        strict=True,
        description="at most this many versions (page on with offset)",
        **MCP_LIMIT,
    )


class EventStatusParams(TenantRequest):
    """`GET /v1/events/{event_id}` as one model (the MCP `event_status` tool)."""

    event_id: Named = Field(
        description="the event_id of an event you published (remember, forget, or any producer)", **EVENT_ID
    )


class ForgetParams(TenantRequest):
    """The MCP `forget` tool: retract a fact (`key`, optionally one `target_version`), one version or an episode
    (`target_version` alone: an episode has no key), or erase the subject.

    A retraction is a `memory.retracted` event through the publish door (api.writes.publish_events), of a fact or
    version the tenant's projection holds (else 404 naming the field); an erasure is `DELETE /v1/subjects/{subject}`
    (api.writes.erase_subject). Either `key` / `target_version` or `erase_subject` (api.writes.forget says which
    is missing or too many).
    """

    subject: Named = Field(description="what the memory is about, e.g. user:42", **SUBJECT)
    key: Named | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the fact to retract (with scope); leave out with erase_subject, and for an episode's "
        "target_version",
    )
    scope: Storable = Field(default="", max_length=256, description="the fact's scope ('' for none)")
    target_version: Named | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="retract only this version: of a fact, or an episode (a version_id from facts, fact_history "
        "or recall)",
    )
    erase_subject: bool = Field(
        default=False,
        strict=True,  # the destructive flag above all: "yes" or 1 is wrong_type, never an erasure
        description="true: erase everything about the subject, permanently (right to be forgotten)",
    )
    literal: bool = Field(
        default=False,
        strict=True,
        description="with erase_subject: erase exactly this subject even though it has no event and another "
        "subject reads the same (its case, width, Unicode form, white space at its ends, invisible characters or "
        "a dash's kind aside)",
    )
    reason: Storable | None = Field(
        default=None,
        max_length=1024,
        description="why, kept with the event (on an erasure readable for good, never sealed: say why, never who)",
    )
    event_id: Named | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="an id you choose for the retraction or the erasure (optional): a retry with it is a duplicate",
    )


ContextFormat = Literal["text", "json"]


class ContextBody(TenantRequest):
    """`POST /v1/context` and the MCP `context` tool: a prompt-ready memory block (api.context)."""

    subject: Named = Field(description="the subject the block is about, e.g. user:42", **SUBJECT)
    question: Storable | None = Field(
        default=None, min_length=1, max_length=2000, description="recall hits for it are listed first"
    )
    budget_tokens: int = Field(
        default=1000,
        strict=True,
        ge=64,
        le=32_000,
        description="the whole block, counted with the embedding model's tokenizer",
    )
    format: ContextFormat = Field(default="text", description="text: the block to paste; json: the same, structured")
    include_history: bool = Field(
        default=False, strict=True, description="also superseded, retracted and shadowed versions"
    )
    as_of: Time | None = Field(default=None, description="valid time (default now; pass it for reproducible blocks)")
    top_k: int = Field(default=5, ge=1, le=50, strict=True, description="recall hits for the question")
    mode: Mode = Field(default="auto", description=f"for the question's recall: {MODE_NOTE}")
    after: After = None

    _question_not_blank = field_validator("question")(_not_blank)


class EventsParams(TenantRequest):
    """`GET /v1/subjects/{subject}/events` as one model (a replayed receipt's request)."""

    model_config = ConfigDict(populate_by_name=True)

    subject: Named = Field(description="the subject whose events are listed", **SUBJECT)
    from_: Time | None = Field(default=None, alias="from", description="observed_at >= from (RFC 3339)")
    to: Time | None = Field(default=None, description="observed_at < to (RFC 3339)")
    limit: int = Field(default=10_000, ge=1, le=10_000, strict=True)
    cursor: Cursor = Field(default=None, max_length=32, description=CURSOR_NOTE)


MAX_CITED = 10_000  # the events of the largest audit replay page; a receipt citing more is not checked


@functools.cache
def _receipt_shape() -> TypeAdapter[Any]:
    from projections.shapes import Receipt  # only when a receipt is checked

    return TypeAdapter(Receipt)


def _a_receipt(value: dict[str, Any]) -> dict[str, Any]:
    # its fields and types (errors name receipt.<field>), and what reaches SQL within what a ledger holds (a
    # receipt's own values, never a database error); its signature: as sent. Validated as the shape's TypedDict,
    # not as the response model: a receipt of 10,000 cited events builds no 10,000 models, since the
    # request is validated on the event loop
    _receipt_shape().validate_python(value)
    if len(value["cited"]) > MAX_CITED:
        raise ValueError(f"a receipt cites at most {MAX_CITED:,} events (the audit replay's largest page)")
    return value


class _ReceiptRequest(TenantRequest):
    receipt: dict[str, Any] = Field(description="a receipt as an answer gave it (its `receipt`), unchanged")

    _receipt_shape = field_validator("receipt")(_a_receipt)


# an answer's own levels around the event values it shows (each nested at most MAX_VALUE_DEPTH): deeper, it is no
# answer of this service, and its canonical JSON would pass the serializer's depth limit (api.receipts.verify
# judges it with the digest, off the event loop for a large answer: a walk of megabytes takes a quarter second)
ANSWER_MAX_DEPTH = MAX_VALUE_DEPTH + 16


def within_depth(value: Any, limit: int) -> bool:
    """Whether `value` (JSON as parsed) is nested at most `limit` levels: iteratively, so no depth breaks it."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return False
            todo.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))
    return True


class ReceiptBody(_ReceiptRequest):
    """`POST /v1/receipts/verify` and the MCP `verify_receipt` tool."""

    # taken as parsed, not copied by validation (megabytes on the event loop): an object or null is all it must be
    answer: SkipValidation[dict[str, Any] | None] = Field(
        default=None, description="optionally the answer it came with: its digest is checked against the receipt's"
    )

    @field_validator("answer", mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError("must be a JSON object (an answer as it was given) or null")
        return value


class ReplayBody(_ReceiptRequest):
    """`POST /v1/receipts/replay` and the MCP `replay_receipt` tool."""

    request: dict[str, Any] = Field(
        description="the parameters of the read the receipt came from, as sent (recall's or context's body; "
        "facts: subject, as_of, known_at, offset, limit; history: memory_id, offset, limit; events: subject, from, "
        "to, limit); tenant may be left out (another than the replay's is refused). A page's offset and limit are "
        "parameters too, as the answer's `page` names them (the MCP tools answer pages of 100 unless told). The "
        "receipt holds only their digest"
    )
