"""The memory event contract, defined once and imported everywhere.

Producers build events with :class:`MemoryEvent`; processors turn raw Kafka bytes into one with :func:`decode`,
which raises :class:`InvalidEvent` (reason code, field, message: what the dead-letter topic records). No other
module parses event JSON.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "DOT_SEGMENT",
    "LETTER_ID_PREFIX",
    "RESOLVED_AT_ITS_DOOR",
    "letter_id",
    "has_long_digit_run",
    "TENANT_MAX",
    "TENANT_PATTERN",
    "well_formed_tenant",
    "ACCESS_TYPE",
    "AccessEvent",
    "access_id_for",
    "access_key",
    "decode_access",
    "encode_access",
    "CURRENT_SCHEMA_VERSION",
    "DeadLetterRef",
    "EventType",
    "INT_MAX",
    "INT_MIN",
    "MAX_VALUE_DEPTH",
    "Rfc3339",
    "check_skew",
    "check_storable",
    "storable_json",
    "claimed_fields",
    "door_refusal",
    "load_record",
    "number_read_as_zero",
    "read_json",
    "read_record",
    "parse_rfc3339",
    "version_id_for",
    "wire_fingerprint",
    "InvalidEvent",
    "Kind",
    "MAX_EVENT_BYTES",
    "MemoryEvent",
    "Source",
    "SourceType",
    "MAX_ERROR_FIELD_CHARS",
    "MAX_ERROR_MESSAGE_CHARS",
    "bounded",
    "decode",
    "decode_value",
    "error_code",
    "encode",
    "encode_wire",
    "from_dict_encoded",
    "subject_digest_for",
    "kafka_key",
    "memory_id_for",
    "keyed_subject",
    "named_subject",
    "new_event_id",
    "rfc3339",
    "UPCASTERS",
]

CURRENT_SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 256 * 1024  # a larger record is refused, not truncated
MAX_CONTENT_CHARS = 16_000
# What the projections keep exactly: integers of signed 64 bits and finite IEEE doubles. A larger
# integer is refused at the door (orjson cannot write it; a raw record bypassing the door has it
# read as the nearest double by orjson, as JSON allows). NaN and infinities are not JSON at all.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
MAX_VALUE_DEPTH = 32  # nesting of `value` (orjson itself stops at 254; PostgreSQL's jsonb is fine either way)


class EventType(StrEnum):
    ASSERTED = "memory.asserted"
    RETRACTED = "memory.retracted"
    CONFIRMED = "memory.confirmed"
    ERASED = "subject.erased"
    DISCARDED = "deadletter.discarded"  # an operator closes a dead letter without a correction (no fact effect)


class Kind(StrEnum):
    STATE = "state"
    PREFERENCE = "preference"
    EVENT = "event"
    EPISODIC = "episodic"


class SourceType(StrEnum):
    EXPLICIT = "explicit"
    INFERRED = "inferred"
    IMPORTED = "imported"
    SYSTEM = "system"


# an error names what it refuses, never repeats it whole: a path through a megabyte-long key stays this short
MAX_ERROR_MESSAGE_CHARS = 1000
MAX_ERROR_FIELD_CHARS = 300


def bounded(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters (the last one an ellipsis) when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class InvalidEvent(ValueError):
    """A record that is not a valid event: `code` is stable, `field` names the culprit (both bounded)."""

    index: int | None = None  # the event's place in the batch it came in (`at`), if it came in one

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        message = bounded(message, MAX_ERROR_MESSAGE_CHARS)
        field = None if field is None else bounded(field, MAX_ERROR_FIELD_CHARS)
        self.code, self.message, self.field = code, message, field
        super().__init__(f"{code}: {message}" + (f" (field: {field})" if field else ""))

    def at(self, index: int) -> InvalidEvent:
        """This refusal, of the event at `index` of a batch (said in its text too: which of 10,000 events it is)."""
        if self.index is None:
            self.args = (f"{self.args[0]} (event {index} of the batch)",)
        self.index = index
        return self

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message}


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2})$")
_OFFSET_RANGE = "is not a valid time: its UTC offset must be between -23:59 and +23:59 (minutes 00-59)"
_TIME_FORMAT = "an RFC 3339 time with seconds, at most 6 fractional digits and an offset (e.g. 2026-01-02T03:04:05Z)"


def _utc(value: datetime) -> datetime:
    if value.tzinfo is UTC:  # already (the common case: every time is checked twice on its way in)
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"must be {_TIME_FORMAT}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is outside the representable range (years 0001-9999 in UTC)") from None


def parse_rfc3339(text: str) -> datetime:
    """Strict RFC 3339 (what the API documents), as an aware UTC datetime; ValueError otherwise.

    Stricter than datetime.fromisoformat: seconds and an offset are required, and more than 6
    fractional digits are refused rather than silently cut to microseconds.
    """
    if not isinstance(text, str) or not _RFC3339.match(text):
        raise ValueError(f"must be {_TIME_FORMAT}")
    if text[-6] in "+-" and (text[-5:-3] > "23" or text[-2:] > "59"):  # Python folds +00:99 into hours
        raise ValueError(_OFFSET_RANGE)
    normal = text
    if text[10] != "T" or text[-1] == "z":  # fromisoformat reads `T...Z` as it is (a third of the cost)
        normal = text[:10] + "T" + text[11:]
        if normal[-1] == "z":
            normal = normal[:-1] + "+00:00"
    if normal.startswith("0000-12-31") and normal[-6] == "-":
        return _year_zero_eve(normal)
    return _utc(_from_iso(normal))


def _from_iso(normal: str) -> datetime:
    try:
        return datetime.fromisoformat(normal)
    except ValueError as exc:
        if "timedelta" in str(exc):  # the offset: Python says so in its own terms (timedelta(hours=24)...)
            raise ValueError(_OFFSET_RANGE) from None
        raise ValueError(f"is not a valid time: {exc}") from None


def _year_zero_eve(normal: str) -> datetime:
    """The last day of year 0000 behind UTC, which a negative offset can bring into 0001 in UTC (the rule is the
    year once converted): Python holds no year 0, so the day after it is read and the day taken back in UTC."""
    local = _from_iso("0001-01-01" + normal[10:])
    offset = local.utcoffset()
    assert offset is not None  # the pattern requires one
    try:
        return (local.replace(tzinfo=None) + (-offset - timedelta(days=1))).replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("is outside the representable range (years 0001-9999 in UTC)") from None


def _time_input(v: Any) -> Any:
    """A time field's input: an aware datetime, or a strict RFC 3339 string; never a Unix number."""
    if v is None:
        return None
    if isinstance(v, datetime):
        return _utc(v)
    if isinstance(v, str):
        return parse_rfc3339(v)
    # pydantic alone would also read 1700000000 or "1700000000" as a Unix time (seconds or ms: a guess)
    raise ValueError(f"must be {_TIME_FORMAT}")


Rfc3339 = Annotated[datetime, BeforeValidator(_time_input)]
"""An RFC 3339 time for request models and query parameters (the same rule as the contract's times)."""


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (U+0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid Unicode text"
    return None


def claimed_fields(raw: bytes | None) -> dict[str, Any]:
    """The fields a record's JSON object claims (untrusted: for naming a refused record, never for applying it);
    {} when it is not a JSON object. A record nested past what the parser reads still names its top-level text
    fields (its tenant, its event_id): they are read from its tokens, the nesting skipped."""
    if not raw:
        return {}
    try:
        value = read_json(raw)
    except RecursionError:
        return _top_level_text(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# a JSON string (its escapes included) or one structural character: what the top level of an object is made of
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')


def _top_level_text(raw: bytes) -> dict[str, Any]:
    """The text fields of the object `raw` holds, at its top level; what is nested inside them is skipped. Of a name
    given twice the last value counts, as every JSON parser here reads it (a name whose last value is not text is
    left out), so the record names the tenant its parsed form does."""
    out: dict[str, Any] = {}
    depth, last, name = 0, b"", None
    for token in _JSON_TOKEN.finditer(raw):
        t = token.group()
        if name is not None:  # the token after a top-level name's colon: its text, or what follows another value
            try:
                out[json.loads(name)] = json.loads(t) if t.startswith(b'"') else None
            except ValueError:  # not UTF-8: no text
                with contextlib.suppress(ValueError):
                    out[json.loads(name)] = None
            name = None
        if t in (b"{", b"["):
            depth += 1
        elif t in (b"}", b"]"):
            depth -= 1
        elif t == b":" and depth == 1 and last.startswith(b'"'):
            name = last
        last = t
    return {k: v for k, v in out.items() if v is not None}


def named_subject(raw: bytes | None) -> str | None:
    """The subject a record's JSON names if an event could name it (text, not blank, at most 256 characters,
    storable), else None: what an erasure could name (a sealed record's subject is in clear)."""
    subject = claimed_fields(raw).get("subject")
    return subject if _nameable(subject) else None


def keyed_subject(key: bytes | None, tenant: str | None) -> str | None:
    """The subject a ledger record's Kafka key (`kafka_key`) names, when the key is `tenant`'s and an event could
    name that subject, else None: where a record whose JSON names none (or none an event could) was filed."""
    if not key or not tenant:
        return None
    try:
        named, bar, subject = key.decode().partition("|")
    except UnicodeDecodeError:
        return None
    return subject if bar and named == tenant and _nameable(subject) else None


def _nameable(subject: Any) -> bool:
    return isinstance(subject, str) and bool(subject.strip()) and len(subject) <= 256 and _bad_text(subject) is None


TENANT_PATTERN, TENANT_MAX = r"^[^|\s]+$", 128  # `|` joins tenant and subject in the Kafka key
_TENANT = re.compile(TENANT_PATTERN)  # fullmatch: `$` alone also matches before a trailing line feed


def well_formed_tenant(tenant: str) -> bool:
    """Whether the contract takes `tenant` as a tenant id (1-128 characters, no `|` or white space, storable)."""
    return len(tenant) <= TENANT_MAX and _TENANT.fullmatch(tenant) is not None and _bad_text(tenant) is None


def check_storable(text: str, field: str) -> str:
    """`text` if every store can keep it, else InvalidEvent('unstorable_text') naming `field`."""
    problem = _bad_text(text)
    if problem is not None:
        raise InvalidEvent("unstorable_text", problem, field)
    return text


READ_AS_ZERO = "is too small for a number to keep: it would be read as 0"  # a literal like 1e-400


def _refuse(code: str, path: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(code, "{path} " + message, {"path": path})


def _check_json(value: Any, path: str, depth: int = 0) -> None:
    """Refuse what the projections could not keep exactly: unstorable text, numbers out of range, deep nesting."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        problem = _bad_text(value)
        if problem is not None:
            raise _refuse("unstorable_text", path, problem)
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise _refuse("number_out_of_range", path, "is an integer outside the signed 64-bit range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse("number_out_of_range", path, "is not a finite number (NaN and infinities are not JSON)")
        if type(value) is _TooSmall:
            raise _refuse("number_out_of_range", path, READ_AS_ZERO)
        if value == 0.0 and math.copysign(1.0, value) < 0 and path.split(".", 1)[0] == "value":  # jsonb keeps 0
            raise _refuse("number_out_of_range", path, "is -0.0, which the stores keep as 0: send 0")
    elif isinstance(value, dict | list | tuple):
        if depth >= MAX_VALUE_DEPTH:
            raise _refuse("too_deep", path, f"is nested deeper than {MAX_VALUE_DEPTH} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, item in items:
            if isinstance(k, str):
                problem = _bad_text(k)
                if problem is not None:
                    raise _refuse("unstorable_text", f"{path}.{k!r}", "has a key that " + problem)
            elif isinstance(value, dict):
                raise _refuse("wrong_type", f"{path}.{k!r}", f"has a {type(k).__name__} key: JSON keys are strings")
            _check_json(item, f"{path}.{k}", depth + 1)
    elif isinstance(value, BaseModel):
        _check_json(value.model_dump(mode="json"), path, depth)
    elif isinstance(value, Iterable) and not isinstance(value, bytes | bytearray):
        # a set, a generator, a deque, a dict view: validation would turn it into a list its items unchecked (and a
        # one-shot iterator read here is empty there), and a set's order changes from one process to the next
        raise _refuse("wrong_type", path, f"is a {type(value).__name__}, which JSON does not have: give a list")
    else:
        try:  # what orjson writes as JSON (a datetime, a UUID) is kept as it writes it; anything else is no JSON
            orjson.dumps(value)
        except TypeError:
            raise _refuse("wrong_type", path, f"is of type {type(value).__name__}, which JSON does not have") from None


def _json_ok(value: Any, depth: int = 0) -> bool:
    """True only if `_check_json` would accept `value`: its fast path, as the full check is costly on the decode path.

    Exact JSON types only and no paths built; anything else answers False, and `_check_json` (the authority, which
    names the path of what it refuses) then judges the value.
    """
    t = type(value)
    if t is str:
        return "\x00" not in value if value.isascii() else _bad_text(value) is None
    if value is None or t is bool:
        return True
    if t is int:
        return INT_MIN <= value <= INT_MAX
    if t is float:
        return math.isfinite(value) and (value != 0.0 or math.copysign(1.0, value) > 0)
    if t is dict:
        if depth >= MAX_VALUE_DEPTH:
            return False
        for k, item in value.items():
            if type(k) is not str or not _json_ok(k) or not _json_ok(item, depth + 1):
                return False
        return True
    if t is list:
        if depth >= MAX_VALUE_DEPTH:
            return False
        return all(_json_ok(item, depth + 1) for item in value)
    return False


def _walk(data: dict[str, Any]) -> None:
    """The event's fields checked for what no store could keep (PydanticCustomError naming the first refused)."""
    for k, v in data.items():
        if not _json_ok(v):  # the fast path; _check_json names what it refuses
            _check_json(v, str(k))


STORABLE_JSON = "storable_json"  # validation context key: the caller judges storability itself, not the model
_STORABLE = {STORABLE_JSON: True}


def storable_json(raw: bytes) -> bool:
    """True only if every value orjson reads from `raw` passes `_check_json`, so validation may skip the walk.

    What orjson reads from bytes holds no lone surrogate (it refuses them) and no NaN or infinity (refused too), so
    only five things are left, each ruled out by the bytes alone, conservatively (also inside strings): a NUL
    (only the escape `\\u0000` spells one: a raw NUL byte is not JSON), an integer outside 64 bits (it has 19
    digits or more), a negative zero (no number spelled as one: `_NEGATIVE_ZERO`), a number too small for a double
    (no exponent of -100 or less) and nesting deeper than MAX_VALUE_DEPTH (no more brackets than that in the whole
    record). `read_record` reads with it, a record holding such an exponent never by orjson (`read_json`).
    """
    tiny = _may_read_as_zero(raw)
    return _storable_but_digits(raw) and not has_long_digit_run(raw) and not tiny


def _storable_but_digits(raw: bytes) -> bool:
    """`storable_json` but for its runs of digits (a reader that has looked for them already)."""
    return (
        b"\\u0000" not in raw and not _has_negative_zero(raw) and raw.count(b"{") + raw.count(b"[") <= MAX_VALUE_DEPTH
    )


# a negative zero as a JSON number writes it (-0, -0.0, -0e5), after what may stand before a value; conservative: a
# string holding one (": -0 ") sends its record to the walk too, never the other way (a date's "-01" is none)
_NEGATIVE_ZERO = re.compile(rb"-0(?:\.0+)?(?:[eE][+-]?[0-9]+)?(?![0-9.eE])")
_BEFORE_A_VALUE = frozenset(b":[, \t\n\r")


def _has_negative_zero(raw: bytes) -> bool:
    """Whether `raw` may hold a negative zero: each `-0` (a record's dates hold a few) is judged where it stands, which
    is a few times cheaper than a search of the whole record."""
    i = raw.find(b"-0")
    while i != -1:
        if i > 0 and raw[i - 1] in _BEFORE_A_VALUE and _NEGATIVE_ZERO.match(raw, i) is not None:
            return True
        i = raw.find(b"-0", i + 2)
    return False


def rfc3339(value: datetime) -> str:
    """UTC, microsecond precision, `Z` suffix: one spelling for every time we write."""
    if type(value) is datetime and value.tzinfo is UTC:  # what validation gives: orjson spells it in a third the time
        text = orjson.dumps(value, option=orjson.OPT_UTC_Z)  # b'"...:05Z"', or b'"...:05.000006Z"' (6 digits)
        return text[1:-1].decode() if value.microsecond else text[1:-2].decode() + ".000000Z"
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def now() -> datetime:
    return datetime.now(UTC)


def new_event_id() -> str:
    return uuid.uuid4().hex


def _digest(*parts: str) -> str:
    """sha256 over a JSON array of the parts: unambiguous, whatever characters a part contains."""
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


def memory_id_for(
    tenant: str, subject: str, key: str | None, scope: str = "", *, episodic_event_id: str | None = None
) -> str:
    """The stable identity of a fact: the same (tenant, subject, key, scope) always gives the same id.

    Episodic memories have no key: their identity comes from their event_id.
    """
    if episodic_event_id is not None:
        return _digest("episodic", tenant, subject, episodic_event_id)
    return _digest("fact", tenant, subject, key or "", scope)


def version_id_for(tenant: str, event_id: str) -> str:
    """The id of the version an assertion creates: scoped by tenant, as event ids are."""
    return _digest("version", tenant, event_id)


@functools.lru_cache(maxsize=65_536)  # the worker asks for it once per sealed record: a batch repeats subjects
def subject_digest_for(tenant: str, subject: str) -> str:
    """A subject's name where its id must not appear in clear (the key store, erasure records)."""
    return _digest("subject", tenant, subject)


# a browser resolves `.` and `..` in a URL path as dot segments, `%2E` spelled or not (the WHATWG URL rules), so the
# console could never ask for such a subject or event id: no door asserts one (clients that keep `%2E`, as the
# Python client and curl do, still reach, retract and erase one a raw producer wrote)
DOT_SEGMENT = (
    "a `.` or `..` between slashes (or alone) cannot be named in a URL path (a client resolves it as a dot segment, "
    "and would name another subject): choose another"
)

RESOLVED_AT_ITS_DOOR = (
    "names a dead letter: resolve it with POST /v1/dead-letters/redrive or /discard (or the MCP operator tools), "
    "which check the letter is this tenant's and open, and let one action resolve it"
)


_DOT_SEGMENTS = frozenset({".", ".."})


def door_refusal(event: MemoryEvent, *, resolutions: bool = False) -> InvalidEvent | None:
    """What every door (the API's, MCP's, the SDK's) refuses of an event the contract takes, else None: naming a
    dead letter outside the dead-letter workflow (`resolutions`: the caller is that workflow, which checked the
    letter), and `.` or `..` as a segment (between slashes, or alone) of an asserted subject or of any event id.
    Not the contract's: the worker still applies
    such an event a raw producer wrote, as the log may hold one."""
    if event.dead_letter is not None and not resolutions:
        return InvalidEvent("invalid_value", RESOLVED_AT_ITS_DOOR, "dead_letter")
    # an asserted subject, never an erasure's or retraction's: those must reach one a raw producer wrote
    named = ("subject", "event_id") if event.type is EventType.ASSERTED else ("event_id",)
    dots = next((f for f in named if _DOT_SEGMENTS.intersection(getattr(event, f).split("/"))), None)
    return InvalidEvent("invalid_value", DOT_SEGMENT, dots) if dots is not None else None


def kafka_key(tenant: str, subject: str) -> bytes:
    """All events of one subject share a key, so they stay ordered in one partition."""
    return f"{tenant}|{subject}".encode()


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: SourceType = SourceType.SYSTEM
    service: str | None = Field(default=None, max_length=256)
    ref: str | None = Field(default=None, max_length=1024)
    actor: str | None = Field(default=None, max_length=256)


LETTER_ID_PREFIX = "deadletter:"  # the ids of dead letters' resolutions: `letter_id`


def letter_id(partition: int, offset: int) -> str:
    """The event id every resolution of the dead letter at (partition, offset) claims, so one action resolves it."""
    return f"{LETTER_ID_PREFIX}{partition}:{offset}"


class DeadLetterRef(BaseModel):
    """The position in the ledger topic of a dead letter of the event's own tenant that the event resolves.

    On any event but an erasure it makes the event a re-drive (the corrected record); on `deadletter.discarded`
    it names the letter closed. The projection keeps the first resolution of a letter by ledger position.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: int = Field(ge=0, le=2**31 - 1)
    offset: int = Field(ge=0, le=INT_MAX)


class MemoryEvent(BaseModel):
    """One memory assertion (or retraction, confirmation, erasure) on the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False)

    event_id: str = Field(default_factory=new_event_id, min_length=1, max_length=128)
    type: EventType
    tenant: str = Field(min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN)
    subject: str = Field(min_length=1, max_length=256)
    key: str | None = Field(default=None, min_length=1, max_length=256)
    scope: str = Field(default="", max_length=256)
    value: Any = None
    content: str | None = Field(default=None, max_length=MAX_CONTENT_CHARS)
    kind: Kind = Kind.STATE
    entities: list[str] = Field(default_factory=list, max_length=64)
    aliases: list[str] = Field(default_factory=list, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    source: Source = Field(default_factory=Source)
    # strict: a number, never text or true/false read as one ("0.5" and true are `wrong_type`)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    importance: float = Field(default=0.5, ge=0.0, le=1.0, strict=True)
    observed_at: datetime = Field(default_factory=now)
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    reason: str | None = Field(default=None, max_length=1024)  # why a retraction/erasure happened
    target_version: str | None = Field(default=None, min_length=1, max_length=64)  # retract this version only
    dead_letter: DeadLetterRef | None = None  # the dead letter this event re-drives (or discards)
    schema_version: int = CURRENT_SCHEMA_VERSION

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any, info: ValidationInfo) -> Any:
        """Everything the projector could never store is refused here, at the door, with its path."""
        if isinstance(data, dict):
            try:
                given_null = None in data.values()  # most events give none: no copy then
            except Exception:  # noqa: BLE001 - a value whose == refuses None: the filter below judges
                given_null = True
            if given_null:
                data = {k: v for k, v in data.items() if not (v is None and k in _DEFAULTED)}  # null: "not given"
            if info.context is not None and info.context.get(STORABLE_JSON):
                return data  # the caller judges it: bytes `storable_json` cleared, or `from_dict_encoded`
            _walk(data)
        return data

    @field_validator("observed_at", "valid_from", "valid_to", mode="before")
    @classmethod
    def _rfc3339_only(cls, v: Any) -> Any:
        return _time_input(v)  # None, or an aware UTC datetime, which the datetime validation keeps as it is

    @field_validator("confidence", "importance")
    @classmethod
    def _no_negative_zero(cls, v: float | None) -> float | None:
        """-0.0 is 0 (a score, unlike `value`, has no spelling to keep): stored, read back and fingerprinted as 0.0,
        so the event as it reads back is the same event."""
        return 0.0 if v == 0.0 else v

    @field_validator("entities", "aliases", "tags")
    @classmethod
    def _clean_list(cls, v: list[str]) -> list[str]:
        out = []
        for item in v:
            item = item.strip()
            if not item:
                raise ValueError("must not contain empty strings")
            if len(item) > 256:
                raise ValueError("items must be at most 256 characters")
            if item not in out:
                out.append(item)
        return out

    @field_validator("subject", "key", "content", "event_id")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be blank")
        return v

    @model_validator(mode="after")
    def _rules(self) -> MemoryEvent:
        if self.schema_version != CURRENT_SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not supported (upcast first)")
        if self.type is EventType.ASSERTED:
            if self.content is None:
                raise ValueError("content is required for memory.asserted")
            if self.kind is not Kind.EPISODIC and self.key is None:
                raise ValueError("key is required unless kind is episodic")
        elif self.type in (EventType.RETRACTED, EventType.CONFIRMED) and self.key is None:
            if self.target_version is None:  # a targeted retraction names its version: an episode has no key
                raise ValueError(f"key is required for {self.type.value} (or target_version for a retraction)")
        if self.target_version is not None and self.type is not EventType.RETRACTED:
            raise ValueError("target_version is only for memory.retracted")
        if self.type is EventType.DISCARDED and (self.dead_letter is None or self.reason is None):
            raise ValueError("deadletter.discarded names its dead_letter and a reason")
        link = self.dead_letter
        if self.event_id.startswith(LETTER_ID_PREFIX) and (
            link is None or self.event_id != letter_id(link.partition, link.offset)
        ):
            # every resolution of the letter at (p, o) claims this id, so that one action resolves it: another event
            # holding it would leave the letter unresolvable for good
            raise ValueError(
                f"event_id beginning {LETTER_ID_PREFIX!r} is a dead letter's resolution: only the event resolving "
                "the letter it names (its dead_letter) has it; choose another id"
            )
        if self.type is EventType.ERASED:
            if self.dead_letter is not None:
                raise ValueError("dead_letter is not for subject.erased (an erasure corrects no record)")
            given = _carried_by_erasure(self)
            if given is not None:
                raise ValueError(
                    f"{given} is not for subject.erased: an erasure is never sealed (it must stay readable once the "
                    "subject's key is destroyed), so it carries nothing about the subject but its id and a reason"
                )
        if self.source.type is SourceType.EXPLICIT:
            if self.confidence is not None and self.confidence != 1.0:
                raise ValueError("an explicit source carries confidence 1.0")
            object.__setattr__(self, "confidence", 1.0)
        elif self.confidence is None:
            object.__setattr__(self, "confidence", 0.8)
        if self.valid_from is None:
            object.__setattr__(self, "valid_from", self.observed_at)
        if self.valid_to is not None and self.valid_to <= self.valid_from:
            raise ValueError("valid_to must be after valid_from")
        return self

    @property
    def memory_id(self) -> str:
        if self.kind is Kind.EPISODIC and self.type is EventType.ASSERTED:
            return memory_id_for(self.tenant, self.subject, None, episodic_event_id=self.event_id)
        return memory_id_for(self.tenant, self.subject, self.key, self.scope)

    @property
    def version_id(self) -> str:
        """The id of the version this event creates (for an assertion): tenant-scoped."""
        return version_id_for(self.tenant, self.event_id)

    @property
    def fingerprint(self) -> str:
        """What the event says, without its id and its observation time: equal for a retry.

        Same (tenant, event_id) with the same fingerprint is a redelivery (no effect); with another
        fingerprint it is a conflict, reported to the publisher and dead-lettered, never applied.
        observed_at is left out (a publisher that lets it default stamps each retry anew), and so
        is valid_from when it only repeats observed_at.
        """
        return wire_fingerprint(self.to_wire())

    @property
    def kafka_key(self) -> bytes:
        return kafka_key(self.tenant, self.subject)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as it goes on the wire (times as RFC 3339 strings, enums as values)."""
        fields = self.__dict__
        if type(fields["value"]) not in _SCALARS or len(fields) != len(_FIELDS):
            return self._dumped_wire()  # a container (or anything else), or fields not a validated event's
        # the fields (already in model_dump's order) but the None ones, and the few that are not JSON as they are
        # replaced in place: model_dump's wire (the wire-bytes test pins it) for a fraction of a loop over them
        out = {k: v for k, v in fields.items() if v is not None or k == "value"}
        try:
            out["type"] = fields["type"]._value_
            out["kind"] = fields["kind"]._value_
            out["entities"] = list(fields["entities"])  # copies, as model_dump's: the wire never shares the event's
            out["aliases"] = list(fields["aliases"])
            out["tags"] = list(fields["tags"])
            source = fields["source"].__dict__
            out["source"] = {
                sk: (sv._value_ if isinstance(sv, StrEnum) else sv) for sk, sv in source.items() if sv is not None
            }
            observed, valid_from, valid_to = fields["observed_at"], fields["valid_from"], fields["valid_to"]
            out["observed_at"] = observed_text = rfc3339(observed)
            if valid_from is not None:  # most often observed_at itself: spelled once
                out["valid_from"] = observed_text if valid_from is observed else rfc3339(valid_from)
            if valid_to is not None:
                out["valid_to"] = rfc3339(valid_to)
            if "dead_letter" in out:
                ref = fields["dead_letter"]
                out["dead_letter"] = {"partition": ref.partition, "offset": ref.offset}
        except AttributeError:  # a field of another type than validation gives (a model built without it)
            return self._dumped_wire()
        return out

    def _dumped_wire(self) -> dict[str, Any]:
        """`to_wire` from `model_dump`: what any value becomes on the wire."""
        data = self.model_dump(mode="python", exclude_none=False)
        out: dict[str, Any] = {}
        last: tuple[datetime | None, str] = (None, "")  # valid_from is most often observed_at itself: spelled once
        for k, v in data.items():  # one pass: each extra pass costs more than model_dump itself
            if type(v) in _AS_IS:  # most fields: checked first, by exact type (a StrEnum is not a str here)
                out[k] = v
            elif v is None:
                if k == "value":
                    out[k] = v
            elif k == "source":
                out[k] = {sk: (sv._value_ if isinstance(sv, StrEnum) else sv) for sk, sv in v.items() if sv is not None}
            elif isinstance(v, datetime):
                if v is not last[0]:
                    last = (v, rfc3339(v))
                out[k] = last[1]
            elif isinstance(v, StrEnum):
                out[k] = v._value_
            else:
                out[k] = v
        return out


def _carried_by_erasure(event: MemoryEvent) -> str | None:
    """The first field an erasure may not carry that `event` gives: what the subject said, or who said it."""
    for name in ("key", "scope", "content", "value", "entities", "aliases", "tags"):
        if getattr(event, name) not in (None, "", []):
            return name
    for name in ("ref", "actor"):
        if getattr(event.source, name) is not None:
            return f"source.{name}"
    return None


_AS_IS = frozenset({str, int, float, bool, list})  # _dumped_wire writes these as they are
_SCALARS = frozenset({str, int, float, bool, type(None)})  # a `value` model_dump leaves as it is
_FIELDS = tuple(MemoryEvent.model_fields)  # model_dump's order


# every field with a default, read from the model (a new field is covered): an explicit JSON null for one of
# them means "not given", never "refused" (MemoryEvent._storable drops it before validation)
_DEFAULTED = frozenset(name for name, f in MemoryEvent.model_fields.items() if not f.is_required())


def wire_fingerprint(wire: dict[str, Any]) -> str:
    """`MemoryEvent.fingerprint` of the event whose `to_wire()` is `wire` (left as it is): a writer that holds the
    wire already (the recorder stores it as the payload) computes it once."""
    wire = dict(wire)
    wire.pop("event_id", None)
    observed = wire.pop("observed_at", None)
    if wire.get("valid_from") == observed:
        wire.pop("valid_from", None)
    return hashlib.sha256(orjson.dumps(wire, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


# schema_version -> function turning that version's dict into the next version's
UPCASTERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    # v0 (pre-release) called the content "text" and had no schema_version
    0: lambda d: {
        **{k: v for k, v in d.items() if k != "text"},
        "content": d.get("content", d.get("text")),
        "schema_version": 1,
    },
}


def upcast(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older event dict up to the current schema; never rewrites the stored record."""
    # v0 records carried no schema_version: recognise them by their "text" field
    implicit = 0 if "text" in data and "content" not in data else CURRENT_SCHEMA_VERSION
    version = data.get("schema_version")
    if version is None:  # left out, or an explicit null: "not given", as for every defaulted field
        version = implicit
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidEvent("wrong_type", "schema_version must be an integer", "schema_version")
    if version > CURRENT_SCHEMA_VERSION:
        raise InvalidEvent(
            "unsupported_schema", f"schema_version {version} is newer than {CURRENT_SCHEMA_VERSION}", "schema_version"
        )
    while version < CURRENT_SCHEMA_VERSION:
        step = UPCASTERS.get(version)
        if step is None:
            raise InvalidEvent("unsupported_schema", f"no upcaster from schema_version {version}", "schema_version")
        data = step(data)
        version = data.get("schema_version", version + 1)
    return data


_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "enum": "unknown_value",
    "literal_error": "unknown_value",
    "string_unicode": "unstorable_text",  # a lone surrogate in text the JSON parser read: no store keeps it
}


def error_code(etype: str) -> str:
    """pydantic's error type as the ledger's code: the one vocabulary of the door, the HTTP API and the MCP tools
    (listed in api.errors.ERROR_CODES), so the same mistake is named alike wherever it is made."""
    code = _CODES.get(etype)
    if code is not None:
        return code
    if etype.startswith(("datetime", "date", "time")):
        return "invalid_time"
    if etype.endswith("_type") or etype.endswith("_parsing"):
        return "wrong_type"
    return "invalid_value"


def from_error(exc: ValidationError) -> InvalidEvent:
    """The first validation error as an InvalidEvent naming its field."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    etype = err.get("type", "")
    code = error_code(etype)
    if field == "type" and code == "unknown_value":
        code = "unknown_type"
    msg = err.get("msg", "invalid")
    ctx = err.get("ctx") or {}
    if etype in ("unstorable_text", "number_out_of_range", "too_deep", "wrong_type"):  # the walk's, with a path
        return InvalidEvent(etype, msg.split(" ", 1)[1] if " " in msg else msg, ctx.get("path") or field)
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if field is None:  # a cross-field rule: its message starts with the field it is about
        first = msg.split(" ", 1)[0]
        field = (
            "confidence"
            if msg.startswith("an explicit")
            else (first if first.split(".", 1)[0] in MemoryEvent.model_fields else None)
        )
        if code == "invalid_value" and "required" in msg:
            code = "missing_field"
    if field in ("observed_at", "valid_from", "valid_to") and code == "invalid_value":
        code = "invalid_time"
    return InvalidEvent(code, msg, field)


def from_dict(
    data: Any,
    *,
    default_observed_at: datetime | None = None,
    now: datetime | None = None,
    max_future_skew: timedelta | None = None,
    storable: bool = False,
) -> MemoryEvent:
    """Validate a decoded JSON value as an event (upcasting older schema versions).

    With `max_future_skew`, an observed_at later than `now` (default: `default_observed_at`, else
    the clock) plus the skew is refused (`clock_skew`): a clock in the future would otherwise win
    over every later update until that time comes. `storable`: `data` is orjson's reading of bytes that
    `storable_json` cleared (the checks for what no store could keep are then known to pass).
    """
    if not isinstance(data, dict):
        raise InvalidEvent("not_an_object", f"an event is a JSON object, got {json_kind(data)}")
    data = upcast(data)
    if default_observed_at is not None and data.get("observed_at") is None:
        data = {**data, "observed_at": default_observed_at}
    try:
        event = MemoryEvent.model_validate(data, context=_STORABLE if storable else None)
    except ValidationError as exc:
        raise from_error(exc) from None
    if max_future_skew is not None:
        check_skew(event, max_future_skew, now or default_observed_at)
    return event


def check_skew(event: MemoryEvent, max_future_skew: timedelta, reference: datetime | None = None) -> MemoryEvent:
    """`event`, unless its observed_at is more than `max_future_skew` after `reference` (default: the clock)."""
    reference = reference or datetime.now(UTC)
    if event.observed_at > reference + max_future_skew:
        raise InvalidEvent(
            "clock_skew",
            f"observed_at {rfc3339(event.observed_at)} is more than {max_future_skew.total_seconds():.0f} s "
            f"after {rfc3339(reference)}",
            "observed_at",
        )
    return event


# orjson reads an integer past 64 bits as a float (silently another number): JSON with such an integer is read by
# the standard parser. Runs of 19 or more digits (what every integer outside 64 bits has) are found by mapping every
# digit to "0" and everything else to " " (bytes.translate runs in C, far faster than a regular expression); a run
# is an integer where a number may start (after "[", ":" or ",", spaces and a minus sign): inside a string (a hex
# digest often holds one) it is not
_DIGITS_AS_ZEROS = bytes(ord("0") if chr(i).isdigit() and i < 128 else ord(" ") for i in range(256))
_LONG_RUN = b"0" * 19


def has_long_digit_run(raw: bytes) -> bool:
    """Whether `raw` holds a run of 19 digits or more: the shortest integer outside signed 64 bits has 19."""
    return _LONG_RUN in raw.translate(_DIGITS_AS_ZEROS)


_NUMBER_AFTER = frozenset(b"[:,")
_RUNS_JUDGED = 10_000  # past this many runs in strings, the standard parser reads the JSON (slower, never wrong)


def _may_hold_a_long_integer(raw: bytes, zeros: bytes, start: int) -> bool:
    """Whether a run of digits from `start` on (`zeros`: `raw` translated) may be an integer, not text."""
    for _ in range(_RUNS_JUDGED):
        if start == -1:
            return False
        # what precedes the run; 64 bytes of it are all spaces (or the start): judged a number, to be safe
        before = raw[max(0, start - 64) : start].rstrip(b"-").rstrip(b" \t\r\n")
        if not before or before[-1] in _NUMBER_AFTER:
            return True
        end = zeros.find(b" ", start)
        start = -1 if end == -1 else zeros.find(_LONG_RUN, end)
    return True


def json_kind(value: Any) -> str:
    """What JSON calls `value`'s kind (a refusal speaks of the JSON its sender wrote, not of Python's types)."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
        case _:
            return type(value).__name__


def read_json(raw: bytes) -> Any:
    """JSON as the standard `json.loads` reads it, by orjson where that gives the same value: every door and every
    reader of the ledger reads a record so, and the contract judges what only the standard parser reads (NaN, 1e999,
    a lone surrogate, an integer past 64 bits) by name. Raises ValueError (not JSON, not UTF-8) or RecursionError
    (nested deeper than the parser goes)."""
    return _read_json(raw)[0]


def _read_json(raw: bytes) -> tuple[Any, bool]:
    """`read_json`, and whether orjson read bytes without a run of 19 digits (then no NaN, infinity or lone
    surrogate is in it, nor an integer outside 64 bits: `storable_json` but for its first two rules holds)."""
    zeros = raw.translate(_DIGITS_AS_ZEROS)
    start = zeros.find(_LONG_RUN)
    tiny = _may_read_as_zero(raw)
    if not tiny and (start == -1 or not _may_hold_a_long_integer(raw, zeros, start)):
        try:
            return orjson.loads(raw), start == -1
        except orjson.JSONDecodeError:
            pass
    # text, as UTF-8 (one BOM before it let be): given bytes, json.loads would also read UTF-16 and UTF-32
    return json.loads(raw.decode("utf-8-sig"), parse_float=_float), False


class _TooSmall(float):
    """0.0 read from a literal that is not zero (1e-400): the contract refuses it by name (`_check_json`)."""


# an exponent of -100 or less: the only way a number shorter than a run of 19 digits reads as a double of another
# order (past -308 it is subnormal, then 0), so only records holding one leave orjson for `_float`
_TINY_EXPONENT = re.compile(rb"[eE]-0*[1-9][0-9]{2}")
# or a fraction written out, alone or with an exponent of two digits (three are the regex's): a double's smallest is
# ~4.9e-324, so 200 zeros after a point is where such a literal may start to read as 0 (`_float` decides)
_TINY_FRACTION = b"." + b"0" * 200


def number_read_as_zero(raw: bytes, value: Any) -> str | None:
    """In `value`, what `read_json` made of `raw`: the path (`value.a.0`) of the first number whose literal is not
    zero but reads as 0 (1e-400), else None. A door whose own parser takes such a literal for 0.0 asks this of the
    bytes first, to refuse it as every other door does (`number_out_of_range`, READ_AS_ZERO)."""
    return _zero_at(value, "") if _may_read_as_zero(raw) else None


def _may_read_as_zero(raw: bytes) -> bool:
    """Whether `raw` may hold a number literal that is not zero but reads as 0 (then `_float` reads it)."""
    return ((b"e-" in raw or b"E-" in raw) and _TINY_EXPONENT.search(raw) is not None) or _TINY_FRACTION in raw


def _zero_at(value: Any, path: str) -> str | None:
    if type(value) is _TooSmall:
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, item in items:
        found = _zero_at(item, f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


def _float(text: str) -> float:
    """A JSON float as `json` reads it; a literal with a non-zero digit read as 0 is marked `_TooSmall`."""
    value = float(text)
    if value == 0.0 and any(c in "123456789" for c in text.split("e")[0].split("E")[0]):
        return _TooSmall(value)
    return value


def load_record(raw: bytes | None, max_bytes: int) -> Any:
    """A record's JSON value (`read_json`), or InvalidEvent: no value (`empty`), over `max_bytes` (`too_large`),
    nested past the parser (`too_deep`), not JSON."""
    return read_record(raw, max_bytes)[0]


def read_record(raw: bytes | None, max_bytes: int) -> tuple[Any, bool]:
    """`load_record`, and whether validation may leave out the walk for what no store could keep: orjson read the
    bytes and `storable_json` clears them."""
    if not raw:  # a null value (a tombstone) or zero bytes: nothing to read, not JSON gone wrong
        raise InvalidEvent("empty", "the record has no value" if raw is None else "the record's value is 0 bytes")
    if len(raw) > max_bytes:
        raise InvalidEvent("too_large", f"{len(raw)} bytes is more than {max_bytes}")
    try:
        value, digits_cleared = _read_json(raw)
    except RecursionError:
        message = f"is nested deeper than {MAX_VALUE_DEPTH} levels (past what the JSON parser reads)"
        raise InvalidEvent("too_deep", message) from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise InvalidEvent("bad_json", f"not valid JSON: {exc}") from None
    return value, digits_cleared and _storable_but_digits(raw)


def decode(
    raw: bytes | None,
    *,
    default_observed_at: datetime | None = None,
    max_future_skew: timedelta | None = None,
    mint_event_id: bool = False,
) -> MemoryEvent:
    """Kafka record bytes to a valid event, or InvalidEvent with the reason.

    `default_observed_at` (the record's broker timestamp) fills a missing observed_at and is
    the reference of `max_future_skew`, so replaying the log gives the same result every time.
    A record must carry its event_id; only a producer reading its own input (`ledger publish`, like
    `POST /v1/events`) passes `mint_event_id=True` to have one minted before the event is published.
    """
    data, storable = read_record(raw, MAX_EVENT_BYTES)
    return decode_value(
        data,
        default_observed_at=default_observed_at,
        max_future_skew=max_future_skew,
        mint_event_id=mint_event_id,
        storable=storable,
    )


def decode_value(
    data: Any,
    *,
    default_observed_at: datetime | None = None,
    max_future_skew: timedelta | None = None,
    mint_event_id: bool = False,
    storable: bool = False,
) -> MemoryEvent:
    """`decode` of a record's JSON value already loaded (a sealed record, once opened, is judged the same way);
    `storable` as for `from_dict`."""
    if not mint_event_id and isinstance(data, dict) and data.get("event_id") is None:
        # the model would mint a fresh id: every replay of this record would then be another event
        raise InvalidEvent(
            "missing_field", "a ledger record needs its event_id (the idempotency key); none was sent", "event_id"
        )
    return from_dict(data, default_observed_at=default_observed_at, max_future_skew=max_future_skew, storable=storable)


def encode(event: MemoryEvent) -> bytes:
    """The record value; InvalidEvent('too_large') if the worker would refuse its size."""
    return encode_wire(event.to_wire())


def encode_wire(wire: dict[str, Any]) -> bytes:
    """`encode` of the event whose `to_wire()` is `wire`: a writer that also fingerprints it (the SDK, with
    `wire_fingerprint`) builds the wire once."""
    return _sized(orjson.dumps(wire))


def _sized(raw: bytes) -> bytes:
    """`raw`, unless too large, as a copy of its own size: orjson returns the 1 KiB buffer it wrote in, shrunk in
    place, and records held by the thousand (a batch until its acks) left the heap such that each cost two page faults,
    several times the copy."""
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("too_large", f"the event encodes to {len(raw)} bytes, more than {MAX_EVENT_BYTES}")
    return bytes(memoryview(raw))


def _encoded(event: MemoryEvent) -> tuple[MemoryEvent, dict[str, Any], bytes]:
    wire = event.to_wire()
    return event, wire, encode_wire(wire)


def _walk_refuses(data: dict[str, Any]) -> bool:
    """Whether the walk inside validation would refuse `data` (or fail on it): validation with it then decides."""
    try:
        _walk(data)
    except Exception:  # noqa: BLE001 - whatever it raises, the full validation raises it the same way
        return True
    return False


_PLAIN_INPUT = frozenset({str, int, float, bool, type(None), list, dict, datetime})


def _cleared(data: dict[str, Any], raw: bytes) -> bool:
    """True only if the walk accepts `data`, the input of a valid event whose wire orjson wrote as `raw`.

    Validation bounds the numbers and the nesting of every field but `value`, and each string given reaches the wire
    (list items lose whitespace only, or are dropped as a repeat of one kept); orjson refuses a lone surrogate. Left:
    a NUL (orjson writes it `\\u0000`) and `value`, judged by the walk's own fast path. Input of another type than
    plain JSON (a model, a tuple) goes to the walk.
    """
    return b"\\u0000" not in raw and _json_ok(data.get("value")) and _PLAIN_INPUT.issuperset(map(type, data.values()))


def from_dict_encoded(
    data: Any, *, now: datetime | None = None, max_future_skew: timedelta | None = None
) -> tuple[MemoryEvent, dict[str, Any], bytes]:
    """`from_dict`, `to_wire` and `encode_wire` of a producer's event: the same event, wire and bytes, or the same
    error, with each event validated once (one refused by the walk for what no store could keep: twice).

    Validation leaves out the walk for what no store could keep when `_cleared` shows it would refuse nothing; the
    walk runs when it does not, or when validation or encoding fails, and if it refuses, `from_dict` names the
    refusal, as validation always did first.
    """
    if not isinstance(data, dict):
        return _encoded(from_dict(data, now=now, max_future_skew=max_future_skew))  # not_an_object
    data = upcast(data)
    try:
        event = MemoryEvent.model_validate(data, context=_STORABLE)
    except ValidationError as exc:
        if _walk_refuses(data):
            return _encoded(from_dict(data, now=now, max_future_skew=max_future_skew))
        raise from_error(exc) from None
    try:
        wire = event.to_wire()
        raw: bytes | None = orjson.dumps(wire)
    except Exception:  # noqa: BLE001 - judged below, and raised again as `encode` raises it
        raw = None
    if (raw is None or not _cleared(data, raw)) and _walk_refuses(data):
        return _encoded(from_dict(data, now=now, max_future_skew=max_future_skew))
    if max_future_skew is not None:
        check_skew(event, max_future_skew, now)
    if raw is None:
        return _encoded(event)  # what encoding raises, as `encode` raises it
    return event, wire, _sized(raw)


# --- access events: what recall and context served, on the access topic --------------------------------

ACCESS_TYPE = "memory.accessed"
MAX_ACCESS_BYTES = 4096  # an access record is a few hundred bytes; anything larger is not ours


class AccessEvent(BaseModel):
    """One memory that recall (or context) served: which version, found by which stage, to which caller, when.

    It goes on `Settings.access_topic`, never on the ledger: an access is an observation of the service, not a
    memory. It carries no content, subject or key (memory and version ids are digests) and the caller is a
    fingerprint of the API key, never the key. `access_id` = `access_id_for(tenant, caller, serving, memory_id,
    version_id)`: a redelivered or re-sent record is the same access, and so is a retried request that carries the
    same request id (the serving is the request id when there is one, else a fresh id per serving).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["memory.accessed"] = ACCESS_TYPE
    access_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    tenant: str = Field(min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN)
    memory_id: str = Field(min_length=1, max_length=64)
    version_id: str = Field(min_length=1, max_length=64)
    stage: str = Field(min_length=1, max_length=32)  # exact | keyword | semantic | hybrid (the hit's match.stage)
    via: str = Field(default="recall", min_length=1, max_length=32)  # the endpoint that served it: recall | context
    caller: str = Field(min_length=1, max_length=128)  # api.access.caller_id(key): a fingerprint, never the key
    request_id: str | None = Field(default=None, max_length=128)  # the caller's X-Request-ID, when it sent one
    accessed_at: Rfc3339
    schema_version: int = CURRENT_SCHEMA_VERSION

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for k, v in data.items():
                _check_json(v, str(k))
        return data


def access_id_for(tenant: str, caller: str, serving: str, memory_id: str, version_id: str) -> str:
    """The id of one access: the same serving of the same version to the same caller is one access."""
    return _digest("access", tenant, caller, serving, memory_id, version_id)


def access_key(tenant: str, memory_id: str) -> bytes:
    """The access topic's key: a fact's accesses share a partition (its aggregate is written by one consumer)."""
    return f"{tenant}|{memory_id}".encode()


def encode_access(event: AccessEvent) -> bytes:
    data = event.model_dump(mode="python")
    data["accessed_at"] = rfc3339(event.accessed_at)
    return orjson.dumps({k: v for k, v in data.items() if v is not None})


def decode_access(raw: bytes | None) -> AccessEvent:
    """Access record bytes to an AccessEvent, or InvalidEvent with the reason (as `decode` does for the ledger)."""
    data = load_record(raw, MAX_ACCESS_BYTES)
    if not isinstance(data, dict):
        raise InvalidEvent("not_an_object", f"an access is a JSON object, got {json_kind(data)}")
    try:
        return AccessEvent.model_validate(data)
    except ValidationError as exc:
        raise from_error(exc) from None
