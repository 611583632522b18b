"""The event contract as a JSON Schema (draft 2020-12), for producers in other languages.

Generated from the one model, `producers.contract.MemoryEvent`, never written by hand; descriptions add what the
contract's validators check that JSON Schema cannot say, with the numbers read from the contract and the settings.
`ledger schema [--write | --check]` prints, regenerates or checks the checked-in file
(producers/schemas/memory-event.schema.json, served at GET /v1/schema/event).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from producers import contract
from producers.contract import (
    CURRENT_SCHEMA_VERSION,
    INT_MAX,
    INT_MIN,
    MAX_CONTENT_CHARS,
    MAX_EVENT_BYTES,
    MAX_VALUE_DEPTH,
    UPCASTERS,
    EventType,
    Kind,
    MemoryEvent,
    Source,
    SourceType,
)
from producers.settings import Settings

__all__ = ["SCHEMA_FILE", "SCHEMA_ID", "checked_in", "event_schema", "render"]

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "memory-event.schema.json"
# a name, not an address: the same document is in the repository, the package and GET /v1/schema/event
SCHEMA_ID = f"urn:memory-ledger:schema:memory-event:{CURRENT_SCHEMA_VERSION}"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

_TIME_PATTERN = contract._RFC3339.pattern  # the contract's own format regex (private there)
_TIMES = ("observed_at", "valid_from", "valid_to")
_TEXT = "no U+0000 (NUL) and no lone surrogate, which PostgreSQL cannot store"
_TEXT_NOTE = " No U+0000 (NUL) and no lone surrogate, which PostgreSQL cannot store."
_TIME = (
    "RFC 3339 with seconds and an offset (Z or +hh:mm), at most 6 fractional digits, a year 0001-9999 once "
    "converted to UTC; never a Unix number"
)


def _defaults() -> tuple[str, float]:
    fields = Settings.model_fields
    return fields["topic"].default, fields["max_future_skew_s"].default


def _field_notes() -> dict[str, str]:
    """What each field means and what the contract checks beyond the generated keywords (keys: MemoryEvent's fields)."""
    _, skew = _defaults()
    kinds = ", ".join(k.value for k in Kind)
    return {
        "event_id": (
            "The idempotency key with tenant: the same (tenant, event_id) with the same content is applied once "
            "(a retry is safe), with other content it is dead-lettered as event_id_conflict. Send one (a UUID): "
            "a ledger record without it is dead-lettered as missing_field (a minted id would differ on every "
            "replay)." + _TEXT_NOTE
        ),
        "type": "memory.asserted states a fact or an episode; memory.retracted ends one (or one version); "
        "memory.confirmed confirms the version in force; subject.erased erases the subject; deadletter.discarded "
        "closes a dead letter (dead_letter, with a reason) without a correction.",
        "tenant": "Whose memory this is; no '|' and no whitespace (the Kafka key is tenant|subject)." + _TEXT_NOTE,
        "subject": "What the memory is about (project:P1, user:42); not blank." + _TEXT_NOTE,
        "key": (
            "The fact's name (project.port); required for memory.asserted unless kind is episodic, for "
            "memory.confirmed, and for memory.retracted unless it names a target_version. (tenant, subject, key, "
            "scope) is the fact's identity." + _TEXT_NOTE
        ),
        "scope": "Narrows the fact's identity (a project, an environment); '' by default." + _TEXT_NOTE,
        "value": (
            f"Any JSON value. Beyond this schema: integers within signed 64 bits ({INT_MIN}..{INT_MAX}), no NaN or "
            f"Infinity (they are not JSON), nested at most {MAX_VALUE_DEPTH} levels; every string and object key: "
            + _TEXT
            + "."
        ),
        "content": (
            f"The memory as a sentence (what recall searches); required for memory.asserted, not blank, at most "
            f"{MAX_CONTENT_CHARS} characters." + _TEXT_NOTE
        ),
        "kind": (
            f"One of {kinds}: state and event supersede the previous version; a preference with valid_to is an "
            "override inside that window; episodic is append-only (no key needed)."
        ),
        "entities": "Names recall matches exactly (P1). Items are trimmed, must not be blank, at most 256 characters; "
        "duplicates are dropped." + _TEXT_NOTE,
        "aliases": "Phrases recall maps to this key (backend port, 后端服务地址); the same item rules as entities.",
        "tags": "Free labels recall can filter on; the same item rules as entities.",
        "source": f"Who said it. type: {', '.join(t.value for t in SourceType)} (default system).",
        "confidence": "0..1; an explicit source carries 1.0 (the default then); other sources default to 0.8.",
        "importance": "0..1, default 0.5; a ranking prior of recall.",
        "observed_at": (
            f"When the producer learned it. {_TIME}. Left out: the record's broker timestamp. Refused (clock_skew) "
            f"more than {skew:g} s (LEDGER_MAX_FUTURE_SKEW_S) after the record's broker timestamp."
        ),
        "valid_from": f"When it became true; default observed_at. {_TIME}.",
        "valid_to": f"When it stops being true (exclusive); after valid_from. {_TIME}.",
        "reason": "Why (a retraction, an erasure, a discarded dead letter)." + _TEXT_NOTE,
        "dead_letter": "The ledger position (partition, offset) of a dead letter of the same tenant that this event "
        "resolves: any event but subject.erased carrying it is the corrected record (a re-drive); "
        "deadletter.discarded names the letter it closes. The first resolution by ledger position stays.",
        "target_version": "memory.retracted only: end exactly this version_id, if it is in force (a version of the "
        "fact, or an episode of the subject: then key may be left out).",
        "schema_version": f"{CURRENT_SCHEMA_VERSION}, the current version (the default); older ones are upcast.",
    }


def _description() -> str:
    topic, skew = _defaults()
    return (
        "One event on the memory-ledger (the contract: producers/contract.py, MemoryEvent). Publish it to the "
        f"ledger topic ({topic} by default, LEDGER_TOPIC) as a UTF-8 JSON object of at most {MAX_EVENT_BYTES} "
        "bytes, with the Kafka key tenant|subject (UTF-8), so one subject stays in one partition, in order. "
        "A record the contract refuses is not applied: it goes to the dead-letter topic with a reason code, the "
        "field at fault and the original bytes. Checked by the contract beyond this schema: "
        f"(1) text: {_TEXT}, in every string, object key and list item, inside value and source too; "
        f"(2) numbers: integers within signed 64 bits, no NaN or Infinity; (3) value nested at most "
        f"{MAX_VALUE_DEPTH} levels, the encoded record at most {MAX_EVENT_BYTES} bytes; (4) times: {_TIME}; "
        f"observed_at at most {skew:g} s after the record's broker timestamp; "
        "(5) between fields: memory.asserted needs content, and a key unless kind is episodic; memory.retracted "
        "needs a key or a target_version (an episode's has no key), memory.confirmed a key; target_version only on "
        "memory.retracted; deadletter.discarded needs dead_letter and reason; subject.erased takes no dead_letter "
        "and carries nothing about the subject but its id and a reason (no key, scope, content, value, entities, "
        "aliases, tags, source.ref or source.actor: an erasure is never sealed); "
        "an explicit source has "
        "confidence 1.0; valid_to after valid_from; (6) list items trimmed, not blank, at most 256 characters. "
        "An explicit null for a defaulted field means not given."
    )


def _example() -> dict[str, Any]:
    """One valid event, built through the contract (so it is valid by construction)."""
    event = MemoryEvent(
        event_id="8b0f4c1e9a7d4e2f9c3b5a6d7e8f9012",
        type=EventType.ASSERTED,
        tenant="demo",
        subject="project:P1",
        key="project.port",
        value=8080,
        content="Project P1's backend listens on port 8080",
        entities=["P1"],
        aliases=["backend port", "后端服务地址"],
        source=Source(type=SourceType.EXPLICIT, service="deploy-bot", ref="msg-17"),
        observed_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    wire = event.to_wire()
    for derived in ("valid_from", "confidence", "importance", "scope", "kind", "schema_version", "tags"):
        wire.pop(derived, None)  # defaults and values the contract derives: the example shows what a producer sends
    return wire


def _null_is_default(props: dict[str, Any]) -> set[str]:
    """The fields the schema types without null whose explicit null the contract reads as "not given": asked of the
    contract with the example event, not assumed."""
    example, accepted = _example(), set()
    for name, node in props.items():
        if {"type": "null"} in node.get("anyOf", []) or not {"type", "$ref", "anyOf"} & set(node):
            continue  # null allowed already (or any JSON value is)
        try:
            contract.from_dict({**example, name: None})
        except contract.InvalidEvent:
            continue
        accepted.add(name)
    return accepted


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """`node` that also accepts null (keeping its default and title outside the anyOf)."""
    keep = {k: node.pop(k) for k in ("default", "title", "description") if k in node}
    if "anyOf" in node:
        if {"type": "null"} not in node["anyOf"]:
            node["anyOf"].append({"type": "null"})
        return {**node, **keep}
    return {"anyOf": [node, {"type": "null"}], **keep}


def event_schema() -> dict[str, Any]:
    """The JSON Schema of MemoryEvent as producers in other languages use it (deterministic: no clock, no env)."""
    generated = copy.deepcopy(MemoryEvent.model_json_schema())
    notes = _field_notes()
    props: dict[str, Any] = generated["properties"]
    unknown = set(notes) ^ set(props)
    if unknown:  # a field added to or removed from the contract must be described here: fail the generation
        raise RuntimeError(f"producers/event_schema.py: field notes out of step with MemoryEvent: {sorted(unknown)}")
    # the model mints an id for the SDK and the HTTP door; a record on the ledger must carry its own (contract.decode)
    nullable = _null_is_default(props) - {"event_id"}
    generated["required"] = [
        *generated.get("required", []),
        *(["event_id"] if "event_id" not in generated.get("required", []) else []),
    ]
    for name, node in props.items():
        if name in _TIMES:
            for branch in node.get("anyOf", [node]):
                if branch.get("type") == "string":
                    branch["pattern"] = _TIME_PATTERN
        if name == "schema_version":  # older versions are upcast, a newer one is refused (contract.upcast)
            node |= {"minimum": min(UPCASTERS, default=CURRENT_SCHEMA_VERSION), "maximum": CURRENT_SCHEMA_VERSION}
        if name in nullable:
            node = props[name] = _nullable(node)
        node["description"] = notes[name]
    return {
        "$schema": DRAFT,
        "$id": SCHEMA_ID,
        "title": f"memory-ledger event (schema_version {CURRENT_SCHEMA_VERSION})",
        "description": _description(),
        **{k: v for k, v in generated.items() if k not in ("title", "description")},
        "examples": [_example()],
    }


def render(schema: dict[str, Any] | None = None) -> str:
    """The checked-in spelling: 2-space indent, UTF-8 as is, a final newline."""
    return json.dumps(event_schema() if schema is None else schema, indent=2, ensure_ascii=False) + "\n"


def checked_in() -> bytes:
    """The checked-in file's bytes (what GET /v1/schema/event serves)."""
    return SCHEMA_FILE.read_bytes()
