"""The memory event contract (DESIGN §2), defined once and imported everywhere.

Every producer builds events with :class:`MemoryEvent`; every processor turns
raw Kafka bytes into one with :func:`decode`, which either returns a valid event
or raises :class:`InvalidEvent` carrying a reason code, the field at fault and a
human message (what the dead-letter topic records). No other module parses
event JSON.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "EventType",
    "InvalidEvent",
    "Kind",
    "MAX_EVENT_BYTES",
    "MemoryEvent",
    "Source",
    "SourceType",
    "decode",
    "encode",
    "kafka_key",
    "memory_id_for",
    "new_event_id",
    "rfc3339",
    "UPCASTERS",
]

CURRENT_SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 256 * 1024  # a larger record is refused, not truncated
MAX_CONTENT_CHARS = 16_000


class EventType(StrEnum):
    ASSERTED = "memory.asserted"
    RETRACTED = "memory.retracted"
    CONFIRMED = "memory.confirmed"
    ERASED = "subject.erased"


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


class InvalidEvent(ValueError):
    """A record that is not a valid event: `code` is stable, `field` names the culprit."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        self.code, self.message, self.field = code, message, field
        super().__init__(f"{code}: {message}" + (f" (field: {field})" if field else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message}


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must be an RFC 3339 time with a timezone offset (e.g. 2026-01-02T03:04:05Z)")
    return value.astimezone(UTC)


def rfc3339(value: datetime) -> str:
    """UTC, microsecond precision, `Z` suffix: one spelling for every time we write."""
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def now() -> datetime:
    return datetime.now(UTC)


def new_event_id() -> str:
    return uuid.uuid4().hex


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def memory_id_for(
    tenant: str, subject: str, key: str | None, scope: str = "", *, episodic_event_id: str | None = None
) -> str:
    """The stable identity of a fact: the same (tenant, subject, key, scope) always gives the same id.

    Episodic memories have no key: their identity comes from their event_id.
    """
    if episodic_event_id is not None:
        return _digest("episodic", tenant, subject, episodic_event_id)
    return _digest("fact", tenant, subject, key or "", scope)


def kafka_key(tenant: str, subject: str) -> bytes:
    """All events of one subject share a key, so they stay ordered in one partition."""
    return f"{tenant}|{subject}".encode()


_Str = Field(min_length=1, max_length=256)
_RFC3339_START = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: SourceType = SourceType.SYSTEM
    service: str | None = Field(default=None, max_length=256)
    ref: str | None = Field(default=None, max_length=1024)
    actor: str | None = Field(default=None, max_length=256)


class MemoryEvent(BaseModel):
    """One memory assertion (or retraction, confirmation, erasure) on the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    event_id: str = Field(default_factory=new_event_id, min_length=1, max_length=128)
    type: EventType
    tenant: str = Field(min_length=1, max_length=128, pattern=r"^[^|\s]+$")
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
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    observed_at: datetime = Field(default_factory=now)
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    reason: str | None = Field(default=None, max_length=1024)  # why a retraction/erasure happened
    schema_version: int = CURRENT_SCHEMA_VERSION

    @field_validator("observed_at", "valid_from", "valid_to", mode="before")
    @classmethod
    def _rfc3339_only(cls, v: Any) -> Any:
        # pydantic alone would also read 1700000000 or "1700000000" as a Unix time (seconds or ms: a guess)
        if (isinstance(v, int | float) and not isinstance(v, bool)) or (
            isinstance(v, str) and not _RFC3339_START.match(v)
        ):
            raise ValueError("must be an RFC 3339 time (e.g. 2026-01-02T03:04:05Z)")
        return v

    @field_validator("observed_at", "valid_from", "valid_to")
    @classmethod
    def _tz_aware(cls, v: datetime | None) -> datetime | None:
        return None if v is None else _utc(v)

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
            raise ValueError(f"key is required for {self.type.value}")
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
    def kafka_key(self) -> bytes:
        return kafka_key(self.tenant, self.subject)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as it goes on the wire (times as RFC 3339 strings, enums as values)."""
        data = self.model_dump(mode="python", exclude_none=False)
        out: dict[str, Any] = {}
        for k, v in data.items():
            if isinstance(v, datetime):
                v = rfc3339(v)
            elif isinstance(v, StrEnum):
                v = v.value
            out[k] = v
        out["source"] = {
            k: (v.value if isinstance(v, StrEnum) else v) for k, v in data["source"].items() if v is not None
        }
        return {k: v for k, v in out.items() if v is not None or k == "value"}


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
    version = data.get("schema_version", implicit)
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
}


def from_error(exc: ValidationError) -> InvalidEvent:
    """The first validation error as an InvalidEvent naming its field."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    etype = err.get("type", "")
    code = _CODES.get(etype)
    if code is None:
        if etype.startswith(("datetime", "date", "time")):
            code = "invalid_time"
        elif etype.endswith("_type") or etype.endswith("_parsing"):
            code = "wrong_type"
        else:
            code = "invalid_value"
    if field == "type" and code == "unknown_value":
        code = "unknown_type"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if field is None:  # a cross-field rule: its message starts with the field it is about
        first = msg.split(" ", 1)[0]
        field = (
            "confidence" if msg.startswith("an explicit") else (first if first in MemoryEvent.model_fields else None)
        )
        if code == "invalid_value" and "required" in msg:
            code = "missing_field"
    if field in ("observed_at", "valid_from", "valid_to") and code == "invalid_value":
        code = "invalid_time"
    return InvalidEvent(code, msg, field)


def from_dict(data: Any, *, default_observed_at: datetime | None = None) -> MemoryEvent:
    """Validate a decoded JSON value as an event (upcasting older schema versions)."""
    if not isinstance(data, dict):
        raise InvalidEvent("not_an_object", f"an event is a JSON object, got {type(data).__name__}")
    data = upcast(data)
    if default_observed_at is not None and data.get("observed_at") is None:
        data = {**data, "observed_at": default_observed_at}
    try:
        return MemoryEvent.model_validate(data)
    except ValidationError as exc:
        raise from_error(exc) from None


def decode(raw: bytes | None, *, default_observed_at: datetime | None = None) -> MemoryEvent:
    """Kafka record bytes to a valid event, or InvalidEvent with the reason.

    `default_observed_at` (the record's broker timestamp) fills a missing
    observed_at, so replaying the log gives the same result every time.
    """
    if raw is None:
        raise InvalidEvent("empty", "the record has no value")
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("too_large", f"{len(raw)} bytes is more than {MAX_EVENT_BYTES}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent("bad_json", f"not valid JSON: {exc}") from None
    return from_dict(data, default_observed_at=default_observed_at)


def encode(event: MemoryEvent) -> bytes:
    return orjson.dumps(event.to_wire())
