"""The sealed envelope (producers/keys/envelope.py) and its readers (producers/records.py) as pure functions.

Classes of defects, each over every member of its class: every personal field of every sealable event type is
absent from the sealed bytes and comes back exactly; every clear field, the key id, the nonce and the ciphertext,
each altered, make opening fail (never an event); every malformed envelope is `bad_envelope` naming its field; a
sealed and a clear record of the same event are judged alike by `decode_record` + `open_record` (broker-time
default, clock skew, the contract's refusals, the size limit), and the producer's limits agree with the worker's.
"""

from __future__ import annotations

import base64
import copy
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from producers.contract import (
    MAX_CONTENT_CHARS,
    MAX_EVENT_BYTES,
    EventType,
    InvalidEvent,
    Kind,
    MemoryEvent,
    encode,
    from_dict,
)
from producers.keys import envelope as env
from producers.keys.envelope import (
    MAX_SEALED_BYTES,
    PERSONAL,
    PERSONAL_SOURCE,
    DataKey,
    encode_sealed,
    has_personal,
    open_envelope,
    parse_envelope,
    seal,
    sealable,
)
from producers.keys.store import KeyState, subject_digest
from producers.records import Incoming, decode_record, open_record
from tests.support.events import changed, with_value_at

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, tzinfo=UTC)
TS_MS = int((T0 + timedelta(hours=1)).timestamp() * 1000)  # the broker time of every record here
KEY = DataKey("kid-1", bytes(range(32)))
FIELDS = (*PERSONAL, *(f"source.{f}" for f in PERSONAL_SOURCE))


def _markers() -> dict[str, str]:
    return {f: f"MARK{f.replace('.', '').upper()}{os.urandom(5).hex()}" for f in FIELDS}


def _personal(m: dict[str, str]) -> dict[str, Any]:
    """Every personal field set, each carrying its own marker."""
    return {
        "content": f"the content {m['content']} in a sentence",
        "value": {"nested": [m["value"], 1, 2.5, None, True]},
        "entities": [m["entities"], "E2"],
        "aliases": [m["aliases"]],
        "tags": [m["tags"], "t2"],
        "reason": f"because {m['reason']}",
        "source": {"type": "explicit", "service": "crm", "ref": m["source.ref"], "actor": m["source.actor"]},
    }


def _event(kind: str, m: dict[str, str]) -> MemoryEvent:
    common = {
        "tenant": "acme",
        "subject": "user:42",
        "scope": "work",
        "importance": 0.7,
        "observed_at": T0,
        "valid_from": T0 - timedelta(days=1),
        "valid_to": T0 + timedelta(days=30),
        **_personal(m),
    }
    if kind == "asserted-state":
        return MemoryEvent(type=EventType.ASSERTED, key="profile.seat", **common)
    if kind == "asserted-episodic":
        common.pop("scope")
        return MemoryEvent(type=EventType.ASSERTED, kind=Kind.EPISODIC, **common)
    if kind == "retracted":
        return MemoryEvent(type=EventType.RETRACTED, key="profile.seat", target_version="v" * 32, **common)
    assert kind == "confirmed"
    return MemoryEvent(type=EventType.CONFIRMED, key="profile.seat", **common)


KINDS = ("asserted-state", "asserted-episodic", "retracted", "confirmed")


def _record(raw: bytes, *, ts_ms: int | None = TS_MS, skew: timedelta | None = None) -> Incoming:
    return decode_record("t", 0, 7, raw, key=b"acme|user:42", timestamp_ms=ts_ms, max_future_skew=skew)


def _open(raw: bytes, key: bytes = KEY.key, **kw: Any) -> Incoming:
    """A record as the worker reads it: decoded, then opened with `key` if it is sealed."""
    rec = _record(raw, **kw)
    return open_record(rec, key) if rec.envelope is not None else rec


def _field(event_wire: dict[str, Any], name: str) -> Any:
    if name.startswith("source."):
        return event_wire["source"][name.split(".", 1)[1]]
    return event_wire[name]


# -- every personal field, every sealable type: hidden in the bytes, back exactly ------------------------------


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_personal_field_is_hidden_by_the_seal_and_comes_back_exactly(kind: str, name: str) -> None:
    m = _markers()
    event = _event(kind, m)
    assert sealable(event)
    clear = encode(event)
    assert m[name].encode() in clear  # the marker is really in the event
    raw = encode_sealed(event, KEY)
    assert m[name].encode() not in raw, f"{name} of {kind} is readable in the sealed record"
    assert not [v for v in m.values() if v.encode() in raw]
    assert parse_envelope(orjson.loads(raw)) is not None

    opened = _open(raw)
    assert opened.error is None and opened.event is not None, opened.error
    assert opened.key_id == KEY.key_id and opened.envelope is None
    assert opened.event == event
    assert opened.event.fingerprint == event.fingerprint
    assert _field(opened.event.to_wire(), name) == _field(event.to_wire(), name)
    assert m[name] in orjson.dumps(_field(opened.event.to_wire(), name)).decode()
    # and the envelope alone gives back the wire dict the producer sealed, key for key
    assert open_envelope(parse_envelope(orjson.loads(raw)), KEY.key) == event.to_wire()


@pytest.mark.parametrize("kind", KINDS)
def test_exactly_the_non_personal_fields_stay_clear(kind: str) -> None:
    event = _event(kind, _markers())
    sealed = orjson.loads(encode_sealed(event, KEY))
    wire = event.to_wire()
    assert set(sealed) == (set(wire) - set(PERSONAL)) | {"sealed"}
    assert sealed["source"] == {k: v for k, v in wire["source"].items() if k not in PERSONAL_SOURCE}
    for k in set(wire) - set(PERSONAL) - {"source"}:
        assert sealed[k] == wire[k], k
    assert not has_personal({k: v for k, v in sealed.items() if k != "sealed"})


def test_an_erasure_is_never_sealable() -> None:
    erasure = MemoryEvent(type=EventType.ERASED, tenant="acme", subject="user:42", reason="asked by the user")
    assert not sealable(erasure)
    assert all(sealable(_event(k, _markers())) for k in KINDS)
    # one sealed by hand (a raw producer) is no erasure: its key's destruction would leave it unreadable to a replay
    err = _refused(encode_sealed(erasure, KEY), "bad_envelope")
    assert err.field == "type", err


# -- any change to the sealed record: opening fails, never an event --------------------------------------------


def _paths(sealed: dict[str, Any]) -> list[str]:
    """Every clear field of a sealed record: top-level keys and the nested source.* keys."""
    out = []
    for k, v in sealed.items():
        if k == "sealed":
            continue
        if isinstance(v, dict):
            out += [f"{k}.{sub}" for sub in v]
        else:
            out.append(k)
    return sorted(out)


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    return with_value_at(data, path.split("."), value)


def _get(data: dict[str, Any], path: str) -> Any:
    for p in path.split("."):
        data = data[p]
    return data


def _refused(raw: bytes, code: str, key: bytes = KEY.key) -> InvalidEvent:
    rec = _record(raw)
    if rec.envelope is not None:
        rec = open_record(rec, key)
    assert rec.event is None and not rec.erased, f"an altered record opened: {rec.event}"
    assert rec.error is not None and rec.error.code == code, rec.error
    return rec.error


@pytest.mark.parametrize("kind", KINDS)
def test_every_clear_field_changed_fails_authentication(kind: str) -> None:
    sealed = orjson.loads(encode_sealed(_event(kind, _markers()), KEY))
    paths = _paths(sealed)
    # the brief's list is among them: routing, ordering and idempotency fields, the times, source.type/service
    must = {"event_id", "type", "tenant", "subject", "observed_at", "valid_from", "valid_to", "source.type"}
    must |= {"source.service", "importance", "confidence", "schema_version", "kind"}
    if kind != "asserted-episodic":
        must |= {"key", "scope"}
    assert must <= set(paths), must - set(paths)
    for path in paths:
        bad = _set(sealed, path, changed(_get(sealed, path)))
        _refused(orjson.dumps(bad), "bad_ciphertext")
        # and through the envelope alone
        with pytest.raises(InvalidEvent) as exc:
            open_envelope(parse_envelope(bad), KEY.key)
        assert exc.value.code == "bad_ciphertext", path
    for path in paths:  # a clear field removed
        bad = copy.deepcopy(sealed)
        *parents, last = path.split(".")
        node = bad
        for p in parents:
            node = node[p]
        del node[last]
        _refused(orjson.dumps(bad), "bad_ciphertext")
    for extra in ("target_version", "valid_to", "key"):  # a clear field added (or replaced)
        _refused(orjson.dumps({**sealed, extra: "zz" * 8}), "bad_ciphertext")
    _refused(orjson.dumps({**sealed, "source": {**sealed["source"], "service": None}}), "bad_ciphertext")


@pytest.mark.parametrize("kind", KINDS)
def test_the_kid_the_nonce_and_the_ciphertext_altered_fail_authentication(kind: str) -> None:
    sealed = orjson.loads(encode_sealed(_event(kind, _markers()), KEY))
    box = sealed["sealed"]
    nonce = base64.b64decode(box["nonce"])
    ct = base64.b64decode(box["ct"])
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731

    def flip(data: bytes, i: int) -> bytes:
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]

    variants = {
        "kid changed": {"kid": box["kid"] + "x"},
        "kid other": {"kid": "kid-2"},
        "nonce zero": {"nonce": b64(bytes(12))},
        "ct empty": {"ct": ""},
        "ct truncated": {"ct": b64(ct[:-1])},
        "ct tag only": {"ct": b64(ct[-16:])},
        "ct extended": {"ct": b64(ct + b"\x00")},
        "ct short": {"ct": b64(ct[:5])},
    }
    variants |= {f"nonce bit {i}": {"nonce": b64(flip(nonce, i))} for i in range(12)}
    variants |= {f"ct byte {i}": {"ct": b64(flip(ct, i))} for i in sorted({0, 1, len(ct) // 2, len(ct) - 17})}
    variants |= {f"tag byte {i}": {"ct": b64(flip(ct, len(ct) - 16 + i))} for i in range(16)}
    for name, change in variants.items():
        bad = {**sealed, "sealed": {**box, **change}}
        error = _refused(orjson.dumps(bad), "bad_ciphertext")
        assert error.field == "sealed", name


def test_a_ciphertext_moved_to_another_record_of_the_same_key_fails() -> None:
    one = orjson.loads(encode_sealed(_event("asserted-state", _markers()), KEY))
    two = orjson.loads(encode_sealed(_event("confirmed", _markers()), KEY))
    _refused(orjson.dumps({**two, "sealed": one["sealed"]}), "bad_ciphertext")
    # two seals of the same clear fields: one's ciphertext under the other's nonce fails
    a = orjson.loads(encode_sealed(_event("retracted", _markers()), KEY))
    b = seal({**a, "content": "other"}, KEY)
    assert {k: v for k, v in b.items() if k != "sealed"} == {k: v for k, v in a.items() if k != "sealed"}
    _refused(orjson.dumps({**a, "sealed": {**a["sealed"], "ct": b["sealed"]["ct"]}}), "bad_ciphertext")


def test_a_wrong_key_fails_and_the_right_key_still_opens() -> None:
    raw = encode_sealed(_event("asserted-state", _markers()), KEY)
    for wrong in (os.urandom(32), KEY.key[:-1] + b"\x00", bytes(32)):
        _refused(raw, "bad_ciphertext", key=wrong)
    same_id_other_key = DataKey(KEY.key_id, os.urandom(32))
    _refused(encode_sealed(_event("confirmed", _markers()), same_id_other_key), "bad_ciphertext")
    assert _open(raw).event is not None


def test_a_record_of_an_unknown_key_or_of_another_owner_destroyed_or_not_is_never_an_event() -> None:
    raw = encode_sealed(_event("asserted-state", _markers()), KEY)
    unknown = open_record(_record(raw), None)
    assert unknown.event is None and unknown.error.code == "unknown_key" and unknown.error.field == "sealed.kid"
    digest_key = os.urandom(32)  # the tenant's subject digest key (producers.keys.store.SubjectDigests)
    others = [("acme", "0" * 64), ("acme", subject_digest(digest_key, "acme", "user:43"))]
    others.append(("globex", subject_digest(digest_key, "globex", "user:42")))
    for tenant, digest in others:
        owner = KeyState(KEY.key_id, tenant, digest, KEY.key, digest_key)
        other = open_record(_record(raw), KEY.key, owner=owner.owns)
        assert other.event is None and other.error.code == "key_mismatch", (tenant, digest)
        # and once the key is destroyed: its clear fields never pass for the erased past of another subject
        shredded = open_record(_record(raw), None, destroyed=True, owner=owner.owns)
        assert not shredded.erased and shredded.error.code == "key_mismatch", (tenant, digest)
    mine = KeyState(KEY.key_id, "acme", subject_digest(digest_key, "acme", "user:42"), KEY.key, digest_key)
    assert open_record(_record(raw), KEY.key, owner=mine.owns).event is not None
    for owner in (mine.owns, None):
        gone = open_record(_record(raw), None, destroyed=True, owner=owner)
        assert gone.erased and gone.event is None and gone.error is None


def test_ten_thousand_seals_of_one_event_never_repeat_a_nonce() -> None:
    wire = _event("asserted-state", _markers()).to_wire()
    nonces, cts = set(), set()
    for _ in range(10_000):
        box = seal(wire, KEY)["sealed"]
        nonces.add(box["nonce"])
        cts.add(box["ct"])
    assert len(nonces) == 10_000 and len(cts) == 10_000


# -- malformed envelopes: bad_envelope naming the field ---------------------------------------------------------


def _good() -> dict[str, Any]:
    return orjson.loads(encode_sealed(_event("asserted-state", _markers()), KEY))


MALFORMED = [
    ("not an object: list", lambda b: [b], "sealed"),
    ("not an object: string", lambda b: "sealed", "sealed"),
    ("not an object: null", lambda b: None, "sealed"),
    ("not an object: number", lambda b: 1, "sealed"),
    ("unknown field", lambda b: {**b, "extra": 1}, "sealed.extra"),
    ("v=2", lambda b: {**b, "v": 2}, "sealed.v"),
    ("v missing", lambda b: {k: v for k, v in b.items() if k != "v"}, "sealed.v"),
    ("v as a string", lambda b: {**b, "v": "1"}, "sealed.v"),
    ("v true", lambda b: {**b, "v": True}, "sealed.v"),
    ("alg other", lambda b: {**b, "alg": "A128GCM"}, "sealed.alg"),
    ("alg missing", lambda b: {k: v for k, v in b.items() if k != "alg"}, "sealed.alg"),
    ("kid too long", lambda b: {**b, "kid": "k" * 65}, "sealed.kid"),
    ("kid empty", lambda b: {**b, "kid": ""}, "sealed.kid"),
    ("kid missing", lambda b: {k: v for k, v in b.items() if k != "kid"}, "sealed.kid"),
    ("kid a number", lambda b: {**b, "kid": 7}, "sealed.kid"),
    ("nonce 11 bytes", lambda b: {**b, "nonce": base64.b64encode(bytes(11)).decode()}, "sealed.nonce"),
    ("nonce 13 bytes", lambda b: {**b, "nonce": base64.b64encode(bytes(13)).decode()}, "sealed.nonce"),
    ("nonce empty", lambda b: {**b, "nonce": ""}, "sealed.nonce"),
    ("nonce not base64", lambda b: {**b, "nonce": "!!!!not-base64!!"}, "sealed.nonce"),
    ("nonce unpadded", lambda b: {**b, "nonce": b["nonce"].rstrip("=")[:-1]}, "sealed.nonce"),
    ("nonce non-ascii", lambda b: {**b, "nonce": "ééééééééééééééé="}, "sealed.nonce"),
    ("nonce a number", lambda b: {**b, "nonce": 12}, "sealed.nonce"),
    ("nonce missing", lambda b: {k: v for k, v in b.items() if k != "nonce"}, "sealed.nonce"),
    ("ct not base64", lambda b: {**b, "ct": "*" + b["ct"][1:]}, "sealed.ct"),
    ("ct with whitespace", lambda b: {**b, "ct": b["ct"][:4] + "\n" + b["ct"][4:]}, "sealed.ct"),
    ("ct a list", lambda b: {**b, "ct": [b["ct"]]}, "sealed.ct"),
    ("ct missing", lambda b: {k: v for k, v in b.items() if k != "ct"}, "sealed.ct"),
]


@pytest.mark.parametrize(("name", "change", "field"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_envelope_is_bad_envelope_naming_its_field(name: str, change: Any, field: str) -> None:
    good = _good()
    bad = {**good, "sealed": change(good["sealed"])}
    with pytest.raises(InvalidEvent) as exc:
        parse_envelope(bad)
    assert exc.value.code == "bad_envelope" and exc.value.field == field, exc.value
    rec = _record(orjson.dumps(bad))
    assert rec.event is None and rec.envelope is None
    assert rec.error.code == "bad_envelope" and rec.error.field == field


@pytest.mark.parametrize("name", FIELDS)
def test_a_sealed_record_carrying_a_personal_field_in_clear_is_bad_envelope(name: str) -> None:
    good = _good()
    for value in ("MARK in clear", None, [], ""):
        bad = _set(good, name, value) if name.startswith("source.") else {**good, name: value}
        with pytest.raises(InvalidEvent) as exc:
            parse_envelope(bad)
        assert exc.value.code == "bad_envelope", (name, value)
        rec = _record(orjson.dumps(bad))
        assert rec.event is None and rec.error.code == "bad_envelope", (name, value)


def _craft(clear: dict[str, Any], plaintext: bytes, key: DataKey = KEY) -> bytes:
    """A record sealed by a hostile producer that holds the data key: any plaintext under a valid tag."""
    nonce = os.urandom(12)
    ct = AESGCM(key.key).encrypt(nonce, plaintext, env._aad(clear, key.key_id))
    box = {"v": 1, "alg": "A256GCM", "kid": key.key_id, "nonce": base64.b64encode(nonce).decode()}
    return orjson.dumps({**clear, "sealed": {**box, "ct": base64.b64encode(ct).decode()}})


def _clear_part(event: MemoryEvent) -> dict[str, Any]:
    return {k: v for k, v in orjson.loads(encode_sealed(event, KEY)).items() if k != "sealed"}


@pytest.mark.parametrize(
    ("name", "plaintext"),
    [
        ("not json", b"not json at all"),
        ("a list", b"[1, 2]"),
        ("a string", b'"content"'),
        ("null", b"null"),
        ("source not an object", b'{"content": "c", "source": "ref"}'),
        ("overrides the tenant", b'{"content": "c", "tenant": "globex"}'),
        ("overrides the subject", b'{"content": "c", "subject": "user:other"}'),
        ("overrides the key", b'{"content": "c", "key": "other.key"}'),
        ("overrides the event_id", b'{"content": "c", "event_id": "another-id"}'),
        ("overrides source.type", b'{"content": "c", "source": {"type": "inferred"}}'),
        ("an unknown field", b'{"content": "c", "sealed": {}}'),
    ],
)
def test_the_sealed_part_may_only_carry_personal_fields(name: str, plaintext: bytes) -> None:
    """The clear fields are what the key's owner check, routing and idempotency read: the ciphertext (whoever holds
    the key wrote it) must not replace them, or a record could be applied to another subject than its key's."""
    clear = _clear_part(_event("asserted-state", _markers()))
    rec = open_record(_record(_craft(clear, plaintext)), KEY.key, owner=None)
    assert rec.event is None, f"{name}: opened as {rec.event}"
    assert rec.error is not None and rec.error.code in ("bad_envelope", "bad_json"), rec.error
    assert rec.error.code != "undecodable"


# -- hostile text: round-trips, or is refused as the clear path refuses it -------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "emoji 🧠🔐👩‍👩‍👧‍👦 and flags 🇫🇷",
        "right-to-left \u202e override and zero\u200bwidth",
        'quotes " and backslashes \\ and \n newlines \t tabs \x01 controls \x7f',
        "lone low surrogate escaped in JSON text: \\udc00 (as text, not a code point)",
        "x" * MAX_CONTENT_CHARS,
        "🧠" * MAX_CONTENT_CHARS,
    ],
    ids=["emoji", "bidi", "escapes", "escaped-text", "16k-ascii", "16k-emoji"],
)
def test_hostile_text_round_trips_in_every_personal_field(text: str) -> None:
    short = text[:256].strip() or "x"
    event = MemoryEvent(
        type=EventType.ASSERTED,
        tenant="acme",
        subject="user:42",
        key="k",
        content=text,
        value={text[:1000]: text},
        entities=[short],
        aliases=[short],
        tags=[short],
        reason=text[:1024],
        source={"type": "imported", "ref": text[:1024], "actor": short},
        observed_at=T0,
    )
    opened = _open(encode_sealed(event, KEY))
    assert opened.error is None and opened.event == event
    assert opened.event.content == text and opened.event.value == {text[:1000]: text}


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("NUL in content", {"content": "a\x00b"}),
        ("NUL in a value", {"value": {"k": ["a\x00b"]}}),
        ("NUL in a value's key", {"value": {"a\x00b": 1}}),
        ("NUL in a tag", {"tags": ["a\x00b"]}),
        ("NUL in source.ref", {"source": {"type": "explicit", "ref": "a\x00b"}}),
        ("content too long", {"content": "x" * (MAX_CONTENT_CHARS + 1)}),
        ("content blank", {"content": "   "}),
        ("empty tag", {"tags": ["ok", " "]}),
        ("65 entities", {"entities": [f"e{i}" for i in range(65)]}),
        ("source.ref too long", {"source": {"type": "explicit", "ref": "r" * 1025}}),
        ("reason too long", {"reason": "r" * 1025}),
        ("a huge integer", {"value": 2**64}),
        ("content not a string", {"content": 7}),
    ],
)
def test_a_contract_refusal_is_the_same_for_a_sealed_record_as_for_a_clear_one(name: str, change: dict) -> None:
    """The contract refuses NUL before sealing (MemoryEvent): a producer that seals anyway gets the clear verdict."""
    wire = {**_event("asserted-state", _markers()).to_wire(), **change}
    with pytest.raises(InvalidEvent):
        from_dict(wire)  # refused at the door: the SDK never seals it
    try:
        sealed = orjson.dumps(seal(wire, KEY))
    except orjson.JSONEncodeError:
        assert name == "a huge integer"  # orjson cannot write it: no producer sends it sealed, nor clear
        return
    clear = _open(orjson.dumps(wire))
    opened = _open(sealed)
    assert clear.event is None and opened.event is None, name
    assert (opened.error.code, opened.error.field) == (clear.error.code, clear.error.field), name


def test_a_lone_surrogate_is_refused_before_sealing_and_when_hand_sealed_as_in_clear() -> None:
    with pytest.raises(InvalidEvent) as exc:
        from_dict({"type": "memory.asserted", "tenant": "acme", "subject": "s", "key": "k", "content": "a\ud800b"})
    assert exc.value.code == "unstorable_text"
    clear_part = _clear_part(_event("asserted-state", _markers()))
    raw_clear = orjson.dumps(clear_part)[:-1] + b',"content":"a\\ud800b"}'
    clear = _open(raw_clear)
    sealed = open_record(_record(_craft(clear_part, b'{"content":"a\\ud800b"}')), KEY.key)
    assert clear.event is None and sealed.event is None
    assert clear.error.code == "unstorable_text"  # JSON (an escape of one), judged by what it holds
    assert sealed.error.code == clear.error.code, sealed.error


# -- size: what the producer accepts the worker reads, and the sealed limit matches the clear one --------------


def _sized(target: int, filler: str, *, content: str) -> MemoryEvent:
    """An event whose clear encoding is exactly `target` bytes (or one less when a filler char is wide)."""

    def build(n: int) -> MemoryEvent:
        return MemoryEvent(
            type=EventType.ASSERTED,
            tenant="acme",
            subject="user:42",
            key="k",
            content=content,
            value={"blob": filler * n},
            tags=["t"],
            source={"type": "explicit", "ref": "r", "actor": "a"},
            observed_at=T0,
        )

    unit = len(orjson.dumps(filler)) - 2
    base = len(orjson.dumps(build(0).to_wire()))
    n = (target - base) // unit
    event = build(n)
    assert target - unit < len(orjson.dumps(event.to_wire())) <= target
    return event


FILLERS = ["a", "é", "🧠", "\x01", '"', "\\"]


@pytest.mark.parametrize("filler", FILLERS, ids=["ascii", "latin", "emoji", "control", "quote", "backslash"])
@pytest.mark.parametrize("content", ["short", "🧠" * MAX_CONTENT_CHARS, "\x02" * MAX_CONTENT_CHARS])
def test_a_maximal_event_seals_within_the_limit_and_the_worker_opens_it(filler: str, content: str) -> None:
    event = _sized(MAX_EVENT_BYTES, filler, content=content)
    assert len(encode(event)) <= MAX_EVENT_BYTES  # the SDK's clear check passes...
    raw = encode_sealed(event, KEY)  # ...so must the sealed one
    assert len(raw) <= MAX_SEALED_BYTES
    opened = _open(raw)
    assert opened.error is None and opened.event == event  # and the worker reads it


@pytest.mark.parametrize("filler", FILLERS, ids=["ascii", "latin", "emoji", "control", "quote", "backslash"])
def test_an_event_over_the_limit_is_refused_too_large_sealed_or_clear(filler: str) -> None:
    event = _sized(MAX_EVENT_BYTES + 64, filler, content="🧠" * MAX_CONTENT_CHARS)
    wire_len = len(orjson.dumps(event.to_wire()))
    assert wire_len > MAX_EVENT_BYTES
    with pytest.raises(InvalidEvent) as exc:
        encode(event)  # the SDK refuses it before sealing
    assert exc.value.code == "too_large"
    clear = _open(orjson.dumps(event.to_wire()))
    assert clear.event is None and clear.error.code == "too_large"
    # a producer that seals it anyway: the worker must refuse it the same way, not accept what clear is refused
    sealed = orjson.dumps(seal(event.to_wire(), KEY))
    assert len(sealed) <= MAX_SEALED_BYTES  # small enough to pass the worker's first (raw size) check
    opened = _open(sealed)
    assert opened.event is None, "the worker accepted a sealed event the clear path refuses as too large"
    assert opened.error.code == "too_large"


def test_a_sealed_record_over_the_sealed_limit_is_too_large_before_anything_is_opened() -> None:
    event = _sized(MAX_EVENT_BYTES * 2, "a", content="c")
    sealed = orjson.dumps(seal(event.to_wire(), KEY))
    assert len(sealed) > MAX_SEALED_BYTES
    rec = _record(sealed)
    assert rec.envelope is None and rec.error.code == "too_large"
    with pytest.raises(InvalidEvent) as exc:
        encode_sealed(event, KEY)
    assert exc.value.code == "too_large"


# -- decode_record + open_record: a sealed and a clear record of one event are judged alike ---------------------


def _pair(wire: dict[str, Any], **kw: Any) -> tuple[Incoming, Incoming]:
    return _open(orjson.dumps(wire), **kw), _open(orjson.dumps(seal(wire, KEY)), **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_observed_at_defaults_to_the_broker_time_for_both(kind: str) -> None:
    wire = _event(kind, _markers()).to_wire()
    del wire["observed_at"], wire["valid_from"]
    clear, sealed = _pair(wire)
    assert clear.event is not None and sealed.event is not None
    assert clear.event == sealed.event
    assert sealed.event.observed_at == datetime.fromtimestamp(TS_MS / 1000, UTC) == sealed.event.valid_from
    assert clear.event.fingerprint == sealed.event.fingerprint


@pytest.mark.parametrize(
    ("ahead", "verdict"), [(timedelta(seconds=30), None), (timedelta(minutes=10), "clock_skew")], ids=["in", "out"]
)
@pytest.mark.parametrize("kind", KINDS)
def test_the_clock_skew_verdict_is_the_same_for_both(kind: str, ahead: timedelta, verdict: str | None) -> None:
    wire = _event(kind, _markers()).to_wire()
    broker = datetime.fromtimestamp(TS_MS / 1000, UTC)
    wire["observed_at"] = (broker + ahead).isoformat().replace("+00:00", "Z")
    wire.pop("valid_from")
    wire.pop("valid_to")
    clear, sealed = _pair(wire, skew=timedelta(minutes=5))
    if verdict is None:
        assert clear.error is None and sealed.error is None, (clear.error, sealed.error)
        assert clear.event == sealed.event
    else:
        assert clear.event is None and sealed.event is None
        assert (
            (sealed.error.code, sealed.error.field) == (clear.error.code, clear.error.field) == (verdict, "observed_at")
        )
    # without a skew window both accept it
    clear, sealed = _pair(wire)
    assert clear.event is not None and clear.event == sealed.event


def test_without_a_broker_time_both_take_the_contract_default() -> None:
    wire = _event("confirmed", _markers()).to_wire()
    del wire["observed_at"], wire["valid_from"], wire["valid_to"]
    clear, sealed = _pair(wire, ts_ms=None)
    assert clear.event is not None and sealed.event is not None
    assert clear.event.model_copy(update={"observed_at": T0, "valid_from": T0}) == sealed.event.model_copy(
        update={"observed_at": T0, "valid_from": T0}
    )
