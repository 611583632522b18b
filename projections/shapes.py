"""The shape of every JSON object the API answers, defined once, as the TypedDict its builder is typed with.

Answers stay plain dicts serialized by orjson, because validating hot read paths into models costs far more
(BENCHMARKS.md, "Response shapes"); api.schemas generates each shape's pydantic model for /openapi.json, the MCP
output schemas and the read client. It lives at the projections' layer so every builder can name its shape.
`NotRequired` keys may be absent; shapes allow extra keys except the error shapes (`CLOSED`).
"""

from typing import Annotated, Any, Literal, NotRequired

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from Python 3.12

from producers.contract import parse_rfc3339, rfc3339
from projections.search.modes import Mode
from projections.versions import EFFECTS

CLOSED = ConfigDict(extra="ignore")  # a shape whose model keeps no key it does not name (the error shapes)


def doc(description: str) -> Any:
    """A key's description, for its model: `Annotated[T, doc("...")]`."""
    return Field(description=description)


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


# the fields many bodies share, described once (the MCP tools declare these bodies as their output schemas: every
# field a model reads is described, tests/test_mcp_tool_schemas.py)
_TENANT = "the tenant"
_MEMORY_ID = "the fact's id (an episode's), the same for all its versions: fact_history's argument"
_VERSION_ID = "this version's id (unique across tenants)"
_EVENT_ID_SENT = "the event's id, as sent (null: it had none)"
_SUBJECT = "what the memory is about, e.g. user:42"
_KEY = "the fact's attribute, e.g. pref.seat; null for an episode"
_SCOPE = "narrows the key (e.g. work, home); '' for none"
_KIND = "state (a new value supersedes), preference (with valid_to: a temporary override), event or episodic"
_VALUE = "the value as recorded: any JSON (text, number, true/false, list, object or null)"
_CONTENT = "the memory in natural language"
_SOURCE = "where it came from: type (explicit, inferred, imported, system), service, ref, actor"
_OBSERVED_AT = "when it was learnt"
_VALID_FROM = "when it became true"
_VALID_TO = "when it stops being true (null: open)"
_PARTITION = "the event's partition of the ledger topic"
_OFFSET = "its offset in that partition"
_IDEMPOTENCY_NOTE = (
    "set when the door could not check the ids against earlier events (why); the worker still applies each once"
)
_EFFECT = "what the event does in its fact's chain now: " + ", ".join(EFFECTS)
_EVENT_STATUS = (
    "pending: published, not applied yet; unpublished: a door took it but its record never reached the ledger "
    "(the broker refused it or did not answer; send it again, the same id and content are safe); "
    "applied: the projection applied it (see effect); duplicate: its id was "
    "seen before (applied, or refused), its subject erased since; dead_lettered: the worker refused it (see "
    "reason); unknown: never seen"
)
_STAGE = (
    "the stage that found it: exact (ids, subjects, keys, aliases the query names), keyword (BM25), semantic "
    "(vectors), hybrid (both fuzzy stages)"
)
_LINE_STATUS = "current: in force; override: a temporary value in force over the long-term one; history: no longer"
_LETTER_STATE = "open: nothing done yet; redriven: a corrected event replaced it; discarded: closed with a reason"

# a memory's value as recorded: any JSON, spelled out so that a schema reader (an MCP client's check, a model) sees
# the choices instead of an empty schema that says nothing
JsonValue = Annotated[
    Any, WithJsonSchema({"anyOf": [{"type": t} for t in ("string", "number", "boolean", "object", "array", "null")]})
]


@with_config(CLOSED)
class ErrorItem(TypedDict):
    """One thing wrong with a request."""

    code: Annotated[str, doc("stable machine-readable reason, e.g. missing, unstorable_text, store_unavailable")]
    field: Annotated[str | None, doc("dotted path of the culprit (events.2.tenant, as_of, X-API-Key), or null")]
    message: Annotated[str, doc("what is wrong, for a human")]


@with_config(CLOSED)
class ErrorBody(TypedDict):
    """The body of every error response (4xx and 5xx)."""

    detail: list[ErrorItem]


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


class Consistency(TypedDict):
    """A read given `after`: the write it waited for and what the answer reflects (api.consistency)."""

    after: Annotated[str, doc("the consistency token the read was given")]
    reflects: Annotated[str, doc("the projection's positions the answer reflects, as a token (at least after)")]
    stage: Annotated[
        Literal["projection", "documents", "vectors"],
        doc("what was waited for: the projection; and the search documents; and their vectors"),
    ]
    waited_ms: Annotated[float, doc("how long the read waited for it, in ms")]


_CONSISTENCY = "given after: the write waited for and the positions the answer reflects"


# -- receipts (api.receipts): what an answer reflects, signed; POST /v1/receipts/verify and /replay -----------------

ReceiptAnswer = Literal["recall", "context", "facts", "history", "events"]
_RECEIPT_ANSWER = "the read it attests: recall, context, facts, history or events (the audit replay)"
_KEYED = "HMAC-SHA256 under a secret of the ledger's (never shown), hex: checkable by the ledger only, so no one can "
_KEYED += "guess personal data from it"


# what a cited event's fields can hold: a place a ledger has, ids and hex digests (a version id never a NUL, which
# PostgreSQL text refuses). A receipt sent back to be checked is held to them before any of it reaches SQL, by
# pydantic-core rather than a loop of ours: a receipt of 10,000 cited events is validated on the event loop
_CitedId = Annotated[str, Field(max_length=256)]
_CitedVersionId = Annotated[_CitedId, Field(pattern=r"^[^\x00]*$")]  # the one field a check sends to SQL
_CitedPartition = Annotated[int, Field(ge=0, lt=2**31)]
_CitedOffset = Annotated[int, Field(ge=0, lt=2**63)]


@with_config(ConfigDict(strict=True))  # a receipt as JSON gave it: "7" or true is no offset
class ReceiptCited(TypedDict):
    """One ledger event the answer shows (the event that made a version, or an event of the audit replay)."""

    version_id: Annotated[
        _CitedVersionId, doc("version_id_for(tenant, event_id): the version it made (of any event: its id)")
    ]
    memory_id: Annotated[_CitedId | None, doc("its fact's id (null: an event of no fact)")]
    partition: Annotated[_CitedPartition, doc(_PARTITION)]
    offset: Annotated[_CitedOffset, doc(_OFFSET)]
    link: Annotated[_CitedId | None, doc("the ledger chain's link of that record (hex; null: taken before the chain)")]
    digest: Annotated[
        _CitedId, doc("the event's content as the ledger holds it (its fingerprint, id and place), " + _KEYED)
    ]
    subject: Annotated[_CitedId, doc("its subject, " + _KEYED + " (finds the erasure of an erased one)")]


class ReceiptRanking(TypedDict):
    """What ranked a recall: the models and the settings of its stages, as configured when it ran."""

    models: Annotated[dict[str, str | None], doc("embedding, embedding_en and rerank model names (null: none)")]
    settings: Annotated[dict[str, Any], doc("recall's settings: candidate pool, rerank, preferences, access weight")]


class Receipt(TypedDict):
    """What an answer reflects, signed: ids and digests only, never a value or a text."""

    receipt: Annotated[Literal[1], doc("the receipt format")]
    answer: Annotated[ReceiptAnswer, doc(_RECEIPT_ANSWER)]
    tenant: Annotated[str, doc(_TENANT)]
    issued_at: Annotated[Timestamp, doc("when the answer was made")]
    positions: Annotated[str, doc("the ledger positions the projection had applied (a consistency token)")]
    as_of: Annotated[Timestamp | None, doc("the valid time of the answer (null: none applies)")]
    known_at: Annotated[Timestamp, doc("the transaction time of the answer: the request's known_at, or issued_at")]
    request: Annotated[str, doc("the request's parameters, " + _KEYED)]
    answer_digest: Annotated[
        str,
        doc(
            "sha256 (hex) of the answer as canonical JSON (sorted keys, no spaces, UTF-8) without `receipt`, "
            "`consistency` and recall's `trace`"
        ),
    ]
    parts: Annotated[
        dict[str, str],
        doc(
            "sha256 (hex) of each part a replay compares: recall's cues, exact (its exact hits, without their "
            "access score) and ranked (the version ids of its other hits, in order); facts, versions, events or "
            "lines (the rows) of the others"
        ),
    ]
    cited: Annotated[list[ReceiptCited], doc("the events behind what the answer shows, in its order")]
    ranking: Annotated[ReceiptRanking | None, doc("recall (and a context block's question): what ranked it")]
    served: NotRequired[
        Annotated[
            dict[str, float],
            doc(
                "recall, when how often facts were served ordered hits the other signals left equal: memory_id -> "
                "its access signal then (not in the ledger: a replay orders those hits by these)"
            ),
        ]
    ]
    key_id: Annotated[str | None, doc("the signing key's id (null: unsigned, no key configured)")]
    public_key: Annotated[str | None, doc("its Ed25519 public key, base64")]
    signature: Annotated[
        str | None, doc("Ed25519 over the receipt without `signature`, as canonical JSON, base64 (null: unsigned)")
    ]


_CITED_STATE = (
    "held: the ledger holds it at that place with that content and link; erased: its subject was erased since "
    "(detail says when; nothing is shown); differs: the ledger holds something else there; missing: not found"
)


class ReceiptCheck(TypedDict):
    version_id: Annotated[str, doc("the cited version")]
    state: Annotated[Literal["held", "erased", "differs", "missing"], doc(_CITED_STATE)]
    detail: Annotated[str, doc("in words; an erasure: when and where in the ledger")]


class ReceiptVerification(TypedDict):
    """`POST /v1/receipts/verify`: whether the receipt is the ledger's and what it cites is (or was) in the ledger."""

    valid: Annotated[bool, doc("the signature is valid and every cited event is held or erased")]
    signature: Annotated[
        Literal["valid", "invalid", "unsigned", "untrusted"],
        doc(
            "valid: by a key this ledger trusts; untrusted: valid under a key it does not trust; invalid: not the "
            "signature of the receipt as sent (a part of it was changed); unsigned: no signing key was configured"
        ),
    ]
    answer: NotRequired[
        Annotated[bool | None, doc("given the answer: whether its digest is the receipt's (null: not given)")]
    ]
    cited: Annotated[list[ReceiptCheck], doc("one per cited event, in the receipt's order")]
    erased: Annotated[int, doc("cited events erased since")]


class ReplayPart(TypedDict):
    part: Annotated[str, doc("a part of the receipt's `parts`: cues, exact, ranked, facts, versions or events")]
    same: Annotated[bool | None, doc("null: not compared (detail says why)")]
    detail: Annotated[str, doc("in words")]


class ReceiptReplay(TypedDict):
    """`POST /v1/receipts/replay`: the answer re-derived as known at the receipt's positions and times."""

    answer: Annotated[ReceiptAnswer, doc(_RECEIPT_ANSWER)]
    same: Annotated[bool, doc("every part is the same (none left uncompared)")]
    identical: Annotated[
        bool,
        doc(
            "the re-derived answer's digest is the receipt's answer_digest, byte for byte (recall: how often a hit "
            "was served, its `access` score, is not the ledger's and is not replayed)"
        ),
    ]
    answer_digest: Annotated[str, doc("the receipt's")]
    replayed_digest: Annotated[str, doc("the re-derived answer's")]
    parts: Annotated[list[ReplayPart], doc("each part compared")]
    models_differ: Annotated[list[str], doc("recall: the models and settings configured now that differ")]
    replayed: Annotated[dict[str, Any], doc("the re-derived answer (as the read answers it, without a receipt)")]


_PAGE = "given offset or limit: which part of the whole list this answer holds"
_RECEIPT = "what the answer reflects, signed (api.receipts; POST /v1/receipts/verify checks it)"


class EventResult(TypedDict):
    """What happened to one event of the request."""

    event_id: Annotated[str | None, doc(_EVENT_ID_SENT)]
    accepted: Annotated[bool, doc("true: in the ledger (or there already); false: refused (see error)")]
    duplicate: NotRequired[Annotated[bool | None, doc("true: this (tenant, event_id) was already there")]]
    erased: NotRequired[Annotated[bool | None, doc("true: its subject was erased since; nothing published")]]
    memory_id: NotRequired[
        Annotated[
            str | None,
            doc(
                f"{_MEMORY_ID}; null for an erasure, and for a retraction naming target_version (the worker "
                "finds the target's fact: status_url says which once applied)"
            ),
        ]
    ]
    version_id: NotRequired[Annotated[str | None, doc("the version a memory.asserted creates (tenant-scoped)")]]
    partition: NotRequired[Annotated[int | None, doc(_PARTITION)]]
    offset: NotRequired[Annotated[int | None, doc(_OFFSET)]]
    effect: NotRequired[Annotated[WriteEffect | None, doc(_WRITE_EFFECT)]]
    status_url: NotRequired[Annotated[str | None, doc(_STATUS_URL)]]
    error: NotRequired[Annotated[ErrorItem | None, doc("refused: why (code, field, message)")]]


class PublishResponse(TypedDict):
    results: Annotated[list[EventResult], doc("one per event, in the order sent")]
    idempotency_checked: Annotated[bool, doc("false: PostgreSQL was not asked about the ids (see the note)")]
    idempotency_note: NotRequired[Annotated[str | None, doc(_IDEMPOTENCY_NOTE)]]
    consistency_token: NotRequired[Annotated[str | None, doc(_TOKEN)]]


class PublishErrorBody(ErrorBody):
    """An error response of POST /v1/events: the one error shape, plus per-event results when there are events."""

    results: NotRequired[list[EventResult] | None]
    idempotency_checked: NotRequired[bool | None]
    idempotency_note: NotRequired[str | None]
    consistency_token: NotRequired[Annotated[str | None, doc(_TOKEN)]]


# -- facts, history, the audit replay ------------------------------------------------------------------


class FactVersion(TypedDict):
    """One version of a fact, as PostgreSQL holds it (projections.postgres.queries.version_dict)."""

    memory_id: Annotated[str, doc(_MEMORY_ID)]
    version_id: Annotated[str, doc("version_id_for(tenant, event_id): unique across tenants")]
    event_id: Annotated[str, doc("the assertion that made this version, as its producer named it")]
    version: Annotated[int, doc("1, 2, ... in the fact's chain")]
    tenant: Annotated[str, doc(_TENANT)]
    subject: Annotated[str, doc(_SUBJECT)]
    key: Annotated[str | None, doc(_KEY)]
    scope: Annotated[str, doc(_SCOPE)]
    kind: Annotated[str, doc(_KIND)]
    value: Annotated[JsonValue, doc(_VALUE)]
    content: Annotated[str, doc(_CONTENT)]
    entities: Annotated[list[str], doc("ids the memory is about besides the subject (exact cues)")]
    aliases: Annotated[list[str], doc("other names of the key or value (exact cues)")]
    tags: Annotated[list[str], doc("free labels (recall filters on them)")]
    source: Annotated[dict[str, Any], doc(_SOURCE)]
    confidence: Annotated[float, doc("0 to 1: how sure the source was (1.0 for an explicit source)")]
    importance: Annotated[float, doc("0 to 1: a ranking prior of recall")]
    observed_at: Annotated[Timestamp, doc(_OBSERVED_AT)]
    valid_from: Annotated[Timestamp, doc(_VALID_FROM)]
    valid_to: Annotated[Timestamp | None, doc(_VALID_TO)]
    override: Annotated[bool, doc("a temporary override (a preference with valid_to)")]
    status: Annotated[str, doc("active, superseded or retracted (a fact of a facts answer holds at its as_of: active)")]
    superseded_by: Annotated[str | None, doc("the version that replaced this one (null: none did)")]
    superseded_at: Annotated[Timestamp | None, doc("when it was replaced (null: it was not)")]
    confirmed_count: Annotated[int, doc("memory.confirmed events that counted on this version")]
    last_confirmed_at: Annotated[Timestamp | None, doc("the latest of them (null: none)")]
    partition: Annotated[int, doc(_PARTITION)]
    offset: Annotated[int, doc(_OFFSET)]


class Page(TypedDict):
    """Which part of a listing an answer holds, when `offset` or `limit` was asked: the listing is read whole and
    in its order, then cut, so a page of a receipt's replay is the same page."""

    offset: Annotated[int, doc("where the page starts in the whole listing (0: its first item)")]
    limit: Annotated[int | None, doc("at most this many items (null: no bound)")]
    total: Annotated[int, doc("how many items the whole listing holds")]
    next_offset: Annotated[int | None, doc("the offset of the next page; null: this page is the last")]


class FactsResponse(TypedDict):
    tenant: Annotated[str, doc(_TENANT)]
    subject: Annotated[str, doc(_SUBJECT)]
    as_of: Annotated[Timestamp, doc("the valid time the facts hold at (the request's as_of, or now)")]
    known_at: NotRequired[
        Annotated[Timestamp, doc("the request's known_at: only what was observed by then (absent: all known now)")]
    ]
    facts: Annotated[list[FactVersion], doc("the versions in force at as_of, one per fact and episode")]
    page: NotRequired[Annotated[Page, doc(_PAGE)]]
    consistency: NotRequired[Annotated[Consistency | None, doc(_CONSISTENCY)]]
    receipt: NotRequired[Annotated[Receipt | None, doc(_RECEIPT)]]


class HistoryResponse(TypedDict):
    memory_id: Annotated[str, doc(_MEMORY_ID)]
    tenant: Annotated[str, doc(_TENANT)]
    versions: Annotated[list[FactVersion], doc("oldest first")]
    page: NotRequired[Annotated[Page, doc(_PAGE)]]
    consistency: NotRequired[Annotated[Consistency | None, doc(_CONSISTENCY)]]
    receipt: NotRequired[Annotated[Receipt | None, doc(_RECEIPT)]]


class Effect(TypedDict):
    """What an event does in the subject's chains now (projections.versions.effects)."""

    effect: Annotated[Literal[EFFECTS], doc(_EFFECT)]  # type: ignore[valid-type]  # the tuple of effect names
    version_id: Annotated[str | None, doc("the version it made, ended or confirmed")]
    detail: Annotated[str, doc("what it did, in words")]


class LedgerEvent(TypedDict):
    """One applied event of the subject, in ledger order."""

    event_id: str
    type: str
    kind: str
    memory_id: Annotated[str | None, doc("null for subject.erased")]
    key: str | None
    scope: str
    partition: int
    offset: int
    observed_at: Timestamp
    valid_from: Timestamp | None
    valid_to: Timestamp | None
    target_version: Annotated[str | None, doc("the version a memory.retracted names, if any")]
    effect: Effect
    event: Annotated[dict[str, Any], doc("the event as the ledger holds it")]


class EventsResponse(TypedDict):
    tenant: str
    subject: str
    events: list[LedgerEvent]
    more: Annotated[
        bool, doc("true: the subject has more events (within from/to) than `limit`; these are the first by position")
    ]
    next_cursor: Annotated[
        str | None, doc("with `more`: the `cursor` that asks for the events after these (null on the last page)")
    ]
    consistency: NotRequired[Annotated[Consistency | None, doc(_CONSISTENCY)]]
    receipt: NotRequired[Annotated[Receipt | None, doc(_RECEIPT)]]


# -- GET /v1/events/{event_id} ------------------------------------------------------------------------


class DeadLetterItem(TypedDict):
    """A record the worker refused that carried the event's id (dead_letters)."""

    partition: Annotated[int, doc("the refused record's partition of the ledger topic")]
    offset: Annotated[int, doc("its offset in that partition")]
    code: Annotated[str, doc("why the worker refused it: an error code (the API's vocabulary)")]
    field: NotRequired[Annotated[str | None, doc("the field at fault, if one")]]
    message: Annotated[str, doc("the worker's message")]
    state: Annotated[Literal["open", "redriven", "discarded"], doc(_LETTER_STATE)]
    resolved_by: NotRequired[
        Annotated[str | None, doc("redriven or discarded: the resolving event's id (absent: open, or erased since)")]
    ]


class EventStatus(TypedDict):
    """GET /v1/events/{event_id}: what became of one event (api.writes.event_status); fields by status."""

    tenant: Annotated[str, doc(_TENANT)]
    event_id: Annotated[str, doc("the event asked about")]
    status: Annotated[
        Literal["pending", "unpublished", "applied", "duplicate", "dead_lettered", "unknown"], doc(_EVENT_STATUS)
    ]
    type: NotRequired[Annotated[str | None, doc("applied: the event's type")]]
    memory_id: NotRequired[Annotated[str | None, doc("applied: the fact it belongs to (none for subject.erased)")]]
    version_id: NotRequired[Annotated[str | None, doc("applied: the version a memory.asserted created")]]
    partition: NotRequired[
        Annotated[int | None, doc("applied: the event's place; dead_lettered: the refused record's")]
    ]
    offset: NotRequired[Annotated[int | None, doc("with partition: the offset")]]
    effect: NotRequired[Annotated[Effect | None, doc("applied: what it does in its fact's chain now")]]
    erased: NotRequired[
        Annotated[bool | None, doc("duplicate: its subject was erased since; re-sending has no effect")]
    ]
    reason: NotRequired[Annotated[ErrorItem | None, doc("dead_lettered: why the worker refused it")]]
    since: NotRequired[Annotated[Timestamp | None, doc("pending: when a door claimed the id")]]
    dead_letters: NotRequired[Annotated[list[DeadLetterItem] | None, doc("every refused record with this id")]]


# -- POST /v1/recall ------------------------------------------------------------------------------------


class AliasMatch(TypedDict):
    phrase: Annotated[str, doc("the words of the query")]
    keys: Annotated[list[str], doc("the keys they name (an alias of each)")]


TimeCue = TypedDict(
    "TimeCue",
    {
        "words": Annotated[str, doc("the time words of the query, e.g. last week")],
        "from": Annotated[Timestamp, doc("the start of the time they name")],
        "to": Annotated[Timestamp, doc("its end")],
    },
)


class DateCueOut(TypedDict):
    words: Annotated[str, doc("the date words of the query")]
    year: Annotated[int | None, doc("null: any year")]
    month: Annotated[int | None, doc("1 to 12; null: any month")]
    day: Annotated[int | None, doc("null: any day")]


class RecallCues(TypedDict):
    """What recall read in the query (projections.search.cues)."""

    entities: Annotated[list[str], doc("ids the query names (known to the tenant, or shaped like an id)")]
    known_entities: Annotated[list[str], doc("those the tenant's data contains")]
    keys: Annotated[list[str], doc("keys the query reaches through their aliases")]
    aliases: Annotated[list[AliasMatch], doc("the alias phrases found, with their keys")]
    event_types: Annotated[list[str], doc("kinds of event the query asks about")]
    time: Annotated[TimeCue | None, doc("the time range the query names (null: none)")]
    terms: Annotated[list[str], doc("the other content words (no stopwords), for keyword search")]
    scopes: NotRequired[Annotated[list[str], Field(default=[], description="the tenant's scopes the query names")]]
    dates: NotRequired[
        Annotated[
            list[DateCueOut],
            Field(
                default=[],
                description="calendar dates the query names: episodes and events on them (or told within 7 "
                "days after) are preferred; null parts are any (a month without a year is that month in any year)",
            ),
        ]
    ]


class MatchedCues(TypedDict):
    """The query's cues this hit carries (only the non-empty ones)."""

    entities: NotRequired[Annotated[list[str] | None, doc("the query's ids this hit carries")]]
    keys: NotRequired[Annotated[list[str] | None, doc("the query's keys this hit is")]]
    event_types: NotRequired[Annotated[list[str] | None, doc("the query's event kinds this hit is")]]
    time: NotRequired[Annotated[str | None, doc("the query's time words, when the hit falls in their range")]]
    scope: NotRequired[Annotated[str | None, doc("the hit's scope, when the query names it")]]


class Verified(TypedDict):
    candidate: Annotated[str, doc("the version the index proposed")]
    replaced_by: NotRequired[Annotated[str | None, doc("the version that holds at as_of instead (PostgreSQL)")]]


class Match(TypedDict):
    stage: Annotated[Literal["exact", "keyword", "semantic", "hybrid"], doc(_STAGE)]
    cues: Annotated[MatchedCues, doc("the query's cues this hit carries (only the non-empty ones)")]
    scores: Annotated[
        dict[str, float],
        doc(
            "bm25, cosine, rrf (fuzzy stages), prior, overlap; rerank (the cross-encoder's logit) and "
            "rank_before_rerank (the hit's place among the fuzzy hits before it) when the rerank stage scored it; "
            "preference (the factor on an episode about none of the subjects the query names)"
        ),
    ]
    verified: Annotated[Verified, doc("what PostgreSQL confirmed of the index's candidate")]
    preferred: NotRequired[
        Annotated[
            list[str] | None,
            doc(
                "why a preference moved the hit up: subject cue 'x' (an episode about a subject "
                "the query names), scope cue 'x' or default scope (its fact's version of that scope comes first)"
            ),
        ]
    ]
    duplicates: NotRequired[
        Annotated[
            list[str] | None,
            doc(
                "the other episodes of this hit's near-duplicate group (the same thing said again, a "
                "re-import), version ids: recall returns one hit per group"
            ),
        ]
    ]
    context: NotRequired[
        Annotated[
            str | None, doc("how the hit's `context` turns were chosen (asked with context_turns; episodes only)")
        ]
    ]


class ContextTurn(TypedDict):
    """A turn said just before (offset < 0) or after (offset > 0) an episode hit."""

    offset: Annotated[int, doc("its place relative to the hit: -1 the turn before, 1 the turn after")]
    memory_id: Annotated[str, doc(_MEMORY_ID)]
    version_id: Annotated[str, doc(_VERSION_ID)]
    subject: Annotated[str, doc(_SUBJECT)]
    content: Annotated[str, doc("what was said")]
    observed_at: Annotated[Timestamp, doc(_OBSERVED_AT)]
    source: Annotated[dict[str, Any], doc(_SOURCE)]


class RecallHit(TypedDict):
    """A fact holding at as_of, rebuilt from its PostgreSQL row, with why it matched."""

    memory_id: Annotated[str, doc(_MEMORY_ID)]
    version_id: Annotated[str, doc(_VERSION_ID)]
    event_id: Annotated[str, doc("the event that made this version, as its producer named it")]
    version: Annotated[int, doc("1, 2, ... in the fact's chain")]
    subject: Annotated[str, doc(_SUBJECT)]
    key: Annotated[str | None, doc(_KEY)]
    scope: Annotated[str, doc(_SCOPE)]
    value: Annotated[JsonValue, doc(_VALUE)]
    content: Annotated[str, doc(_CONTENT)]
    kind: Annotated[str, doc(_KIND)]
    status: Annotated[str, doc("active (in force at as_of), superseded or retracted")]
    valid_from: Annotated[Timestamp, doc(_VALID_FROM)]
    valid_to: Annotated[
        Timestamp | None,
        doc("the effective end: valid_to or, sooner, superseded_at (facts and history give the two apart); null: open"),
    ]
    observed_at: Annotated[Timestamp, doc(_OBSERVED_AT)]
    source: Annotated[dict[str, Any], doc(_SOURCE)]
    score: Annotated[float, doc("exact hits in [1, 2), fuzzy hits in [0, 1)")]
    match: Annotated[Match, doc("why it matched: the stage that found it, the cues, the scores")]
    context: NotRequired[
        Annotated[
            list[ContextTurn] | None,
            doc("the neighbouring turns of an episode hit, in time order (asked with context_turns)"),
        ]
    ]


class StageCandidate(TypedDict):
    rank: Annotated[int, doc("1 for the stage's best")]
    version_id: Annotated[str, doc(_VERSION_ID)]
    memory_id: Annotated[str, doc(_MEMORY_ID)]
    score: Annotated[float | None, doc("the stage's own measure: BM25 (keyword), cosine (semantic); null (exact)")]


class RecallTrace(TypedDict):
    stages_ms: Annotated[dict[str, float], doc("the time of each stage that ran, in ms")]
    embedding_computed: Annotated[bool, doc("true: the query was embedded (the semantic stage ran)")]
    embedding_models: NotRequired[
        Annotated[list[str] | None, doc("the models the semantic stage embedded the query with (per language)")]
    ]
    mode: Annotated[
        Mode, doc("the mode it ran in: auto, exact, keyword, semantic or hybrid (the request's; default auto)")
    ]
    exact_candidates: NotRequired[Annotated[int | None, doc("what the exact stage found")]]
    fuzzy_candidates: NotRequired[
        Annotated[
            int | None,
            doc(
                "the versions the keyword and semantic stages found and accepted, fused (`candidates` lists what "
                "each stage found, also what its acceptance then left out: a semantic match below its floor)"
            ),
        ]
    ]
    total_ms: Annotated[float, doc("the whole recall, in ms")]
    as_of: Annotated[Timestamp, doc("the valid time the hits hold at (the request's as_of, or now)")]
    known_at: NotRequired[
        Annotated[
            Timestamp | None,
            doc("given known_at: the hits as the ledger knew them then (null: a replay's, from its positions alone)"),
        ]
    ]
    known_at_left_out: NotRequired[Annotated[int | None, doc("hits left out: their fact was not known at known_at")]]
    candidates: NotRequired[
        Annotated[
            dict[str, list[StageCandidate]] | None,
            doc("with explain: what each stage found before verification, best first"),
        ]
    ]
    rerank: NotRequired[
        Annotated[
            dict[str, Any] | None,
            doc(
                "the rerank stage (cross-encoder over the first fuzzy hits): computed, candidates, scored, "
                "budget_ms, stopped (null, budget, language, loading, unavailable), not_english"
            ),
        ]
    ]
    consistency: NotRequired[Annotated[Consistency | None, doc(_CONSISTENCY)]]


class RecallResponse(TypedDict):
    hits: Annotated[list[RecallHit], doc("best first: exact hits, then keyword and semantic ones")]
    cues: Annotated[RecallCues, doc("what recall read in the query")]
    trace: Annotated[RecallTrace, doc("how the recall ran: stages, timings, candidates")]
    receipt: NotRequired[Annotated[Receipt | None, doc(_RECEIPT)]]


# -- GET /v1/stats ---------------------------------------------------------------------------------------


class PartitionLag(TypedDict):
    end_offset: int | None
    position: int
    lag: int | None


class OrphanExamples(TypedDict):
    missing_in_es: list[str]
    missing_in_pg: list[str]


class SearchCounts(TypedDict):
    """PostgreSQL's versions (a counter) against the index's documents (an Elasticsearch count) and the outbox; which
    ids differ is /v1/stats/consistency's `search`."""

    outbox_pending: int
    pg_versions: int
    es_documents: int
    # two-phase indexing's two lags
    vectors_pending: Annotated[
        int,
        doc(
            "versions whose document is written but lacks a configured model's vector (semantic recall "
            "does not see them yet; exact and keyword recall do)"
        ),
    ]
    documents_lag_s: Annotated[float | None, doc("age of the oldest outbox row (null: every document written)")]
    vectors_lag_s: Annotated[
        float | None, doc("age of the oldest version awaiting its vectors, since PostgreSQL had it (null: none)")
    ]
    duplicate_groups: Annotated[int, doc("groups of near-duplicate episodes: recall returns one hit per group")]
    duplicate_episodes: Annotated[int, doc("episodes linked to a group as repeats of its first episode")]


class StatsTimings(TypedDict):
    """How long each store took to answer, in ms (they are asked in parallel)."""

    postgres: Annotated[float, doc("the counters, the bounded checks and the positions")]
    access: Annotated[float, doc("the access summary, after the postgres part on its connection")]
    elasticsearch: float
    kafka: float
    total: float


class SearchOrphans(TypedDict):
    """Invariant 4: version ids only in PostgreSQL or only in the index (meaningful once outbox_pending is 0)."""

    missing_in_es: int
    missing_in_pg: int
    examples: OrphanExamples
    outbox_pending: int
    pg_versions: int
    es_documents: int


class MostServed(TypedDict):
    memory_id: str
    subject: str
    key: str | None
    scope: str
    accesses: int
    last_accessed_at: str


class AccessSummary(TypedDict):
    """What recall and context served, from counters (projections.postgres.queries.access_summary)."""

    active_facts: Annotated[
        int, doc("facts of the tenant with a version of status active (neither superseded nor retracted)")
    ]
    served_facts: Annotated[int, doc("of those, the facts served at least once")]
    never_retrieved_ratio: Annotated[float | None, doc("(active - served) / active; null without active facts")]
    accesses_of_active: Annotated[int, doc("accesses of the active facts")]
    most_served: Annotated[list[MostServed], doc("the 10 most-served facts (then the latest, then memory_id)")]


class StatsResponse(TypedDict):
    """Counters and bounded checks (projections.postgres.counts): milliseconds whatever the tenant's size. The full
    checks (whole chains, counters against a recount, orphans between the stores) are /v1/stats/consistency."""

    tenant: str
    double_active: Annotated[int, doc("0 while the unique index that forbids it is valid (else counted)")]
    chain_integrity_violations: Annotated[
        int, doc("versions whose status contradicts their supersession link (row-local; chains: consistency)")
    ]
    explicit_confidence_violations: int
    invariants_capped: Annotated[bool, doc("the invariant counts stopped at 1,000 rows (there are more)")]
    events_applied: int
    versions: int
    dlq_count: Annotated[int, doc("dead letters whose record names this tenant (unreadable ones: no tenant's)")]
    search_pending: Annotated[
        int,
        doc(
            "the search projection's whole backlog: documents to write (search.outbox_pending) plus "
            "versions awaiting their vectors (search.vectors_pending); 0 when every stage of recall sees everything "
            "applied"
        ),
    ]
    consumer: str
    topic: str
    lag: Annotated[dict[str, PartitionLag], doc("per partition")]
    total_lag: int
    search: SearchCounts
    took_ms: StatsTimings
    access: AccessSummary


class Invariants(TypedDict):
    double_active: int
    chain_integrity_violations: Annotated[int, doc("every rule, whole chains included")]
    explicit_confidence_violations: int


class CounterCheck(TypedDict):
    counted: Annotated[int, doc("the counter /v1/stats reports")]
    recounted: Annotated[int, doc("its rows counted one by one, in the same snapshot")]


class ConsistencyScanned(TypedDict):
    """What the check read: PostgreSQL rows per table (the tenant's; dead letters of the topic) and index documents."""

    postgres_rows: dict[str, int]
    elasticsearch_documents: int


class ConsistencyTimings(TypedDict):
    postgres: Annotated[float, doc("invariants and recount, one REPEATABLE READ snapshot")]
    search: Annotated[float, doc("every version id in PostgreSQL against every document id of the index")]
    total: float


class ConsistencyResponse(TypedDict):
    """`GET /v1/stats/consistency`: everything scanned; seconds at 100k facts (the cheap answer is /v1/stats)."""

    tenant: str
    consistent: Annotated[
        bool,
        doc(
            "no invariant broken, every counter equal to its recount and, once the outbox is drained, no "
            "orphans (with rows still queued, the orphans are not held against it)"
        ),
    ]
    invariants: Invariants
    counters: dict[str, CounterCheck]
    counter_drift: Annotated[dict[str, int], doc("counted - recounted, for the counters that differ")]
    search: SearchOrphans
    scanned: ConsistencyScanned
    took_ms: ConsistencyTimings


# -- GET /v1/tenants, GET /v1/subjects (the audit console's finders) ---------------------------------------------


class TenantsResponse(TypedDict):
    tenants: Annotated[list[str], doc("the tenants the presented API key may use, sorted")]


class SubjectsResponse(TypedDict):
    tenant: str
    prefix: str
    subjects: Annotated[list[str], doc("subjects with events, starting with prefix, in code point order")]
    more: Annotated[bool, doc("true: more subjects start with prefix than limit allowed")]
    next_cursor: Annotated[
        str | None, doc("with `more`: the `cursor` that asks for the subjects after these (null on the last page)")
    ]


# -- POST /v1/context (the agent's side) -------------------------------------------------------------


class ContextLine(TypedDict):
    """One record of the block (api.context), in the block's order."""

    status: Annotated[Literal["current", "override", "history"], doc(_LINE_STATUS)]
    detail: Annotated[str | None, doc("history: superseded, retracted, ended, shadowed or not in force")]
    matched: Annotated[dict[str, Any] | None, doc("a recall hit for the question: {rank, stage}")]
    memory_id: Annotated[str, doc(_MEMORY_ID)]
    version_id: Annotated[str, doc(_VERSION_ID)]
    version: Annotated[int, doc("1, 2, ... in the fact's chain")]
    key: Annotated[str | None, doc(_KEY)]
    scope: Annotated[str, doc(_SCOPE)]
    kind: Annotated[str, doc(_KIND)]
    value: Annotated[JsonValue, doc(_VALUE)]
    content: Annotated[str, doc(_CONTENT)]
    source: Annotated[dict[str, Any], doc(_SOURCE)]
    valid_from: Annotated[Timestamp, doc(_VALID_FROM)]
    valid_to: Annotated[Timestamp | None, doc("the effective end (valid_to or superseded_at), null: open")]
    tokens: Annotated[int, doc("the tokens of its line in the text")]
    cut: Annotated[
        bool,
        doc(
            "its value or its content is cut (a content's own words never set it), the text saying how long it "
            "is; then `value` (an episode: `content`) is that cut text, and a fact's `content` is cut alike"
        ),
    ]


class ContextResponse(TypedDict):
    """`POST /v1/context` with format=json: the block's lines, structured, and its text."""

    tenant: Annotated[str, doc(_TENANT)]
    subject: Annotated[str, doc(_SUBJECT)]
    question: Annotated[str | None, doc("the question asked (its recall hits come first), or null")]
    as_of: Annotated[Timestamp | None, doc("the request's as_of (null: now, not written in the block)")]
    include_history: Annotated[bool, doc("true: history lines were asked for")]
    budget_tokens: Annotated[int, doc("the token budget asked for")]
    tokens: Annotated[int, doc("tokens of `text`, counted with `tokenizer`")]
    tokenizer: Annotated[str, doc("the embedding model whose tokenizer counted")]
    lines: Annotated[list[ContextLine], doc("the block's lines, in its order, structured")]
    left_out: Annotated[int, doc("lines that did not fit the budget")]
    text: Annotated[str, doc("the block as format=text answers it")]
    consistency: NotRequired[Annotated[Consistency | None, doc(_CONSISTENCY)]]
    receipt: NotRequired[Annotated[Receipt | None, doc(_RECEIPT)]]


# -- DELETE /v1/subjects/{subject} ----------------------------------------------------------------------------


class ErasureResponse(TypedDict):
    event_id: Annotated[str, doc("the subject.erased event's id")]
    type: Annotated[Literal["subject.erased"], doc("subject.erased: the event published")]
    tenant: Annotated[str, doc(_TENANT)]
    subject: Annotated[str, doc("the subject erased")]
    partition: Annotated[int, doc(_PARTITION)]
    offset: Annotated[int, doc(_OFFSET)]
    duplicate: NotRequired[Annotated[bool | None, doc("true: a retry of this erasure, applied already; nothing sent")]]
    effect: Annotated[WriteEffect, doc(_WRITE_EFFECT)]
    status_url: Annotated[str, doc(_STATUS_URL)]
    consistency_token: NotRequired[Annotated[str | None, doc(_TOKEN)]]


# -- GET /v1/health ---------------------------------------------------------------------------------------------


class HealthPart(TypedDict):
    ok: bool
    ms: NotRequired[Annotated[float | None, doc("how long it took to answer (when ok)")]]
    error: NotRequired[Annotated[str | None, doc("why not (when not ok)")]]
    status: NotRequired[Annotated[str | None, doc("elasticsearch: the cluster's status")]]
    age_s: NotRequired[Annotated[float | None, doc("kafka: the age of the broker's answer (reused for 1 s)")]]


class HealthParts(TypedDict):
    postgres: HealthPart
    elasticsearch: HealthPart
    kafka: HealthPart


class HealthResponse(TypedDict):
    status: Literal["ok", "degraded"]
    parts: HealthParts
    detail: NotRequired[Annotated[list[ErrorItem] | None, doc("503 only: one store_unavailable item per part down")]]


# -- POST /v1/keys, POST /v1/keys/retire, GET /v1/erasures -------------------------------------------


class DataKeyItem(TypedDict):
    subject: str
    key_id: Annotated[str, doc("the envelope's `kid`")]
    key: Annotated[str, doc("the 32-byte data key, base64: keep it in memory only")]


class KeysResponse(TypedDict):
    tenant: str
    keys: list[DataKeyItem]


class RetireResponse(TypedDict):
    retired: Annotated[int, doc("keys retired: 1, or 0 when the subject had no live key")]


class ErasureLedger(TypedDict):
    topic: str
    partition: Annotated[int, doc("the subject's partition: all its records are there")]
    first_offset: Annotated[int | None, doc("the subject's earliest projected event (null: none was)")]
    erasure_offset: Annotated[int, doc("the erasure event's offset: the records covered lie before it")]


class ErasureRecords(TypedDict):
    total: Annotated[int, doc("events of the subject the projection purged")]
    sealed: Annotated[int, doc("of those, sealed: unreadable once their key is destroyed")]
    clear: Annotated[int, doc("of those, published in clear: still readable in the topic")]


class ErasureKey(TypedDict):
    key_id: str
    fingerprint: Annotated[str, doc("sha256 over a label and the destroyed key (names it, reveals nothing)")]


class ErasurePostgres(TypedDict):
    versions: int
    events: int
    accesses: int
    pending_index: int
    dead_letters: NotRequired[Annotated[int, doc("letters of the subject's refused records (absent: an older record)")]]


class ErasureSearch(TypedDict):
    documents: Annotated[int | None, doc("documents the indexer deleted (null until it has)")]
    purged_at: str | None


class ErasurePurged(TypedDict):
    postgres: ErasurePostgres
    elasticsearch: ErasureSearch


class ErasureRecord(TypedDict):
    erasure_id: Annotated[str, doc("the subject.erased event's event_id")]
    tenant: str
    subject_digest: Annotated[
        str,
        doc(
            "HMAC-SHA256 of the subject under its tenant's digest key (in the key store): no subject in clear; "
            "find a subject's records with GET /v1/erasures?tenant=&subject="
        ),
    ]
    requested_at: str
    applied_at: str
    ledger: ErasureLedger
    records: ErasureRecords
    keys: Annotated[list[ErasureKey], doc("the data keys this erasure destroyed")]
    purged: ErasurePurged
    complete: Annotated[bool, doc("true once the search projection has deleted the subject's documents too")]


class ErasuresResponse(TypedDict):
    tenant: str
    erasures: list[ErasureRecord]
    more: Annotated[bool, doc("true: the tenant has more records than `limit`; these are the newest")]
    next_cursor: Annotated[
        str | None, doc("with `more`: the `cursor` that asks for the records after these (null on the last page)")
    ]


# -- /v1/dead-letters (api.dead_letters) ------------------------------------------------------------------------


class DeadLetterPosition(TypedDict):
    partition: Annotated[int, doc("the dead letter's partition of the ledger topic")]
    offset: Annotated[int, doc("its offset in that partition")]


class DeadLetterResolution(TypedDict):
    """The event that resolved a dead letter (the first by ledger position, if several did)."""

    event_id: Annotated[str | None, doc("the resolving event's id; null: its subject was erased since")]
    partition: Annotated[int, doc("where the resolving event is in the ledger")]
    offset: Annotated[int, doc("with partition: where it is")]
    reason: NotRequired[Annotated[str | None, doc("discarded: why (a re-drive: its own reason field, if any)")]]
    resolved_at: Annotated[Timestamp, doc("the resolving event's observed_at")]


class DeadLetter(TypedDict):
    """A record the worker refused, at its place in the ledger, and what became of it."""

    partition: Annotated[int, doc("the refused record's partition of the ledger topic")]
    offset: Annotated[int, doc("its offset in that partition: with partition, the letter's id")]
    reason: Annotated[ErrorItem, doc("why the worker refused it: code, field, message")]
    event_id: NotRequired[Annotated[str | None, doc("the event_id the record claims, if it can be read")]]
    recorded_at: Annotated[Timestamp, doc("when the worker refused it")]
    state: Annotated[Literal["open", "redriven", "discarded"], doc(_LETTER_STATE)]
    resolution: NotRequired[Annotated[DeadLetterResolution | None, doc("redriven or discarded: by which event")]]


class DeadLettersResponse(TypedDict):
    tenant: Annotated[str, doc(_TENANT)]
    state: NotRequired[
        Annotated[
            Literal["open", "redriven", "discarded"] | None,
            doc("the state asked for: open, redriven or discarded (null: every state)"),
        ]
    ]
    dead_letters: Annotated[list[DeadLetter], doc("in ledger position order")]
    next: NotRequired[Annotated[str | None, doc("PARTITION:OFFSET: pass it as `after` for the next page")]]


class DeadLetterSealed(TypedDict):
    key_id: Annotated[str, doc("the data key the record was sealed with")]
    opened: Annotated[bool, doc("true: the personal fields were opened with the data key and are in record")]
    why: NotRequired[Annotated[str | None, doc("not opened: why (no KEK here, key destroyed by an erasure, ...)")]]


class DeadLetterRecord(DeadLetter):
    """One dead letter with its record, as far as it decodes."""

    size: Annotated[int, doc("the record's size in bytes")]
    record: NotRequired[
        Annotated[
            dict[str, Any] | None,
            doc(
                "the record's JSON object (a sealed one's clear fields "
                "and, if opened, its personal fields); null if it is not a JSON object"
            ),
        ]
    ]
    raw_text: NotRequired[Annotated[str | None, doc("a record that is not a JSON object: its first 4,096 characters")]]
    sealed: NotRequired[Annotated[DeadLetterSealed | None, doc("a sealed record: whether its personal fields opened")]]
    withheld: NotRequired[
        Annotated[
            bool,
            doc(
                "true: its subject was erased and the record's bytes went with it (it was in another partition than "
                "the erasure); `size` and `record` then say nothing of it"
            ),
        ]
    ]


class DeadLetterAction(TypedDict):
    """What the door answered for the resolving event (the letter reads its new state once it is applied)."""

    dead_letter: Annotated[DeadLetterPosition, doc("the dead letter acted on")]
    event_id: Annotated[str, doc("the resolving event's id (a discard: deadletter:<partition>:<offset>)")]
    duplicate: Annotated[bool, doc("true: this event was published before (a retry); nothing published again")]
    erased: NotRequired[Annotated[bool | None, doc("true: its subject was erased since; nothing published")]]
    memory_id: NotRequired[Annotated[str | None, doc(_MEMORY_ID)]]
    version_id: NotRequired[Annotated[str | None, doc("a re-drive's memory.asserted: the version it creates")]]
    partition: NotRequired[Annotated[int | None, doc(_PARTITION)]]
    offset: NotRequired[Annotated[int | None, doc(_OFFSET)]]
    effect: Annotated[WriteEffect, doc(_WRITE_EFFECT)]
    status_url: Annotated[str, doc(_STATUS_URL)]
    consistency_token: NotRequired[Annotated[str | None, doc(_TOKEN)]]
    idempotency_note: NotRequired[Annotated[str | None, doc(_IDEMPOTENCY_NOTE)]]
