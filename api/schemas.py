"""Response models: what each route's 2xx body holds, for /docs and /openapi.json.

The routes build their bodies as dicts and return orjson Responses (the read paths are hot);
FastAPI does not validate a returned Response, so these models document the bodies
(`response_model=` / `responses=` in the route decorators) at no cost per request.
tests/test_api_schema.py checks that real answers validate against them and carry no field a
model does not declare, so a field added to a body without its model fails a test. Models allow
extra fields (`additionalProperties: true` in the spec): a client must ignore fields it does not
know, so adding one is never a breaking change.

Times: every time in a response is a `Timestamp`, spelled by `producers.contract.rfc3339` (UTC,
microseconds, `Z`: `2026-01-02T03:04:05.000000Z`).

Error bodies (4xx, 5xx) are api.errors.ErrorBody, the one error shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from api.errors import ErrorBody, ErrorItem
from producers.contract import parse_rfc3339, rfc3339
from projections.search.recall import Mode
from projections.versions import EFFECTS

__all__ = [
    "Body",
    "ErasureResponse",
    "EventResult",
    "EventsResponse",
    "FactVersion",
    "FactsResponse",
    "HealthResponse",
    "HistoryResponse",
    "LedgerEvent",
    "PublishErrorBody",
    "PublishResponse",
    "RecallResponse",
    "StatsResponse",
    "Timestamp",
]

TIME_EXAMPLE = rfc3339(parse_rfc3339("2026-01-02T03:04:05Z"))


def _a_time(value: str) -> str:
    parse_rfc3339(value)  # ValueError (a validation error) for anything that is not an RFC 3339 time
    return value


Timestamp = Annotated[
    str,
    AfterValidator(_a_time),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339, UTC, microseconds, Z (producers.contract.rfc3339)",
            "examples": [TIME_EXAMPLE],
        }
    ),
]
"""A time in a response: the string producers.contract.rfc3339 spells (validated as any RFC 3339 time)."""


class Body(BaseModel):
    """A response object: the fields it documents, and possibly more later (clients ignore unknown fields)."""

    model_config = ConfigDict(extra="allow")


# -- POST /v1/events ------------------------------------------------------------------------------


class EventResult(Body):
    """What happened to one event of the request."""

    event_id: str | None
    accepted: bool
    duplicate: bool | None = Field(None, description="true: this (tenant, event_id) was already there")
    erased: bool | None = Field(None, description="true: its subject was erased since; nothing published")
    memory_id: str | None = None
    version_id: str | None = Field(None, description="the version a memory.asserted creates (tenant-scoped)")
    partition: int | None = None
    offset: int | None = None
    error: ErrorItem | None = None


class PublishResponse(Body):
    results: list[EventResult]
    idempotency_checked: bool = Field(description="false: PostgreSQL was not asked about the ids (see the note)")
    idempotency_note: str | None = None


class PublishErrorBody(ErrorBody):
    """An error response of POST /v1/events: the one error shape, plus per-event results when there are events."""

    results: list[EventResult] | None = None
    idempotency_checked: bool | None = None
    idempotency_note: str | None = None


# -- facts, history, the audit replay ------------------------------------------------------------------


class FactVersion(Body):
    """One version of a fact, as PostgreSQL holds it (projections.postgres.queries.version_dict)."""

    memory_id: str
    version_id: str = Field(description="version_id_for(tenant, event_id): unique across tenants")
    event_id: str = Field(description="the assertion that made this version, as its producer named it")
    version: int = Field(description="1, 2, ... in the fact's chain")
    tenant: str
    subject: str
    key: str | None
    scope: str
    kind: str
    value: Any
    content: str
    entities: list[str]
    aliases: list[str]
    tags: list[str]
    source: dict[str, Any]
    confidence: float
    importance: float
    observed_at: Timestamp
    valid_from: Timestamp
    valid_to: Timestamp | None
    override: bool = Field(description="a temporary override (a preference with valid_to)")
    status: str = Field(description="active, superseded or retracted")
    superseded_by: str | None
    superseded_at: Timestamp | None
    confirmed_count: int
    last_confirmed_at: Timestamp | None
    partition: int
    offset: int


class FactsResponse(Body):
    tenant: str
    subject: str
    as_of: Timestamp = Field(description="the valid time the facts hold at (the request's as_of, or now)")
    facts: list[FactVersion]


class HistoryResponse(Body):
    memory_id: str
    tenant: str
    versions: list[FactVersion] = Field(description="oldest first")


class Effect(Body):
    """What an event does in the subject's chains now (projections.versions.effects)."""

    effect: Literal[EFFECTS]  # type: ignore[valid-type]  # the tuple of effect names
    version_id: str | None = Field(description="the version it made, ended or confirmed")
    detail: str


class LedgerEvent(Body):
    """One applied event of the subject, in ledger order."""

    event_id: str
    type: str
    kind: str
    memory_id: str | None = Field(description="null for subject.erased")
    key: str | None
    scope: str
    partition: int
    offset: int
    observed_at: Timestamp
    valid_from: Timestamp | None
    valid_to: Timestamp | None
    target_version: str | None = Field(description="the version a memory.retracted names, if any")
    effect: Effect
    event: dict[str, Any] = Field(description="the event as the ledger holds it")


class EventsResponse(Body):
    tenant: str
    subject: str
    events: list[LedgerEvent]


# -- POST /v1/recall ------------------------------------------------------------------------------------


class AliasMatch(Body):
    phrase: str
    keys: list[str]


class TimeCue(Body):
    words: str
    from_: Timestamp = Field(alias="from")
    to: Timestamp


class RecallCues(Body):
    """What recall read in the query (projections.search.cues)."""

    entities: list[str]
    known_entities: list[str]
    keys: list[str]
    aliases: list[AliasMatch]
    event_types: list[str]
    time: TimeCue | None
    terms: list[str]


class MatchedCues(Body):
    """The query's cues this hit carries (only the non-empty ones)."""

    entities: list[str] | None = None
    keys: list[str] | None = None
    event_types: list[str] | None = None
    time: str | None = None


class Verified(Body):
    candidate: str = Field(description="the version the index proposed")
    replaced_by: str | None = Field(None, description="the version that holds at as_of instead (PostgreSQL)")


class Match(Body):
    stage: Literal["exact", "keyword", "semantic", "hybrid"]
    cues: MatchedCues
    scores: dict[str, float] = Field(description="bm25, cosine, rrf (fuzzy stages), prior, overlap")
    verified: Verified


class RecallHit(Body):
    """A fact holding at as_of, rebuilt from its PostgreSQL row, with why it matched."""

    memory_id: str
    version_id: str
    event_id: str
    version: int
    subject: str
    key: str | None
    scope: str
    value: Any
    content: str
    kind: str
    status: str
    valid_from: Timestamp
    valid_to: Timestamp | None
    observed_at: Timestamp
    source: dict[str, Any]
    score: float = Field(description="exact hits in [1, 2), fuzzy hits in [0, 1)")
    match: Match


class RecallTrace(Body):
    stages_ms: dict[str, float]
    embedding_computed: bool
    mode: Mode
    exact_candidates: int | None = None
    fuzzy_candidates: int | None = None
    total_ms: float
    as_of: Timestamp


class RecallResponse(Body):
    hits: list[RecallHit]
    cues: RecallCues
    trace: RecallTrace


# -- GET /v1/stats ---------------------------------------------------------------------------------------


class PartitionLag(Body):
    end_offset: int | None
    position: int
    lag: int | None


class OrphanExamples(Body):
    missing_in_es: list[str]
    missing_in_pg: list[str]


class SearchOrphans(Body):
    """Invariant 4: version ids only in PostgreSQL or only in the index (meaningful once outbox_pending is 0)."""

    missing_in_es: int
    missing_in_pg: int
    examples: OrphanExamples
    outbox_pending: int
    pg_versions: int
    es_documents: int


class StatsResponse(Body):
    tenant: str
    double_active: int
    chain_integrity_violations: int
    explicit_confidence_violations: int
    events_applied: int
    versions: int
    dlq_count: int = Field(description="dead letters of the whole topic")
    search_outbox_pending: int
    consumer: str
    topic: str
    lag: dict[str, PartitionLag] = Field(description="per partition")
    total_lag: int
    search: SearchOrphans


# -- DELETE /v1/subjects/{subject} ----------------------------------------------------------------------------


class ErasureResponse(Body):
    event_id: str
    type: Literal["subject.erased"]
    tenant: str
    subject: str
    partition: int
    offset: int


# -- GET /v1/health ---------------------------------------------------------------------------------------------


class HealthPart(Body):
    ok: bool
    ms: float | None = Field(None, description="how long it took to answer (when ok)")
    error: str | None = Field(None, description="why not (when not ok)")
    status: str | None = Field(None, description="elasticsearch: the cluster's status")
    age_s: float | None = Field(None, description="kafka: the age of the broker's answer (reused for 1 s)")


class HealthParts(Body):
    postgres: HealthPart
    elasticsearch: HealthPart
    kafka: HealthPart


class HealthResponse(Body):
    status: Literal["ok", "degraded"]
    parts: HealthParts
    detail: list[ErrorItem] | None = Field(None, description="503 only: one store_unavailable item per part down")
