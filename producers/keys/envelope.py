"""The sealed envelope: an event whose personal fields travel encrypted with its subject's data key.

Personal (`PERSONAL`, `PERSONAL_SOURCE`) is what an event says about its subject and who reported it; what routing,
ordering and idempotency need stays clear. An erasure is never sealed: it must stay readable after its key is gone.
The clear fields and the key id are the AES-256-GCM associated data, so changing a clear field or moving the
ciphertext to another record fails authentication. Pure functions, no I/O. docs/encryption.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from producers.contract import MAX_EVENT_BYTES, EventType, InvalidEvent, MemoryEvent, read_json

__all__ = [
    "ALG",
    "MAX_SEALED_BYTES",
    "PERSONAL",
    "PERSONAL_SOURCE",
    "DataKey",
    "Envelope",
    "encode_sealed",
    "fingerprint_of",
    "has_personal",
    "open_envelope",
    "parse_envelope",
    "seal",
    "sealable",
]

PERSONAL = ("content", "value", "entities", "aliases", "tags", "reason")
PERSONAL_SOURCE = ("ref", "actor")
SEALED = "sealed"
ALG = "A256GCM"
VERSION = 1
_NONCE = 12
_ENVELOPE_FIELDS = frozenset({"v", "alg", "kid", "nonce", "ct"})
_AAD_PREFIX = b"memory-ledger sealed event v1\n"
# base64 grows the personal part by 4/3; the opened event is held to MAX_EVENT_BYTES as a clear one is
MAX_SEALED_BYTES = MAX_EVENT_BYTES * 4 // 3 + 8192


@dataclass(frozen=True)
class DataKey:
    """One subject's data key: `key_id` goes on every record it seals; `key` never leaves the process in clear."""

    key_id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class Envelope:
    """A sealed record as read: its clear fields, the key id, the nonce and the ciphertext (not opened yet)."""

    clear: dict[str, Any]
    key_id: str
    nonce: bytes
    ciphertext: bytes

    @property
    def tenant(self) -> Any:
        return self.clear.get("tenant")

    @property
    def subject(self) -> Any:
        return self.clear.get("subject")


def fingerprint_of(key: bytes) -> str:
    """A data key's public name in an erasure record: sha256 over a label and the key (reveals nothing of it)."""
    return hashlib.sha256(b"memory-ledger data key fingerprint\n" + key).hexdigest()[:32]


def sealable(event: MemoryEvent) -> bool:
    """Every event but an erasure (which must stay readable once its key is destroyed)."""
    return event.type is not EventType.ERASED


def has_personal(data: dict[str, Any]) -> bool:
    """Whether a clear record carries any personal field (what `encryption=required` refuses)."""
    if any(data.get(k) not in (None, [], "") for k in PERSONAL):
        return True
    source = data.get("source")
    return isinstance(source, dict) and any(source.get(k) is not None for k in PERSONAL_SOURCE)


def _aad(clear: dict[str, Any], key_id: str) -> bytes:
    return _AAD_PREFIX + orjson.dumps(clear, option=orjson.OPT_SORT_KEYS) + b"\n" + key_id.encode()


def seal(wire: dict[str, Any], key: DataKey) -> dict[str, Any]:
    """The sealed record of a wire dict (`MemoryEvent.to_wire()`): personal fields encrypted, the rest clear."""
    clear = {k: v for k, v in wire.items() if k not in PERSONAL and k != SEALED}
    secret = {k: wire[k] for k in PERSONAL if k in wire}
    source = wire.get("source")
    if isinstance(source, dict):
        clear["source"] = {k: v for k, v in source.items() if k not in PERSONAL_SOURCE}
        hidden = {k: source[k] for k in PERSONAL_SOURCE if k in source}
        if hidden:
            secret["source"] = hidden
    nonce = os.urandom(_NONCE)
    ciphertext = AESGCM(key.key).encrypt(nonce, orjson.dumps(secret), _aad(clear, key.key_id))
    envelope = {
        "v": VERSION,
        "alg": ALG,
        "kid": key.key_id,
        "nonce": base64.b64encode(nonce).decode(),
        "ct": base64.b64encode(ciphertext).decode(),
    }
    return {**clear, SEALED: envelope}


def encode_sealed(event: MemoryEvent, key: DataKey, *, clear: bytes | None = None) -> bytes:
    """The record value of `event` sealed with `key`; InvalidEvent('too_large') past what the worker reads.

    `clear`: the event's clear record (`contract.encode(event)`) when the caller has it already: parsing it back is
    cheaper than a second `to_wire()` (the SDK encodes every event clear first, for the contract's size check).
    """
    wire = orjson.loads(clear) if clear is not None else event.to_wire()
    raw = orjson.dumps(seal(wire, key))
    if len(raw) > MAX_SEALED_BYTES:
        raise InvalidEvent("too_large", f"the sealed event encodes to {len(raw)} bytes, more than {MAX_SEALED_BYTES}")
    return bytes(memoryview(raw))  # a copy of its own size, as contract's records: a batch holds them until its acks


def _bad(message: str, field_name: str = SEALED) -> InvalidEvent:
    return InvalidEvent("bad_envelope", message, field_name)


def _b64(value: Any, name: str) -> bytes:
    if not isinstance(value, str):
        raise _bad(f"{name} must be a base64 string", f"{SEALED}.{name}")
    try:  # strict: only the base64 alphabet with correct padding (as b64decode(validate=True), several times faster)
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{name} is not valid base64", f"{SEALED}.{name}") from None


def parse_envelope(data: Any) -> Envelope | None:
    """The envelope of a decoded record, None for a clear record; InvalidEvent('bad_envelope') if malformed."""
    if not isinstance(data, dict) or SEALED not in data:
        return None
    sealed = data[SEALED]
    if not isinstance(sealed, dict):
        raise _bad("must be an object")
    unknown = sorted(sealed.keys() - _ENVELOPE_FIELDS, key=str)
    if unknown:
        raise _bad(f"unknown fields {unknown}", f"{SEALED}.{unknown[0]}")
    version = sealed.get("v")
    if type(version) is not int or version != VERSION:  # True == 1 in Python: not a version
        raise _bad(f"unsupported envelope version v={version!r} (this reader: v{VERSION})", f"{SEALED}.v")
    if sealed.get("alg") != ALG:
        raise _bad(f"unsupported algorithm alg={sealed.get('alg')!r} (this reader: {ALG})", f"{SEALED}.alg")
    kid = sealed.get("kid")
    if not isinstance(kid, str) or not 1 <= len(kid) <= 64:
        raise _bad("kid must be a key id of 1-64 characters", f"{SEALED}.kid")
    nonce = _b64(sealed.get("nonce"), "nonce")
    if len(nonce) != _NONCE:
        raise _bad(f"nonce must be {_NONCE} bytes", f"{SEALED}.nonce")
    ciphertext = _b64(sealed.get("ct"), "ct")
    clear = dict(data)
    del clear[SEALED]
    if clear.get("type") == "subject.erased":  # what destroys the key must stay readable once it is gone
        raise _bad(
            "an erasure is never sealed: it carries no personal field, and must outlive its subject's key", "type"
        )
    if not clear.keys().isdisjoint(PERSONAL):
        raise _bad(f"a sealed record carries personal fields in clear: {[k for k in PERSONAL if k in clear]}")
    source = clear.get("source")
    if isinstance(source, dict) and any(k in source for k in PERSONAL_SOURCE):
        raise _bad("a sealed record carries source.ref or source.actor in clear")
    return Envelope(clear, kid, nonce, ciphertext)


def open_envelope(envelope: Envelope, key: bytes) -> dict[str, Any]:
    """The record's wire dict with its personal fields back; InvalidEvent('bad_ciphertext') if it does not open."""
    try:
        plain = AESGCM(key).decrypt(envelope.nonce, envelope.ciphertext, _aad(envelope.clear, envelope.key_id))
    except InvalidTag:
        raise InvalidEvent(
            "bad_ciphertext", "the sealed fields do not open with their data key (tampered or mis-keyed)", SEALED
        ) from None
    try:
        secret = read_json(plain)  # as a clear record is read: what only the standard parser reads is judged by name
    except RecursionError:
        message = "the sealed fields are nested deeper than the JSON parser reads"
        raise InvalidEvent("too_deep", message, f"{SEALED}.ct") from None
    except ValueError as exc:  # what a clear record that is not JSON gets
        raise InvalidEvent("bad_json", f"the sealed fields are not valid JSON: {exc}", f"{SEALED}.ct") from None
    # only personal fields may come out of the ciphertext: the clear ones (tenant, subject, ids) are what the key's
    # owner check, routing and idempotency read, and a key holder must not override them from inside
    hidden = secret.pop("source", None) if isinstance(secret, dict) else None
    foreign = sorted(set(secret) - set(PERSONAL), key=str) if isinstance(secret, dict) else None
    if foreign is None or foreign or not isinstance(hidden, dict | None) or set(hidden or ()) - set(PERSONAL_SOURCE):
        raise _bad("the sealed fields must be an object of personal fields only", f"{SEALED}.ct")
    wire = dict(envelope.clear)
    wire.update(secret)
    if hidden:
        source = wire.get("source") or {}
        if not isinstance(source, dict):
            raise _bad("source must be an object", "source")
        wire["source"] = {**source, **hidden}
    return wire
