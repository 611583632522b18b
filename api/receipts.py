"""Receipts: every answer of recall, context, facts, history and the audit replay says what it reflects, signed.

A receipt cites ids and digests only; the digests of content and subjects are HMACs under the schema's erasure
salt, because a plain hash of a value or a subject id can be found by guessing. `verify` checks a receipt's
signature and cited events; `replay` re-derives its answer. docs/INTERNALS.md, "Receipts".
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import rfc8785
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from api import reads
from api.deps import check_tenant
from api.errors import ApiError, validation_items
from api.requests import (
    ANSWER_MAX_DEPTH,
    ContextBody,
    EventsParams,
    FactsPage,
    FactsParams,
    HistoryPage,
    HistoryParams,
    RecallBody,
    ReceiptBody,
    ReplayBody,
    within_depth,
)
from api.resources import Resources
from producers.consistency import decode_token, encode_token
from producers.contract import parse_rfc3339, rfc3339, version_id_for
from producers.keys.signing import ChainSigner, SigningKeyError, load_signer, parse_public_key, signature_valid
from producers.settings import EmbeddingSettings, RecallSettings, Settings
from projections import shapes
from projections.postgres import receipts as rows

__all__ = [
    "NotCanonical",
    "answer_digest",
    "basis",
    "canonical",
    "issue",
    "names_once",
    "repeated_name",
    "replay",
    "request_fields",
    "verify",
]

log = logging.getLogger(__name__)

Answer = Literal["recall", "context", "facts", "history", "events"]
_SIGNED = b"memory-ledger receipt v1\n"  # what the signature covers: this tag, then the receipt without `signature`
_EVENT, _SUBJECT, _REQUEST = b"receipt event v1\n", b"receipt subject v1\n", b"receipt request v1\n"
_VOLATILE = ("receipt", "consistency", "trace")  # left out of the answer's digest: timings and waits, the receipt
# the parameters that define each answer (a replay takes them again); `after` and `tenant` are not among them
_REQUESTS: dict[str, type[BaseModel]] = {
    "recall": RecallBody,
    "context": ContextBody,
    "facts": FactsParams,
    "history": HistoryParams,
    "events": EventsParams,
}
# the MCP door's models of the same reads, where its defaults differ (a page of MCP_DEFAULT_LIMIT): a request that
# leaves a default out is the receipt's if it is with either door's
_MCP_REQUESTS: dict[str, type[BaseModel]] = {"facts": FactsPage, "history": HistoryPage}


class _NotPlain(Exception):
    """A value orjson would not write as RFC 8785 does."""


_EXACT = 2.0**53  # below it every whole float is an integer JavaScript writes without a fraction or an exponent


def _plain(value: Any) -> Any:
    """`value` with its whole floats as integers (RFC 8785 writes 1.0 as 1, as JavaScript does); _NotPlain where
    orjson's bytes would still differ from RFC 8785's: a float below 1e-5 or from 2**53 (exponent rules differ), a
    key with a character from U+D800 on (RFC 8785 sorts keys by UTF-16 code units, orjson by code points)."""
    kind = type(value)
    if kind is float:
        if value.is_integer() and abs(value) < _EXACT:
            return int(value)
        if not 1e-5 <= abs(value) < _EXACT:
            raise _NotPlain
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or (not key.isascii() and max(key) >= "\ud800"):
                raise _NotPlain
            out[key] = item if type(item) in _LEAVES else _plain(item)  # most values: no call
        return out
    if kind is list or kind is tuple:
        return [item if type(item) in _LEAVES else _plain(item) for item in value]
    return value


_LEAVES = frozenset((str, int, bool, type(None)))  # what `_plain` gives back as it is


def _jcs(value: Any) -> bytes:
    """RFC 8785 written out: keys sorted by UTF-16 code units, floats as ECMAScript writes them (the rfc8785
    library's), strings and integers as orjson writes them (the same escapes; integers exact)."""
    kind = type(value)
    if kind is dict:
        items = sorted(value.items(), key=lambda item: item[0].encode("utf-16-be"))
        return b"{" + b",".join(orjson.dumps(k) + b":" + _jcs(v) for k, v in items) + b"}"
    if kind is list or kind is tuple:
        return b"[" + b",".join(_jcs(v) for v in value) + b"]"
    if kind is float:
        return rfc8785.dumps(value)
    return orjson.dumps(value)


class NotCanonical(ValueError):
    """A value no canonical JSON holds, so no answer or receipt of this service: a lone surrogate (RFC 8785 takes
    I-JSON, which has none; the standard parser reads the escape), an integer outside 64 bits, nesting past the
    serializer's limit."""


def canonical(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical JSON, what the digests and the signature are over, so a client in any language can
    rebuild the bytes from the JSON it received (a JavaScript client re-serializing `400.0` writes `400`). orjson writes
    those bytes once whole floats are integers (`_plain`); the rare rest is written out by `_jcs`. Integers past 2**53
    are written exactly (RFC 8785 has no digits for them: JavaScript cannot hold them); NotCanonical for what none
    holds (a client's JSON can)."""
    try:
        try:
            return orjson.dumps(_plain(value), option=orjson.OPT_SORT_KEYS)
        except _NotPlain:
            return _jcs(value)
    except (orjson.JSONEncodeError, rfc8785.CanonicalizationError, UnicodeEncodeError, RecursionError) as exc:
        raise NotCanonical(f"holds a value no canonical JSON has ({exc})") from None


def answer_digest(answer: Mapping[str, Any]) -> str:
    """sha256 (hex) of the answer's canonical JSON without its receipt, its consistency and recall's trace."""
    return hashlib.sha256(canonical({k: v for k, v in answer.items() if k not in _VOLATILE})).hexdigest()


def _sha(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def _sha_plain(value: Any) -> str:
    """_sha of a value `_plain` already made plain: orjson's bytes are its canonical JSON."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def answer_parts(answer: str, body: Mapping[str, Any], sha: Callable[[Any], str] = _sha) -> dict[str, str]:
    """sha256 (hex) of each part a replay compares: recall's cues, its exact hits, and the ids of its ranked hits in
    their order (their scores move with the index's statistics); the rows of the others."""
    if answer == "recall":
        hits = body["hits"]
        return {
            "cues": sha(body["cues"]),
            "exact": sha([_ledger_only(h) for h in hits if h["match"]["stage"] == "exact"]),
            "ranked": sha([h["version_id"] for h in hits if h["match"]["stage"] != "exact"]),
        }
    key = _ROWS[answer]
    return {key: sha(body[key])}


def _digest_and_parts(answer: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`answer_digest` and `answer_parts` of `body` with the answer made plain once (the walk is most of their cost,
    and the parts are pieces of the same answer)."""
    try:
        plain = _plain({k: v for k, v in body.items() if k not in _VOLATILE})
    except _NotPlain:
        return {"answer_digest": answer_digest(body), "parts": answer_parts(answer, body)}
    return {"answer_digest": _sha_plain(plain), "parts": answer_parts(answer, plain, _sha_plain)}


def _ledger_only(hit: Mapping[str, Any]) -> dict[str, Any]:
    """A hit as the ledger decides it, which a replay can give back: without its access score (how often it was
    served is not the ledger's; a recall as known at a time leaves it out), and verified as the version it is,
    whichever version the index proposed for it (`verified.replaced_by`: the index's times are kept to the
    millisecond, its documents follow the ledger a moment later)."""
    scores = {k: v for k, v in hit["match"]["scores"].items() if k != "access"}
    match = {**hit["match"], "scores": scores}
    if "verified" in match:
        match["verified"] = {"candidate": hit["version_id"]}
    return {**hit, "match": match}


_ROWS = {"facts": "facts", "history": "versions", "events": "events", "context": "lines"}


def _keyed(salt: bytes, tag: bytes, value: Any) -> str:
    return _keyed_bytes(salt, tag, canonical(value))


@functools.lru_cache(maxsize=64)
def _keyed_start(salt: bytes, tag: bytes) -> hmac.HMAC:
    """The HMAC under `salt` with `tag` taken in: each digest copies it (a third cheaper than keying anew)."""
    return hmac.new(salt, tag, "sha256")


def _keyed_bytes(salt: bytes, tag: bytes, data: bytes) -> str:
    keyed = _keyed_start(salt, tag).copy()
    keyed.update(data)
    return keyed.hexdigest()


# a list asked whole (no page: offset 0, no limit; an audit replay from its start: no cursor) is spelled without
# them, as receipts of such answers always were
_WHOLE_LIST = (("offset", 0), ("limit", None), ("cursor", None))


def request_fields(answer: str, params: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """The parameters that define an answer, in one spelling (times as RFC 3339 UTC), without tenant, after and
    receipt."""
    values = params.model_dump(by_alias=True) if isinstance(params, BaseModel) else dict(params)
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k in ("tenant", "after", "receipt") or (k, v) in _WHOLE_LIST:
            continue
        out[k] = rfc3339(v) if isinstance(v, datetime) else v.model_dump() if isinstance(v, BaseModel) else v
    return {"answer": answer, **out}


@functools.cache
def _signer(path: Path | None) -> ChainSigner | None:
    """The chain signing key, read once; a key that cannot be read leaves receipts unsigned (said once, loudly),
    rather than failing every read."""
    try:
        return load_signer(path)
    except SigningKeyError as exc:
        log.error("receipts are issued unsigned: %s", exc)
        return None


# by id(settings), with the ranking's plain form (`_plain`; None: not plain): a process has one or two
_RANKINGS: dict[int, tuple[Settings, shapes.ReceiptRanking, Any]] = {}


def ranking(settings: Settings) -> shapes.ReceiptRanking:
    """What ranks a recall here: the models and recall's settings, as configured (worked out once per settings
    object: a receipt is issued on every recall)."""
    return _ranked(settings)[0]


def _ranked(settings: Settings) -> tuple[shapes.ReceiptRanking, Any]:
    """`ranking(settings)` and its plain form, made once per settings object."""
    known = _RANKINGS.get(id(settings))
    if known is not None and known[0] is settings:
        return known[1], known[2]
    made = _ranking(settings)
    try:
        plain = _plain(made)
    except _NotPlain:
        plain = None
    if len(_RANKINGS) > 64:  # settings objects made per test or bench variant: never many held
        _RANKINGS.clear()
    _RANKINGS[id(settings)] = (settings, made, plain)
    return made, plain


def _ranking(settings: Settings) -> shapes.ReceiptRanking:
    models = {
        "embedding": settings.embed_model,
        "embedding_en": settings.embed_model_en,
        "rerank": settings.rerank_model if settings.rerank_enabled else None,
    }
    tuned = {k: getattr(settings, k) for k in RecallSettings.model_fields}
    tuned["embed_cross_language"] = settings.embed_cross_language
    assert "embed_cross_language" in EmbeddingSettings.model_fields
    return {"models": models, "settings": tuned}


async def issue(
    res: Resources,
    answer: Answer,
    tenant: str,
    body: Mapping[str, Any],
    request: Mapping[str, Any],
    event_ids: Sequence[str],
    *,
    as_of: datetime | str | None,
    known_at: datetime | None = None,
    ranked: bool = False,
    basis: rows.Basis | None = None,
) -> shapes.Receipt:
    """The signed receipt of `body`, an answer showing the events `event_ids` (in its order, repeats allowed).
    `basis`: what the answer's own reads gathered for it (`basis()`); if it holds every cited event, no read here."""
    issued = datetime.now(UTC)
    settings = res.settings
    ids = list(dict.fromkeys(event_ids))
    found: Mapping[str, rows.CitedRow | None]
    if basis is not None and basis.positions is not None and basis.covers(ids):
        salt, positions, found = basis.salt, basis.positions, basis.found
    else:
        async with res.pool.connection() as conn:
            salt, positions, found = await rows.receipt_rows(
                conn, settings.processor_group, settings.topic, tenant, ids
            )

    def cite_all() -> list[shapes.ReceiptCited]:
        return [_cite(salt, tenant, row) for eid in ids if (row := found.get(eid)) is not None]

    # a digest and two HMACs a cited event: a long answer's (an audit replay of thousands) in a worker thread
    cited = await run_in_threadpool(cite_all) if len(ids) > _INLINE_CITED else cite_all()
    signer = _signer(settings.chain_key_file)
    ranks, ranks_plain = _ranked(settings) if ranked else (None, None)
    receipt: dict[str, Any] = {
        "receipt": 1,
        "answer": answer,
        "tenant": tenant,
        "issued_at": rfc3339(issued),
        "positions": encode_token(positions or {0: 0}),
        "as_of": rfc3339(as_of) if isinstance(as_of, datetime) else as_of,
        "known_at": rfc3339(known_at or issued),
        "request": _keyed(salt, _REQUEST, dict(request)),
        **await _digests(answer, body, many=len(ids) > _INLINE_CITED),
        "cited": cited,
        "ranking": ranks,
        **({"served": dict(sorted(basis.served.items()))} if ranked and basis is not None and basis.served else {}),
        "key_id": None if signer is None else signer.key_id,
        "public_key": None if signer is None else base64.b64encode(signer.public).decode(),
    }
    if signer is None:
        return receipt | {"signature": None}  # type: ignore[return-value]  # a dict
    sig = await _sign(signer, _SIGNED + _signed_bytes(receipt, ranks_plain))
    return receipt | {"signature": base64.b64encode(sig).decode()}  # type: ignore[return-value]  # a dict


async def _sign(signer: ChainSigner, message: bytes) -> bytes:
    """Ed25519 hashes the whole message, a long answer's receipt megabytes of it: in a worker thread past
    _INLINE_BYTES (`cryptography` lets go of the GIL meanwhile, so the event loop runs)."""
    return await run_in_threadpool(signer.sign, message) if len(message) > _INLINE_BYTES else signer.sign(message)


def _signed_bytes(receipt: dict[str, Any], ranking_plain: Any) -> bytes:
    """canonical(receipt) without walking it: a receipt's fields are strings, integers, None and objects and lists of
    them under ASCII keys, whose canonical JSON is orjson's sorted bytes, but for its ranking (settings: floats),
    whose plain form was made once with it (`_ranked`), and the access signals it was `served` (floats, made plain
    here). A field that is not so would fail its signature's check."""
    plain: dict[str, Any] = {}
    if receipt["ranking"] is not None:
        if ranking_plain is None:
            return canonical(receipt)
        plain["ranking"] = ranking_plain
    if "served" in receipt:
        try:
            plain["served"] = _plain(receipt["served"])
        except _NotPlain:
            return canonical(receipt)
    return orjson.dumps({**receipt, **plain} if plain else receipt, option=orjson.OPT_SORT_KEYS)


def basis(settings: Settings) -> rows.Basis:
    """An empty receipt basis for a read to fill (`issue(..., basis=)`): recall's verification fills it."""
    return rows.Basis(settings.processor_group, settings.topic)


_T = TypeVar("_T")
_INLINE_BYTES = 64 * 1024  # an answer up to this size is digested on the event loop (a thread hop costs more)
_INLINE_CITED = 100  # cited events cited or checked on the event loop (~15 µs each); more in a worker thread


async def _digests(answer: Answer, body: Mapping[str, Any], *, many: bool = False) -> dict[str, Any]:
    """The answer's digest and its parts' digests (`_off_the_loop`)."""
    return await _off_the_loop(body, lambda: _digest_and_parts(answer, body), many=many)


async def _off_the_loop(body: Any, digest: Callable[[], _T], *, many: bool = False) -> _T:
    """digest(), a digest of `body`. A subject's whole profile can be megabytes, whose canonical JSON and sha256
    take tens of milliseconds: a large body's are taken in a worker thread, so the event loop keeps serving other
    tenants meanwhile. `many`: the body shows more than _INLINE_CITED events, so it goes to the thread unmeasured
    (the measuring dump of an audit replay's megabytes holds the event loop itself)."""
    if many:
        return await run_in_threadpool(digest)
    try:
        small = len(orjson.dumps(body)) <= _INLINE_BYTES
    except TypeError:  # what orjson cannot write, canonical() writes its own way: judged there, in the thread
        small = False
    return digest() if small else await run_in_threadpool(digest)


def _cite(salt: bytes, tenant: str, row: rows.CitedRow) -> shapes.ReceiptCited:
    return {
        "version_id": version_id_for(tenant, row.event_id),
        "memory_id": row.memory_id,
        "partition": row.partition,
        "offset": row.offset,
        "link": None if row.link is None else row.link.hex(),
        "digest": _keyed_plain(salt, _EVENT, [tenant, row.event_id, row.fingerprint, row.partition, row.offset]),
        "subject": _keyed_plain(salt, _SUBJECT, [tenant, row.subject])[:32],
    }


def _keyed_plain(salt: bytes, tag: bytes, value: list[str | int]) -> str:
    """_keyed of a list of strings and integers, whose canonical JSON is orjson's bytes as they are (no float)."""
    return _keyed_bytes(salt, tag, orjson.dumps(value))


# -- checking a receipt --------------------------------------------------------------------------------------


def _own(tenants: frozenset[str], tenant: str, receipt: Mapping[str, Any]) -> None:
    """The caller may use `tenant`, and the receipt is one of that tenant's: else 403, or 404 as for any resource
    of another tenant (nothing said about it)."""
    check_tenant(tenant, tenants)
    if receipt.get("tenant") != tenant:
        raise ApiError(404, "not_found", f"no such receipt in tenant {tenant!r}", "receipt.tenant")


def _trusted(settings: Settings) -> set[bytes]:
    keys = set()
    signer = _signer(settings.chain_key_file)
    if signer is not None:
        keys.add(signer.public)
    for text in settings.chain_trusted_keys:
        try:
            keys.add(parse_public_key(text))
        except SigningKeyError:
            continue  # `ledger verify` names a bad trusted key; a receipt is simply not trusted under it
    return keys


def _b64_one_spelling(text: str) -> bytes:
    """The bytes of `text` if it is their one base64 spelling, else ValueError: decoding ignores the bits a last
    character leaves unused, so 16 texts read as one 64-byte signature, and a receipt changed there would verify."""
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("not the canonical base64 of its bytes")
    return raw


def signature_state(
    settings: Settings, receipt: Mapping[str, Any]
) -> Literal["valid", "invalid", "unsigned", "untrusted"]:
    signature = receipt.get("signature")
    if signature is None:
        return "unsigned"
    body = {k: v for k, v in receipt.items() if k != "signature"}
    try:
        public = _b64_one_spelling(str(receipt.get("public_key") or ""))
        sig = _b64_one_spelling(str(signature))
    except ValueError:
        return "invalid"
    try:
        signed = _SIGNED + canonical(body)
    except NotCanonical:  # what no receipt holds was never signed
        return "invalid"
    if not signature_valid(public, sig, signed):
        return "invalid"
    return "valid" if public in _trusted(settings) else "untrusted"


def _signed_here(settings: Settings, receipt: Mapping[str, Any]) -> None:
    """A replay re-derives only what this ledger answered: a receipt signed by its key, or unsigned where it signs
    none. Else 422: a receipt anyone can write (unsigned, another key's, or altered) would let its author ask
    whether a guessed subject or query matches the receipt's keyed request digest, for another tenant's too."""
    state = signature_state(settings, receipt)
    if state == "valid" or (state == "unsigned" and _signer(settings.chain_key_file) is None):
        return
    why = {
        "invalid": "does not hold",
        "untrusted": "is not by this ledger's key",
        "unsigned": "is missing: this ledger signs its receipts",
    }[state]
    raise ApiError(422, "invalid_value", f"the receipt's signature {why} (verify it)", "receipt.signature")


class _Repeated(Exception):
    """A member name that stands twice in one object."""


def _names_once(pairs: list[tuple[str, Any]]) -> None:
    """json's object hook: raises _Repeated at the first name an object repeats (the values are not kept)."""
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise _Repeated(name)
        seen.add(name)


def repeated_name(body: bytes) -> str | None:
    """The first member name that stands twice in one object of the JSON `body`, else None. A parser keeps one of
    the two, orjson the last, others the first: a receipt so spelled could verify here and be read otherwise by its
    holder, so neither door checks one (RFC 8785 takes I-JSON, which names each member once). What the standard
    parser cannot read (nesting past its recursion) is judged by the other checks."""
    try:
        json.loads(body, object_pairs_hook=_names_once)
    except _Repeated as repeated:
        return str(repeated.args[0])
    except (ValueError, RecursionError):
        return None
    return None


async def names_once(body: bytes) -> None:
    """422 naming the body when a name stands twice in one of its objects (`repeated_name`); a large body is read
    in a worker thread."""
    name = await run_in_threadpool(repeated_name, body) if len(body) > _INLINE_BYTES else repeated_name(body)
    if name is not None:
        message = f"the name {name!r} stands twice in one object: a receipt and its answer name each member once"
        raise ApiError(422, "invalid_value", message, "body")


def _positions(receipt: Mapping[str, Any]) -> dict[int, int]:
    try:
        return decode_token(receipt["positions"])
    except ValueError as exc:
        raise ApiError(422, "invalid_value", str(exc), "receipt.positions") from None


async def verify(res: Resources, tenants: frozenset[str], body: ReceiptBody) -> shapes.ReceiptVerification:
    """`POST /v1/receipts/verify` (see the module docstring)."""
    receipt, tenant, settings = body.receipt, body.tenant, res.settings
    _own(tenants, tenant, receipt)
    cited: list[dict[str, Any]] = receipt["cited"]
    # the canonical JSON of a long receipt takes tens of milliseconds: in a worker thread, off the event loop
    long = len(cited) > _INLINE_CITED
    signature = (
        await run_in_threadpool(signature_state, settings, receipt) if long else signature_state(settings, receipt)
    )
    positions = _positions(receipt)
    places = [(c["partition"], c["offset"]) for c in cited]
    consumer, topic = settings.processor_group, settings.topic
    async with res.pool.connection() as conn:
        salt, _ = await rows.receipt_state(conn, consumer, topic)
        held = await rows.held_at(conn, consumer, topic, places)
        gone = [c for c in cited if (c["partition"], c["offset"]) not in held]
        erased = await rows.erased_versions(conn, tenant, [c["version_id"] for c in gone])
        gone_places = [(c["partition"], c["offset"]) for c in gone if c["version_id"] in erased]
        erasures = await rows.erasures_after(conn, tenant, gone_places)
        links = await rows.links_at(conn, consumer, topic, gone_places)

    def check_all() -> list[shapes.ReceiptCheck]:
        return [_check(salt, tenant, c, positions, held, erased, erasures, links) for c in cited]

    # two HMACs a cited event: a long receipt's in a worker thread, off the event loop
    checks = await run_in_threadpool(check_all) if long else check_all()
    out: shapes.ReceiptVerification = {
        "valid": signature == "valid" and all(c["state"] in ("held", "erased") for c in checks),
        "signature": signature,
        "cited": checks,
        "erased": sum(c["state"] == "erased" for c in checks),
    }
    if body.answer is not None:
        supplied = body.answer

        def judged() -> str | None:  # the depth with the digest: both walk the whole answer
            return answer_digest(supplied) if within_depth(supplied, ANSWER_MAX_DEPTH) else None

        try:
            digest = await _off_the_loop(supplied, judged)
        except NotCanonical as exc:
            raise ApiError(422, "invalid_value", f"{exc}: no answer of this service does", "answer") from None
        if digest is None:
            message = f"is nested deeper than {ANSWER_MAX_DEPTH} levels: no answer of this service is"
            raise ApiError(422, "invalid_value", message, "answer")
        out["answer"] = digest == receipt["answer_digest"]
        out["valid"] = out["valid"] and out["answer"]
    return out


def _check(
    salt: bytes,
    tenant: str,
    c: Mapping[str, Any],
    positions: Mapping[int, int],
    held: Mapping[tuple[int, int], tuple[str, rows.CitedRow]],
    erased: set[str],
    erasures: Sequence[rows.Erasure],
    links: Mapping[tuple[int, int], bytes],
) -> shapes.ReceiptCheck:
    vid, place = c["version_id"], (c["partition"], c["offset"])

    def state(s: Literal["held", "erased", "differs", "missing"], detail: str) -> shapes.ReceiptCheck:
        return {"version_id": vid, "state": s, "detail": detail}

    if place[1] >= positions.get(place[0], 0):
        return state("differs", "cited at a place past the receipt's positions")
    found = held.get(place)
    if found is not None and found[0] != tenant:  # another tenant's event: read as an empty place, or this tenant's
        found = None  # receipts would tell where that tenant's events are, and when they were erased
    if found is not None:
        cite = _cite(salt, tenant, found[1])  # what a receipt cites of this row today
        if cite["version_id"] != vid:
            return state("differs", "the ledger holds another event at that place")
        wrong = [name for name in ("digest", "link", "memory_id", "subject") if cite[name] != c[name]]
        if wrong:
            return state("differs", "the ledger holds this event with another " + ", ".join(wrong))
        return state("held", f"in the ledger at partition {place[0]} offset {place[1]}")
    if vid not in erased:
        return state("missing", "the ledger holds no such event at that place")
    stored = links.get(place)
    if c["link"] is not None and stored is not None and stored.hex() != c["link"]:
        return state("differs", "erased since, and the chain link at its place is not the receipt's")
    for e in erasures:
        if (
            e.partition == place[0]
            and e.offset > place[1]
            and _keyed(salt, _SUBJECT, [tenant, e.subject])[:32] == c["subject"]
        ):
            return state("erased", f"erased at {rfc3339(e.at)} (partition {e.partition} offset {e.offset})")
    # its subject's erasure is not after it in its partition: the event was sent under another subject's key (its
    # partition has no order with the erasure's), or the erasure is no longer in the projection
    return state("erased", "erased (by an erasure of its subject not logged after it in its partition)")


# -- replaying a receipt -------------------------------------------------------------------------------------


def _same_request(salt: bytes, answer: str, params: BaseModel, receipt: Mapping[str, Any]) -> bool:
    try:
        return _keyed(salt, _REQUEST, request_fields(answer, params)) == receipt["request"]
    except NotCanonical:  # what no request of this service holds was never asked
        return False


async def replay(res: Resources, tenants: frozenset[str], body: ReplayBody) -> shapes.ReceiptReplay:
    """`POST /v1/receipts/replay` (see the module docstring)."""
    receipt, tenant, settings = body.receipt, body.tenant, res.settings
    _own(tenants, tenant, receipt)
    named = body.request.get("tenant", tenant)
    if named != tenant:  # the replay's tenant is the request's: another one named there is refused, never ignored
        if isinstance(named, str):
            check_tenant(named, tenants, "request.tenant")
        message = f"names another tenant than the replay's ({tenant!r}): leave it out, or name that one"
        raise ApiError(422, "invalid_value", message, "request.tenant")
    _signed_here(settings, receipt)
    answer: Answer = receipt["answer"]
    if answer == "context":
        raise ApiError(
            422,
            "invalid_value",
            "a context block is verified, not replayed: replay the recall and facts it was made of",
            "receipt.answer",
        )
    try:
        params = _REQUESTS[answer].model_validate({**body.request, "tenant": tenant})
    except ValidationError as exc:  # judged as the read's own route judges them (api.errors), under `request`
        item = validation_items(exc.errors())[0]
        message = f"not the parameters of a {answer} read: {item['message']}"
        raise ApiError(422, item["code"], message, "request" + ("." + item["field"] if item["field"] else "")) from None
    async with res.pool.connection() as conn:
        salt, _ = await rows.receipt_state(conn, settings.processor_group, settings.topic)
    same_request = _same_request(salt, answer, params, receipt)
    if not same_request and answer in _MCP_REQUESTS:
        try:
            mcp = _MCP_REQUESTS[answer].model_validate({**body.request, "tenant": tenant})
        except ValidationError:  # not a request the MCP door takes either
            pass
        else:
            if _same_request(salt, answer, mcp, receipt):
                params, same_request = mcp, True
    if not same_request:
        raise ApiError(
            422,
            "invalid_value",
            "these are not the parameters the receipt was made for (a page's offset and limit are parameters too, "
            "as the answer's page names them)"
            if answer in ("facts", "history")
            else "these are not the parameters the receipt was made for (a page's cursor and limit are parameters "
            "too, as they were asked)"
            if answer == "events"
            else "these are not the parameters the receipt was made for",
            "request",
        )
    below = _positions(receipt)
    as_of = None if receipt["as_of"] is None else parse_rfc3339(receipt["as_of"])
    known_at = parse_rfc3339(receipt["known_at"])
    differ: list[str] = []
    if answer == "facts":
        assert isinstance(params, FactsParams)
        if as_of is None:  # signed with it, so only a receipt of another shape: never one this ledger issued
            raise ApiError(422, "invalid_value", "a facts receipt names the time it was asked as of", "receipt.as_of")
        again: dict[str, Any] = await reads.subject_facts(
            res,
            tenants,
            tenant,
            params.subject,
            as_of,
            params.known_at,
            offset=params.offset,
            limit=params.limit,
            below=below,
            receipt=False,
        )
    elif answer == "history":
        assert isinstance(params, HistoryParams)
        try:
            again = await reads.history(
                res,
                tenants,
                tenant,
                params.memory_id,
                offset=params.offset,
                limit=params.limit,
                below=below,
                receipt=False,
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
            # the receipt's fact has no version below its positions now (erased since): an empty chain, which
            # differs, as a facts replay answers no facts
            again = shapes.HistoryResponse(memory_id=params.memory_id, tenant=tenant, versions=[])
    elif answer == "events":
        assert isinstance(params, EventsParams)
        again = await reads.subject_log(
            res,
            tenants,
            tenant,
            params.subject,
            params.from_,
            params.to,
            params.limit,
            cursor=params.cursor,
            below=below,
            receipt=False,
        )
    else:
        assert isinstance(params, RecallBody)
        differ = _differ(receipt.get("ranking"), ranking(settings))
        # a read as known now knew every version logged below its positions, one observed a little ahead of the
        # clock too (the contract allows a skew): its replay knows them all, whenever observed
        known = known_at if params.known_at is not None else reads.WHENEVER_OBSERVED
        ask = params.model_copy(update={"as_of": as_of, "known_at": known, "after": None})
        served = receipt.get("served") or {}  # how often facts were served then, which the ledger does not hold
        again = await reads.recall(res, tenants, ask, receipt=False, record=False, below=below, served=served)
    digests = await _digests(answer, again)  # a replayed profile can be as large as the answer it replays
    now = digests["parts"]
    differs = "differs"
    if any(name in now and now[name] != then for name, then in receipt["parts"].items()):
        differs = await _why_it_differs(res, tenant, receipt)
    parts: list[shapes.ReplayPart] = []
    for name, then in receipt["parts"].items():
        if name == "ranked" and differ:
            parts.append({"part": name, "same": None, "detail": "not compared: " + ", ".join(differ) + " differ now"})
        elif name in now:
            same = now[name] == then
            parts.append({"part": name, "same": same, "detail": "the same" if same else differs})
    digest = digests["answer_digest"]
    return {
        "answer": answer,
        "same": bool(parts) and all(p["same"] is True for p in parts),
        "identical": digest == receipt["answer_digest"],
        "answer_digest": receipt["answer_digest"],
        "replayed_digest": digest,
        "parts": parts,
        "models_differ": differ,
        "replayed": again,
    }


async def _why_it_differs(res: Resources, tenant: str, receipt: Mapping[str, Any]) -> str:
    """A differing part's detail: that cited versions were erased since (the answer replays without them), when
    some were; the receipt's verification says when and where."""
    cited = [c["version_id"] for c in receipt["cited"]]
    async with res.pool.connection() as conn:
        erased = await rows.erased_versions(conn, tenant, cited) if cited else set()
    if not erased:
        return "differs"
    return f"differs: {len(erased)} of the {len(cited)} versions it cited were erased since (verify it for when)"


def _differ(then: Mapping[str, Any] | None, now: shapes.ReceiptRanking) -> list[str]:
    if then is None:
        return []
    out = [
        f"{group}.{k}"
        for group in ("models", "settings")
        for k in sorted(set(then.get(group, {})) | set(now[group]))  # type: ignore[literal-required]
        if then.get(group, {}).get(k) != now[group].get(k)  # type: ignore[literal-required]
    ]
    return out
