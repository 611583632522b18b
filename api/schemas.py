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

Error bodies (4xx, 5xx) are `ErrorBody`, the one error shape (defined here, raised by api.errors).

Light on purpose: this module imports pydantic and our pure modules only (no FastAPI, no store
client), because the read client (api.client) types its results with these models;
tests/test_client.py fails if importing it loads a server library.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from producers.contract import parse_rfc3339, rfc3339
from projections.search.modes import Mode
from projections.versions import EFFECTS

__all__ = [
    "Body",
    "Consistency",
    "ConsistencyResponse",
    "ContextResponse",
    "DataKeyItem",
    "DeadLetterAction",
    "DeadLetterRecord",
    "DeadLettersResponse",
    "ErasureRecord",
    "ErasureResponse",
    "ErasuresResponse",
    "KeysResponse",
    "RetireResponse",
    "ErrorBody",
    "ErrorItem",
    "EventResult",
    "EventSchemaDocument",
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
    "SubjectsResponse",
    "TenantsResponse",
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


class ErrorItem(BaseModel):
    """One thing wrong with a request."""

    code: str = Field(description="stable machine-readable reason, e.g. missing, unstorable_text, store_unavailable")
    field: str | None = Field(description="dotted path of the culprit (events.2.tenant, as_of, X-API-Key), or null")
    message: str = Field(description="what is wrong, for a human")


class ErrorBody(BaseModel):
    """The body of every error response (4xx and 5xx)."""

    detail: list[ErrorItem]


class Body(BaseModel):
    """A response object: the fields it documents, and possibly more later (clients ignore unknown fields)."""

    model_config = ConfigDict(extra="allow")


# -- POST /v1/events ------------------------------------------------------------------------------


# what a write knows of its effect when it answers (api.writes.effect_pending)
WriteEffect = Literal["pending", "applied", "erased"]
_WRITE_EFFECT = (
    "pending: the event is in the ledger and the projection has not applied it yet; applied: a retry of an event "
    "applied before; erased: a retry of an event whose subject was erased since. What it did (or why it did "
    "nothing) is its status (status_url)"
)
_STATUS_URL = "GET this for what became of the event: pending, applied (+ effect), duplicate, dead_lettered"
_TOKEN = (
    "the ledger positions of what this wrote, opaque: pass it as `after` to any read to answer only once the read "
    "has it (null: nothing was written)"
)


class Consistency(Body):
    """A read given `after`: the write it waited for and what the answer reflects (api.consistency)."""

    after: str = Field(description="the consistency token the read was given")
    reflects: str = Field(description="the projection's positions the answer reflects, as a token (at least after)")
    stage: Literal["projection", "documents", "vectors"] = Field(
        description="what was waited for: the projection; and the search documents; and their vectors"
    )
    waited_ms: float


_CONSISTENCY = "given after: the write waited for and the positions the answer reflects"


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
    effect: WriteEffect | None = Field(None, description=_WRITE_EFFECT)
    status_url: str | None = Field(None, description=_STATUS_URL)
    error: ErrorItem | None = None


class PublishResponse(Body):
    results: list[EventResult]
    idempotency_checked: bool = Field(description="false: PostgreSQL was not asked about the ids (see the note)")
    idempotency_note: str | None = None
    consistency_token: str | None = Field(None, description=_TOKEN)


class PublishErrorBody(ErrorBody):
    """An error response of POST /v1/events: the one error shape, plus per-event results when there are events."""

    results: list[EventResult] | None = None
    idempotency_checked: bool | None = None
    idempotency_note: str | None = None
    consistency_token: str | None = Field(None, description=_TOKEN)


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
    consistency: Consistency | None = Field(None, description=_CONSISTENCY)


class HistoryResponse(Body):
    memory_id: str
    tenant: str
    versions: list[FactVersion] = Field(description="oldest first")
    consistency: Consistency | None = Field(None, description=_CONSISTENCY)


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
    consistency: Consistency | None = Field(None, description=_CONSISTENCY)


# -- GET /v1/events/{event_id} ------------------------------------------------------------------------


class DeadLetterItem(Body):
    """A record the worker refused that carried the event's id (dead_letters)."""

    partition: int
    offset: int
    code: str
    field: str | None = None
    message: str


class EventStatus(Body):
    """GET /v1/events/{event_id}: what became of one event (api.writes.event_status); fields by status."""

    tenant: str
    event_id: str
    status: Literal["pending", "applied", "duplicate", "dead_lettered", "unknown"]
    type: str | None = Field(None, description="applied: the event's type")
    memory_id: str | None = Field(None, description="applied: the fact it belongs to (none for subject.erased)")
    version_id: str | None = Field(None, description="applied: the version a memory.asserted created")
    partition: int | None = Field(None, description="applied: the event's place; dead_lettered: the refused record's")
    offset: int | None = None
    effect: Effect | None = Field(None, description="applied: what it does in its fact's chain now")
    erased: bool | None = Field(None, description="duplicate: its subject was erased since; re-sending has no effect")
    reason: ErrorItem | None = Field(None, description="dead_lettered: why the worker refused it")
    since: Timestamp | None = Field(None, description="pending: when a door claimed the id")
    dead_letters: list[DeadLetterItem] | None = Field(None, description="every refused record with this id")


# -- POST /v1/recall ------------------------------------------------------------------------------------


class AliasMatch(Body):
    phrase: str
    keys: list[str]


class TimeCue(Body):
    words: str
    from_: Timestamp = Field(alias="from")
    to: Timestamp


class DateCueOut(Body):
    words: str
    year: int | None
    month: int | None
    day: int | None


class RecallCues(Body):
    """What recall read in the query (projections.search.cues)."""

    entities: list[str]
    known_entities: list[str]
    keys: list[str]
    aliases: list[AliasMatch]
    event_types: list[str]
    time: TimeCue | None
    terms: list[str]
    scopes: list[str] = Field(default=[], description="the tenant's scopes the query names")
    dates: list[DateCueOut] = Field(
        default=[],
        description="calendar dates the query names: episodes and events on them (or told within 7 "
        "days after) are preferred; null parts are any (a month without a year is that month in any year)",
    )


class MatchedCues(Body):
    """The query's cues this hit carries (only the non-empty ones)."""

    entities: list[str] | None = None
    keys: list[str] | None = None
    event_types: list[str] | None = None
    time: str | None = None
    scope: str | None = Field(None, description="the hit's scope, when the query names it")


class Verified(Body):
    candidate: str = Field(description="the version the index proposed")
    replaced_by: str | None = Field(None, description="the version that holds at as_of instead (PostgreSQL)")


class Match(Body):
    stage: Literal["exact", "keyword", "semantic", "hybrid"]
    cues: MatchedCues
    scores: dict[str, float] = Field(
        description="bm25, cosine, rrf (fuzzy stages), prior, overlap; rerank (the cross-encoder's logit) and "
        "rank_before_rerank (the hit's place among the fuzzy hits before it) when the rerank stage scored it; "
        "preference (the factor on an episode about none of the subjects the query names)"
    )
    verified: Verified
    preferred: list[str] | None = Field(
        None,
        description="why a preference moved the hit up: subject cue 'x' (an episode about a subject "
        "the query names), scope cue 'x' or default scope (its fact's version of that scope comes first)",
    )
    duplicates: list[str] | None = Field(
        None,
        description="the other episodes of this hit's near-duplicate group (the same thing said again, a "
        "re-import), version ids: recall returns one hit per group",
    )
    context: str | None = Field(
        None, description="how the hit's `context` turns were chosen (asked with context_turns; episodes only)"
    )


class ContextTurn(Body):
    """A turn said just before (offset < 0) or after (offset > 0) an episode hit."""

    offset: int = Field(description="its place relative to the hit: -1 the turn before, 1 the turn after")
    memory_id: str
    version_id: str
    subject: str
    content: str
    observed_at: Timestamp
    source: dict[str, Any]


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
    context: list[ContextTurn] | None = Field(
        None, description="the neighbouring turns of an episode hit, in time order (asked with context_turns)"
    )


class StageCandidate(Body):
    rank: int
    version_id: str
    memory_id: str
    score: float | None = Field(description="the stage's own measure: BM25 (keyword), cosine (semantic); null (exact)")


class RecallTrace(Body):
    stages_ms: dict[str, float]
    embedding_computed: bool
    embedding_models: list[str] | None = Field(
        None, description="the models the semantic stage embedded the query with (per language)"
    )
    mode: Mode
    exact_candidates: int | None = None
    fuzzy_candidates: int | None = None
    total_ms: float
    as_of: Timestamp
    known_at: Timestamp | None = Field(None, description="given known_at: the hits as the ledger knew them then")
    known_at_left_out: int | None = Field(None, description="hits left out: their fact was not known at known_at")
    candidates: dict[str, list[StageCandidate]] | None = Field(
        None, description="with explain: what each stage found before verification, best first"
    )
    rerank: dict[str, Any] | None = Field(
        None,
        description="the rerank stage (cross-encoder over the first fuzzy hits): computed, candidates, scored, "
        "budget_ms, stopped (null, budget, language, loading, unavailable), not_english",
    )
    consistency: Consistency | None = Field(None, description=_CONSISTENCY)


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


class SearchCounts(Body):
    """PostgreSQL's versions (a counter) against the index's documents (an Elasticsearch count) and the outbox; which
    ids differ is /v1/stats/consistency's `search`."""

    outbox_pending: int
    pg_versions: int
    es_documents: int
    # two-phase indexing's two lags
    vectors_pending: int = Field(
        description="versions whose document is written but lacks a configured model's vector (semantic recall "
        "does not see them yet; exact and keyword recall do)"
    )
    documents_lag_s: float | None = Field(description="age of the oldest outbox row (null: every document written)")
    vectors_lag_s: float | None = Field(
        description="age of the oldest version awaiting its vectors, since PostgreSQL had it (null: none)"
    )
    duplicate_groups: int = Field(description="groups of near-duplicate episodes: recall returns one hit per group")
    duplicate_episodes: int = Field(description="episodes linked to a group as repeats of its first episode")


class StatsTimings(Body):
    """How long each store took to answer, in ms (they are asked in parallel)."""

    postgres: float = Field(description="the counters, the bounded checks and the positions")
    access: float = Field(description="the access summary, after the postgres part on its connection")
    elasticsearch: float
    kafka: float
    total: float


class SearchOrphans(Body):
    """Invariant 4: version ids only in PostgreSQL or only in the index (meaningful once outbox_pending is 0)."""

    missing_in_es: int
    missing_in_pg: int
    examples: OrphanExamples
    outbox_pending: int
    pg_versions: int
    es_documents: int


class MostServed(Body):
    memory_id: str
    subject: str
    key: str | None
    scope: str
    accesses: int
    last_accessed_at: str


class AccessSummary(Body):
    """What recall and context served, from counters (projections.postgres.queries.access_summary)."""

    active_facts: int = Field(
        description="facts of the tenant with a version of status active (neither superseded nor retracted)"
    )
    served_facts: int = Field(description="of those, the facts served at least once")
    never_retrieved_ratio: float | None = Field(description="(active - served) / active; null without active facts")
    accesses_of_active: int = Field(description="accesses of the active facts")
    most_served: list[MostServed] = Field(description="the 10 most-served facts (then the latest, then memory_id)")


class StatsResponse(Body):
    """Counters and bounded checks (projections.postgres.counts): milliseconds whatever the tenant's size. The full
    checks (whole chains, counters against a recount, orphans between the stores) are /v1/stats/consistency."""

    tenant: str
    double_active: int = Field(description="0 while the unique index that forbids it is valid (else counted)")
    chain_integrity_violations: int = Field(
        description="versions whose status contradicts their supersession link (row-local; chains: consistency)"
    )
    explicit_confidence_violations: int
    invariants_capped: bool = Field(description="the invariant counts stopped at 1,000 rows (there are more)")
    events_applied: int
    versions: int
    dlq_count: int = Field(description="dead letters whose record names this tenant (unreadable ones: no tenant's)")
    search_pending: int = Field(
        description="the search projection's whole backlog: documents to write (search.outbox_pending) plus "
        "versions awaiting their vectors (search.vectors_pending); 0 when every stage of recall sees everything "
        "applied"
    )
    consumer: str
    topic: str
    lag: dict[str, PartitionLag] = Field(description="per partition")
    total_lag: int
    search: SearchCounts
    took_ms: StatsTimings
    access: AccessSummary


class Invariants(Body):
    double_active: int
    chain_integrity_violations: int = Field(description="every rule, whole chains included")
    explicit_confidence_violations: int


class CounterCheck(Body):
    counted: int = Field(description="the counter /v1/stats reports")
    recounted: int = Field(description="its rows counted one by one, in the same snapshot")


class ConsistencyScanned(Body):
    """What the check read: PostgreSQL rows per table (the tenant's; dead letters of the topic) and index documents."""

    postgres_rows: dict[str, int]
    elasticsearch_documents: int


class ConsistencyTimings(Body):
    postgres: float = Field(description="invariants and recount, one REPEATABLE READ snapshot")
    search: float = Field(description="every version id in PostgreSQL against every document id of the index")
    total: float


class ConsistencyResponse(Body):
    """`GET /v1/stats/consistency`: everything scanned; seconds at 100k facts (the cheap answer is /v1/stats)."""

    tenant: str
    consistent: bool = Field(
        description="no invariant broken, every counter equal to its recount and, once the outbox is drained, no "
        "orphans (with rows still queued, the orphans are not held against it)"
    )
    invariants: Invariants
    counters: dict[str, CounterCheck]
    counter_drift: dict[str, int] = Field(description="counted - recounted, for the counters that differ")
    search: SearchOrphans
    scanned: ConsistencyScanned
    took_ms: ConsistencyTimings


# -- GET /v1/tenants, GET /v1/subjects (the audit console's finders) ---------------------------------------------


class TenantsResponse(Body):
    tenants: list[str] = Field(description="the tenants the presented API key may use, sorted")


class SubjectsResponse(Body):
    tenant: str
    prefix: str
    subjects: list[str] = Field(description="subjects with events, starting with prefix, in code point order")
    more: bool = Field(description="true: more subjects start with prefix than limit allowed")


# -- POST /v1/context (the agent's side) -------------------------------------------------------------


class ContextLine(Body):
    """One record of the block (api.context), in the block's order."""

    status: Literal["current", "override", "history"]
    detail: str | None = Field(description="history: superseded, retracted, ended, shadowed or not in force")
    matched: dict[str, Any] | None = Field(description="a recall hit for the question: {rank, stage}")
    memory_id: str
    version_id: str
    version: int
    key: str | None
    scope: str
    kind: str
    value: Any
    content: str
    source: dict[str, Any]
    valid_from: Timestamp
    valid_to: Timestamp | None = Field(description="the effective end (valid_to or superseded_at), null: open")
    tokens: int = Field(description="the tokens of its line in the text")
    cut: bool = Field(description="its value (or content) is cut in the text, which says how long it is")


class ContextResponse(Body):
    """`POST /v1/context` with format=json: the block's lines, structured, and its text."""

    tenant: str
    subject: str
    question: str | None
    as_of: Timestamp | None = Field(description="the request's as_of (null: now, not written in the block)")
    include_history: bool
    budget_tokens: int
    tokens: int = Field(description="tokens of `text`, counted with `tokenizer`")
    tokenizer: str = Field(description="the embedding model whose tokenizer counted")
    lines: list[ContextLine]
    left_out: int = Field(description="lines that did not fit the budget")
    text: str = Field(description="the block as format=text answers it")
    consistency: Consistency | None = Field(None, description=_CONSISTENCY)


# -- GET /v1/schema/event (producers in other languages) --------------------------------------------


class EventSchemaDocument(Body):
    """The event contract as a JSON Schema (draft 2020-12), served as checked in (producers.event_schema).

    Only its top-level keywords are declared here; the document, generated from producers.contract.MemoryEvent,
    describes the event itself.
    """

    schema_: str = Field(alias="$schema", description="the JSON Schema dialect: draft 2020-12")
    id_: str = Field(alias="$id", description="urn:memory-ledger:schema:memory-event:<schema_version>")
    title: str
    description: str = Field(description="the record (topic, key, size) and what the contract checks beyond it")
    defs: dict[str, Any] = Field(alias="$defs", description="the enums and the source object")
    type: Literal["object"]
    properties: dict[str, Any] = Field(description="one per event field, each described")
    required: list[str]
    additionalProperties: bool
    examples: list[dict[str, Any]] = Field(description="valid events, as a producer sends them")


# -- DELETE /v1/subjects/{subject} ----------------------------------------------------------------------------


class ErasureResponse(Body):
    event_id: str
    type: Literal["subject.erased"]
    tenant: str
    subject: str
    partition: int
    offset: int
    effect: WriteEffect = Field(description=_WRITE_EFFECT)
    status_url: str = Field(description=_STATUS_URL)
    consistency_token: str | None = Field(None, description=_TOKEN)


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


# -- POST /v1/keys, POST /v1/keys/retire, GET /v1/erasures -------------------------------------------


class DataKeyItem(Body):
    subject: str
    key_id: str = Field(description="the envelope's `kid`")
    key: str = Field(description="the 32-byte data key, base64: keep it in memory only")


class KeysResponse(Body):
    tenant: str
    keys: list[DataKeyItem]


class RetireResponse(Body):
    retired: int = Field(description="keys retired: 1, or 0 when the subject had no live key")


class ErasureLedger(Body):
    topic: str
    partition: int = Field(description="the subject's partition: all its records are there")
    first_offset: int | None = Field(description="the subject's earliest projected event (null: none was)")
    erasure_offset: int = Field(description="the erasure event's offset: the records covered lie before it")


class ErasureRecords(Body):
    total: int = Field(description="events of the subject the projection purged")
    sealed: int = Field(description="of those, sealed: unreadable once their key is destroyed")
    clear: int = Field(description="of those, published in clear: still readable in the topic")


class ErasureKey(Body):
    key_id: str
    fingerprint: str = Field(description="sha256 over a label and the destroyed key (names it, reveals nothing)")


class ErasurePostgres(Body):
    versions: int
    events: int
    accesses: int
    pending_index: int


class ErasureSearch(Body):
    documents: int | None = Field(description="documents the indexer deleted (null until it has)")
    purged_at: str | None


class ErasurePurged(Body):
    postgres: ErasurePostgres
    elasticsearch: ErasureSearch


class ErasureRecord(Body):
    erasure_id: str = Field(description="the subject.erased event's event_id")
    tenant: str
    subject_digest: str = Field(
        description="HMAC-SHA256 of the subject under its tenant's digest key (in the key store): no subject in clear; "
        "find a subject's records with GET /v1/erasures?tenant=&subject="
    )
    requested_at: str
    applied_at: str
    ledger: ErasureLedger
    records: ErasureRecords
    keys: list[ErasureKey] = Field(description="the data keys this erasure destroyed")
    purged: ErasurePurged
    complete: bool = Field(description="true once the search projection has deleted the subject's documents too")


class ErasuresResponse(Body):
    tenant: str
    erasures: list[ErasureRecord]


# -- /v1/dead-letters (api.dead_letters) ------------------------------------------------------------------------


class DeadLetterPosition(Body):
    partition: int
    offset: int


class DeadLetterResolution(Body):
    """The event that resolved a dead letter (the first by ledger position, if several did)."""

    event_id: str
    partition: int = Field(description="where the resolving event is in the ledger")
    offset: int
    reason: str | None = Field(None, description="discarded: why (a re-drive: its own reason field, if any)")
    resolved_at: Timestamp = Field(description="the resolving event's observed_at")


class DeadLetter(Body):
    """A record the worker refused, at its place in the ledger, and what became of it."""

    partition: int
    offset: int
    reason: ErrorItem = Field(description="why the worker refused it: code, field, message")
    event_id: str | None = Field(None, description="the event_id the record claims, if it can be read")
    recorded_at: Timestamp
    state: Literal["open", "redriven", "discarded"]
    resolution: DeadLetterResolution | None = Field(None, description="redriven or discarded: by which event")


class DeadLettersResponse(Body):
    tenant: str
    state: Literal["open", "redriven", "discarded"] | None = None
    dead_letters: list[DeadLetter]
    next: str | None = Field(None, description="PARTITION:OFFSET: pass it as `after` for the next page")


class DeadLetterSealed(Body):
    key_id: str
    opened: bool = Field(description="true: the personal fields were opened with the data key and are in record")
    why: str | None = Field(None, description="not opened: why (no KEK here, key destroyed by an erasure, ...)")


class DeadLetterRecord(DeadLetter):
    """One dead letter with its record, as far as it decodes."""

    size: int = Field(description="the record's size in bytes")
    record: dict[str, Any] | None = Field(
        None,
        description="the record's JSON object (a sealed one's clear fields "
        "and, if opened, its personal fields); null if it is not a JSON object",
    )
    raw_text: str | None = Field(None, description="a record that is not a JSON object: its first 4,096 characters")
    sealed: DeadLetterSealed | None = None


class DeadLetterAction(Body):
    """What the door answered for the resolving event (the letter reads its new state once it is applied)."""

    dead_letter: DeadLetterPosition
    event_id: str
    duplicate: bool = Field(description="true: this event was published before (a retry); nothing published again")
    erased: bool | None = None
    memory_id: str | None = None
    version_id: str | None = None
    partition: int | None = None
    offset: int | None = None
    effect: WriteEffect = Field(description=_WRITE_EFFECT)
    status_url: str = Field(description=_STATUS_URL)
    consistency_token: str | None = Field(None, description=_TOKEN)
    idempotency_note: str | None = None
