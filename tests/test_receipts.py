"""Receipts on answers, and checking them: `POST /v1/receipts/verify` and `/replay` (api.receipts).

On the real servers (a private ledger, the worker, indexer and embedder as they run, the app in process, signing
with a key of the test's): every read (recall, context, facts, history, the audit replay) answers a receipt that
verifies, with the answer's digest, and holds no value or text of the answer; a receipt with any one field changed
does not verify (each field in turn, leaf by leaf, and one byte of its JSON); replay of a recall made before a
supersession gives the first answer (and the facts, history and audit replay receipts replay the same); a cited
version erased since verifies as "erased at ..." and shows nothing of it; another tenant's receipt is refused (404
to a key of both tenants, 403 to a key of the other only), over HTTP and the MCP tools alike; a replay with other
parameters than the receipt's is refused naming `request`; a chain link changed in PostgreSQL fails the receipt that
cites it and `ledger verify` names its place; a recall's receipt is read with its answer (no pool checkout of its
own) and is the receipt its own read would make; a value no canonical JSON holds, in any field of a receipt or in a
supplied answer, is judged or refused, never a server error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import string
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from api.mcp.tools import TOOLS, run_tool
from api.receipts import answer_digest, canonical
from api.resources import Resources
from producers.contract import EventType, MemoryEvent, parse_rfc3339, rfc3339
from producers.keys.signing import ChainSigner, new_signing_key
from producers.sdk import LedgerProducer
from producers.settings import Settings
from projections.postgres.connection import GENERIC_PLANS, search_path
from stream_processors.verify import verify
from tests.conftest import unique
from tests.support import changed, episode, pg, pipeline, with_value_at

TENANT, OTHER = "rcpt", "rcpt-other"
KEY, OTHER_KEY = "k-rcpt", "k-rcpt-other"  # KEY may use both tenants, OTHER_KEY only the other
KEYS = {KEY: [TENANT, OTHER], OTHER_KEY: [OTHER]}
H, H_OTHER = {"X-API-Key": KEY}, {"X-API-Key": OTHER_KEY}
SUBJECT, GONE = "project:R1", "user:r9"
SECRET = "sekrit-port-8181"  # a value that must appear in no receipt


def _fact(subject: str, key: str, value: Any, event_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "memory.asserted",
        "tenant": fields.pop("tenant", TENANT),
        "event_id": event_id,
        "subject": subject,
        "key": key,
        "value": value,
        "entities": ["R1"],
        "aliases": ["backend port"],
        "content": f"{subject} {key} is {value}",
        **fields,
    }


@pytest.fixture(scope="module")
def stack(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    key_file = tmp_path_factory.mktemp("receipts") / "chain-key"
    key_file.write_bytes(new_signing_key())
    key_file.chmod(0o600)
    settings = base_settings.private(unique("rcpt"), api_keys=KEYS, chain_key_file=key_file)
    with pipeline(settings, app=True) as pipe:
        pipe.publish(
            [
                _fact(SUBJECT, "project.port", SECRET, "r1-port-1"),
                _fact(GONE, "contact.email", "ann@example.com", "r9-mail", entities=[], aliases=[]),
                _fact(SUBJECT, "project.port", 1, "other-1", tenant=OTHER),
            ]
        )
        pipe.settle()
        yield pipe


def _post(pipe: Any, path: str, body: dict[str, Any], headers: dict[str, str] = H) -> Any:
    return pipe.client.post(path, json=body, headers=headers)


def _get(pipe: Any, path: str, headers: dict[str, str] = H, **params: Any) -> Any:
    return pipe.client.get(path, params={"tenant": TENANT, **params}, headers=headers)


def _recall(pipe: Any, **extra: Any) -> dict[str, Any]:
    body = {"tenant": TENANT, "subject": SUBJECT, "query": "R1 backend port", **extra}
    r = _post(pipe, "/v1/recall", body)
    assert r.status_code == 200, r.text
    return r.json()


def _verify(pipe: Any, receipt: dict[str, Any], answer: Any = None, headers: dict[str, str] = H) -> Any:
    body = {"tenant": receipt.get("tenant", TENANT), "receipt": receipt}
    if answer is not None:
        body["answer"] = answer
    return _post(pipe, "/v1/receipts/verify", body, headers)


def _every_answer(pipe: Any) -> dict[str, dict[str, Any]]:
    recall = _recall(pipe)
    memory_id = recall["hits"][0]["memory_id"]
    context = _post(
        pipe,
        "/v1/context",
        {"tenant": TENANT, "subject": SUBJECT, "question": "R1 backend port", "format": "json"},
    )
    out = {
        "recall": recall,
        "context": context.json(),
        "facts": _get(pipe, f"/v1/subjects/{SUBJECT}/facts").json(),
        "history": _get(pipe, f"/v1/facts/{memory_id}/history").json(),
        "events": _get(pipe, f"/v1/subjects/{SUBJECT}/events").json(),
    }
    return out


def test_every_answer_has_a_receipt_that_verifies_and_holds_no_data(stack: Any) -> None:
    for name, answer in _every_answer(stack).items():
        receipt = answer["receipt"]
        assert receipt["answer"] == name and receipt["tenant"] == TENANT
        assert receipt["signature"] and receipt["key_id"]
        assert receipt["cited"], name
        for c in receipt["cited"]:
            assert len(c["link"]) == 64 and c["offset"] < 10**6
        assert receipt["answer_digest"] == answer_digest(answer)
        text = canonical(receipt).decode()
        assert SECRET not in text and SUBJECT not in text and "backend port" not in text, name
        r = _verify(stack, receipt, answer)
        assert r.status_code == 200, r.text
        checked = r.json()
        assert checked["valid"] is True and checked["signature"] == "valid" and checked["answer"] is True, checked
        assert [c["state"] for c in checked["cited"]] == ["held"] * len(receipt["cited"])
    assert "receipt" not in _recall(stack, receipt=False)  # one recall without
    # the text block's receipt, in its header, is the json form's
    text = _post(stack, "/v1/context", {"tenant": TENANT, "subject": SUBJECT, "as_of": "2030-01-01T00:00:00Z"})
    receipt = orjson.loads(base64.urlsafe_b64decode(text.headers["X-Receipt"]))
    assert receipt["answer"] == "context" and _verify(stack, receipt).json()["valid"] is True


def test_a_text_context_receipt_too_large_for_a_header_is_asked_for_as_json(stack: Any) -> None:
    """A block citing many facts: its receipt is past what a header carries (ordinary clients refuse a response
    with a 100 KiB header line), so the text form says so (`X-Receipt-Omitted`) and the json form has it."""
    subject = "project:wide"
    stack.publish([_fact(subject, f"setting.{n}", n, f"wide-{n}") for n in range(60)])
    stack.settle()
    body = {"tenant": TENANT, "subject": subject, "budget_tokens": 8000}
    text = _post(stack, "/v1/context", body)
    assert text.status_code == 200 and "X-Receipt" not in text.headers, text.headers
    assert "format=json" in text.headers["X-Receipt-Omitted"]
    doc = _post(stack, "/v1/context", {**body, "format": "json"}).json()
    assert len(doc["receipt"]["cited"]) == 60 and _verify(stack, doc["receipt"]).json()["valid"] is True


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def test_a_receipt_with_any_field_changed_does_not_verify(stack: Any) -> None:
    answers = _every_answer(stack)
    for name in ("recall", "facts"):
        receipt = answers[name]["receipt"]
        assert _verify(stack, receipt).json()["valid"] is True
        for path, value in _leaves(receipt):
            r = _verify(stack, with_value_at(receipt, path, changed(value)))
            where = ".".join(map(str, path))
            if r.status_code == 200:
                assert r.json()["valid"] is False, (name, where)
            else:  # a change the shape refuses (a literal), or another tenant's name
                assert r.status_code in (403, 404, 422), (name, where, r.text)
        # one byte of its JSON, wherever it still parses as a receipt
        raw = canonical(receipt)
        for i in range(0, len(raw), max(1, len(raw) // 97)):
            flipped = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :]
            try:
                bad = orjson.loads(flipped)
            except orjson.JSONDecodeError:
                continue
            if bad == receipt:
                continue
            r = _verify(stack, bad) if isinstance(bad, dict) else None
            if r is not None and r.status_code == 200:
                assert r.json()["valid"] is False, (name, i)
        # base64 decoders ignore the bits a last character leaves unused: every other spelling of the same bytes is
        # a changed receipt too
        for field in ("signature", "public_key"):
            text = receipt[field]
            body = text.rstrip("=")
            for c in string.ascii_letters + string.digits + "+/":
                spelled = body[:-1] + c + text[len(body) :]
                if spelled != text and base64.b64decode(spelled) == base64.b64decode(text):
                    r = _verify(stack, {**receipt, field: spelled})
                    assert r.status_code == 200 and r.json()["valid"] is False, (name, field, spelled, r.text)
        # the answer with one value changed is not the receipt's
        answer = copy.deepcopy(answers[name])
        rows = answer["hits"] if name == "recall" else answer["facts"]
        rows[0]["value"] = "8182"
        assert _verify(stack, receipt, answer).json() | {"cited": None} == {
            "valid": False,
            "signature": "valid",
            "answer": False,
            "cited": None,
            "erased": 0,
        }


def test_hostile_receipts_are_refused_naming_the_field(stack: Any) -> None:
    receipt = _get(stack, f"/v1/subjects/{SUBJECT}/facts").json()["receipt"]
    (c,) = receipt["cited"]
    for bad in (
        {"offset": 2**63},
        {"offset": -1},
        {"partition": 2**40},
        {"version_id": "v\u0000x"},
        {"memory_id": "m" * 100_000},
    ):
        r = _verify(stack, {**receipt, "cited": [{**c, **bad}]})
        assert r.status_code == 422 and r.json()["detail"][0]["field"].startswith("receipt"), (bad, r.text)
    # each cited field given each JSON type it is not (a number in a string, a whole float, true): refused naming it
    nullable = {"memory_id", "link"}
    for name, held in c.items():
        for value in ("7", 7, 1.0, 2.5, True, None, [], {}):
            if type(value) is type(held) or (value is None and name in nullable):
                continue
            r = _verify(stack, {**receipt, "cited": [{**c, name: value}]})
            assert r.status_code == 422, (name, value, r.text[:300])
            assert r.json()["detail"][0]["field"] == f"receipt.cited.0.{name}", (name, value, r.text[:300])
    for bad in ({"positions": "not a token"}, {"public_key": "!!"}, {"signature": "\u0000"}):
        r = _verify(stack, {**receipt, **bad})
        assert r.status_code in (200, 422), (bad, r.text)
        assert r.status_code == 422 or r.json()["valid"] is False
    r = _verify(stack, {**receipt, "cited": [c] * 10_001})
    assert r.status_code == 422, r.text[:300]
    # nested past what an answer or a receipt can be, and past the serializer's own limit (254): refused or judged,
    # never a server error
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"d": deep}
    r = _verify(stack, receipt, {"facts": [deep]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "answer", r.text[:300]
    assert _verify(stack, receipt, {"facts": [{"value": {"d": {}}}]}).json()["valid"] is False  # shallow: judged
    for field in ("ranking", "request", "as_of", "cited"):
        r = _verify(stack, {**receipt, field: deep})
        assert r.status_code in (200, 422), (field, r.text[:300])
        assert r.status_code == 422 or r.json()["valid"] is False


# what a client's JSON may hold and no canonical JSON does (RFC 8785 takes I-JSON): the standard parser reads each
_NOT_CANONICAL = (b"NaN", b"-Infinity", b"1e400", b'"\\ud800"', b"123456789012345678901234567890")
_HOSTILE = "__hostile__"


def _raw(pipe: Any, path: str, body: dict[str, Any], literal: bytes, key: bool = False) -> Any:
    """`body` posted with the string `_HOSTILE` (as a value, or as a key with `key`) written as `literal`."""
    mark = orjson.dumps(_HOSTILE)
    raw = orjson.dumps(body).replace(mark + b":", b'"\\udc00":') if key else orjson.dumps(body)
    return pipe.client.post(path, content=raw.replace(mark, literal), headers={**H, "content-type": "application/json"})


def test_values_no_canonical_json_holds_are_judged_never_a_server_error(stack: Any) -> None:
    """Each field of a receipt given each value no canonical JSON holds (NaN, an infinity, a lone surrogate, an
    integer outside 64 bits; and a lone surrogate as a key): verify answers that it does not hold (or refuses it),
    replay refuses it; a supplied answer holding one is refused naming `answer`. Before, each was a 500."""
    recall = _recall(stack)
    receipt, answer = recall["receipt"], {k: v for k, v in recall.items() if k != "receipt"}
    request = {"tenant": TENANT, "subject": SUBJECT, "query": "R1 backend port"}
    assert receipt["cited"] and receipt["ranking"], receipt

    # each field's value; a key of each object, and a value added under it
    cases = [(p, with_value_at(receipt, p, _HOSTILE), False) for p, _ in _leaves(receipt) if p[-1] != "signature"]
    for path in [(), ("cited", 0), ("parts",), ("ranking",), ("ranking", "settings"), ("ranking", "models")]:
        cases.append(((*path, "a key"), with_value_at(receipt, (*path, _HOSTILE), 1), True))
        cases.append(((*path, "extra"), with_value_at(receipt, (*path, "extra"), _HOSTILE), False))
    for where, bad, key in cases:
        for literal in _NOT_CANONICAL:
            r = _raw(stack, "/v1/receipts/verify", {"tenant": TENANT, "receipt": bad}, literal, key)
            assert r.status_code in (200, 404, 422), (where, literal, r.text[:300])  # 404: its tenant's name
            assert r.status_code != 200 or r.json()["valid"] is False, (where, literal, r.text[:300])
            body = {"tenant": TENANT, "receipt": bad, "request": request}
            r = _raw(stack, "/v1/receipts/replay", body, literal, key)
            assert r.status_code in (404, 422), (where, literal, r.text[:300])
    for literal in _NOT_CANONICAL:
        for key in (False, True):
            extra = {_HOSTILE: 1} if key else {"extra": _HOSTILE}
            supplied = {**answer, "hits": [{**answer["hits"][0], **extra}]}
            r = _raw(
                stack, "/v1/receipts/verify", {"tenant": TENANT, "receipt": receipt, "answer": supplied}, literal, key
            )
            assert r.status_code == 422, (literal, key, r.text[:300])
            assert r.json()["detail"][0]["field"] == "answer", (literal, key, r.text[:300])
    assert _verify(stack, receipt, answer).json()["valid"] is True  # the same answer, as JSON holds it


def _replay(pipe: Any, receipt: dict[str, Any], request: dict[str, Any], headers: dict[str, str] = H) -> Any:
    return _post(pipe, "/v1/receipts/replay", {"tenant": TENANT, "receipt": receipt, "request": request}, headers)


def test_an_audit_replay_page_by_cursor_replays_from_its_receipt(stack: Any) -> None:
    subject = "project:R3"
    stack.publish([_fact(subject, f"project.k{n}", n, f"r3-{n}") for n in range(5)])
    stack.settle()
    first = _get(stack, f"/v1/subjects/{subject}/events", limit=2).json()
    asked = {"subject": subject, "limit": 2, "cursor": first["next_cursor"]}
    page = _get(stack, f"/v1/subjects/{subject}/events", limit=2, cursor=first["next_cursor"]).json()
    assert [e["event_id"] for e in page["events"]] == ["r3-2", "r3-3"] and page["more"] is True
    stack.publish([_fact(subject, "project.k2", 20, "r3-5")])  # logged later, and changes r3-2's effect now
    stack.settle()
    r = _replay(stack, page["receipt"], asked)
    assert r.status_code == 200, r.text
    assert r.json()["same"] is True and r.json()["replayed"]["events"] == page["events"], r.json()["parts"]
    for other in ({**asked, "cursor": None}, {**asked, "cursor": page["next_cursor"]}, {"subject": subject}):
        r = _replay(stack, page["receipt"], other)  # another page's parameters: not what this receipt is of
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "request", (other, r.text)
    for wrong, code, field in (({"limit": "2"}, "wrong_type", "limit"), ({"bogus": 1}, "unknown_field", "bogus")):
        r = _replay(stack, page["receipt"], {**asked, **wrong})  # the request's fields are named as a body's are
        detail = r.json()["detail"][0]
        assert r.status_code == 422 and (detail["code"], detail["field"]) == (code, f"request.{field}"), r.text


@pytest.mark.parametrize("mode", ["auto", "keyword", "exact"])
def test_replay_of_a_recall_asking_for_a_replaced_value_gives_the_same_answer(stack: Any, mode: str) -> None:
    """A recall after a supersession whose question names only the old value's words: the replay, as known at the
    receipt, also sees the old version among the index's candidates, and it must not answer with its successor."""
    subject = f"project:R3{mode}"
    old = _fact(subject, "deploy.cluster", "blue", f"r3-{mode}-1", entities=[subject], aliases=[])
    new = _fact(subject, "deploy.cluster", "green", f"r3-{mode}-2", entities=[subject], aliases=[])
    old["content"], new["content"] = "deploys to the cobalt cluster", "moved onto the jade cluster"
    stack.publish([old])
    stack.settle()
    stack.publish([new])
    stack.settle()
    for query in ("cobalt", f"cobalt cluster of {subject}", f"{subject} deploy.cluster", "jade cluster"):
        asked = {"subject": subject, "query": query, "mode": mode}
        answer = _recall(stack, **asked)
        replayed = _replay(stack, answer["receipt"], asked).json()
        assert replayed["same"] is True, (query, answer["hits"], replayed["replayed"]["hits"], replayed["parts"])
        assert [h["value"] for h in replayed["replayed"]["hits"]] == [h["value"] for h in answer["hits"]]
        assert all(h["value"] == "green" for h in answer["hits"]), answer["hits"]


@pytest.mark.parametrize("mode", ["auto", "exact"])
def test_replay_of_a_recall_is_the_same_after_a_backdated_write(stack: Any, mode: str) -> None:
    """A version observed before a receipt was issued but logged after it (an import of the past) supersedes the
    cited one as known at the receipt's time; the replay reads only what was logged below the receipt's positions,
    so the answer it signed comes back, whatever words the later-logged version has."""
    subject = f"project:R4{mode}"
    old = _fact(subject, "deploy.cluster", "blue", f"r4-{mode}-1", entities=[subject], aliases=[])
    old["content"] = "deploys to the cobalt cluster"
    stack.publish([old])
    stack.settle()
    asked = {"subject": subject, "query": "cobalt" if mode == "auto" else f"{subject} deploy.cluster", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["blue"], answer["hits"]
    began, issued = parse_rfc3339(answer["hits"][0]["valid_from"]), parse_rfc3339(answer["receipt"]["known_at"])
    when = rfc3339(began + (issued - began) / 2)
    new = _fact(subject, "deploy.cluster", "green", f"r4-{mode}-2", entities=[subject], aliases=[])
    new |= {"content": "moved onto the jade cluster", "observed_at": when, "valid_from": when}
    stack.publish([new])
    stack.settle()
    assert [h["value"] for h in _recall(stack, **{**asked, "query": f"{subject} deploy.cluster"})["hits"]] == ["green"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["blue"]


@pytest.mark.parametrize("as_of", ["2022-06-15T12:00:00.123000Z", "2022-06-15T12:00:00.123455Z"])
def test_replay_of_a_recall_inside_the_millisecond_before_a_version_began_is_the_same(stack: Any, as_of: str) -> None:
    """The index keeps times to the millisecond, so at an as_of in the millisecond before a version's microsecond
    start it proposes that version, and verification gives the one that held then (`verified.replaced_by`). The
    replay re-derives the same hits: `same`, whichever version the index proposed."""
    subject = f"project:R5{as_of[-4:-1]}"
    first = _fact(subject, "city", "Paris", f"r5-{as_of[-4:-1]}-1", entities=[], aliases=[])
    then = _fact(subject, "city", "Berlin", f"r5-{as_of[-4:-1]}-2", entities=[], aliases=[])
    first |= {"valid_from": "2020-01-01T00:00:00Z", "observed_at": "2020-01-01T00:00:00Z"}
    then |= {"valid_from": "2022-06-15T12:00:00.123456Z", "observed_at": "2022-06-15T12:00:00.123456Z"}
    stack.publish([first, then])
    stack.settle()
    for mode in ("auto", "exact"):
        asked = {"subject": subject, "query": "city", "mode": mode, "as_of": as_of}
        answer = _recall(stack, **asked)
        assert [h["value"] for h in answer["hits"]] == ["Paris"], (mode, answer["hits"])
        assert answer["hits"][0]["match"]["verified"].get("replaced_by"), answer["hits"][0]["match"]
        replayed = _replay(stack, answer["receipt"], asked).json()
        assert replayed["same"] is True, (mode, answer["hits"], replayed["replayed"]["hits"], replayed["parts"])


def test_replay_of_a_recall_with_context_turns_is_the_same_after_backdated_turns(stack: Any) -> None:
    """An import of the past after a receipt: a turn observed between the hit and its neighbour, a near-duplicate
    of the hit, and a retraction of the hit, all observed before the receipt was issued but logged after it. The
    replay's hit, its context turns and its duplicates are the ones signed."""
    subject, t0 = "person:r5", datetime.now(UTC) - timedelta(minutes=30)
    said = "Rhea: we anchored the sloop off the lighthouse at dawn"

    def turn(event_id: str, content: str, when: datetime, **fields: Any) -> MemoryEvent:
        return episode(subject, content, when, "r5-chat", tenant=TENANT, event_id=event_id, **fields)

    first = [turn("r5-0", "Rhea: the wind dropped after midnight", t0), turn("r5-1", said, t0 + timedelta(minutes=2))]
    stack.publish(first)
    stack.settle()
    asked = {"subject": subject, "query": "anchored the sloop off the lighthouse", "context_turns": 2}
    answer = _recall(stack, **asked)
    hit = answer["hits"][0]
    assert hit["event_id"] == "r5-1" and [c["content"] for c in hit["context"]] == [first[0].content], answer["hits"]
    later = [
        turn("r5-between", "Rhea: the fog came in over the bay", t0 + timedelta(minutes=1)),
        turn("r5-copy", said, t0 + timedelta(minutes=3)),
        MemoryEvent(type=EventType.RETRACTED, tenant=TENANT, subject=subject, target_version=first[1].version_id,
                    observed_at=t0 + timedelta(minutes=4), valid_from=t0 + timedelta(minutes=4)),
    ]  # fmt: skip
    stack.publish(later)
    stack.settle()
    now = _recall(stack, **asked)
    assert "r5-1" not in [h["event_id"] for h in now["hits"]], now["hits"]  # retracted as known now
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    again = replayed["replayed"]["hits"][0]
    assert [c["content"] for c in again["context"]] == [first[0].content], again
    assert again["match"].get("duplicates") == hit["match"].get("duplicates"), again


def test_relative_time_words_are_read_from_the_recalls_valid_time_and_replay_the_same(stack: Any) -> None:
    """ "yesterday" or "in the last 2 hours" is read from the recall's valid time (its as_of, else when it ran),
    which the receipt keeps: a recall as of a past time reads that time's yesterday, and a replay seconds later
    reads the same window (read from the clock, its cues differed)."""
    past = _recall(stack, query="what changed yesterday", as_of="2026-01-10T12:00:00Z")
    assert past["cues"]["time"] == {
        "words": "yesterday", "from": "2026-01-09T00:00:00.000000Z", "to": "2026-01-10T00:00:00.000000Z"
    }  # fmt: skip
    for query in ("what changed in the last 2 hours", "what changed yesterday"):
        asked = {"subject": SUBJECT, "query": query}
        answer = _recall(stack, **asked)
        time.sleep(1.1)
        replayed = _replay(stack, answer["receipt"], asked).json()
        assert replayed["same"] is True, (asked, replayed["parts"])
        assert replayed["replayed"]["cues"] == answer["cues"]


def test_replay_of_a_recall_before_a_supersession_gives_the_first_answer(stack: Any) -> None:
    subject = "project:R2"
    asked = {"subject": subject, "query": "R2 backend port"}
    stack.publish([_fact(subject, "project.port", 7001, "r2-port-1", entities=["R2"])])
    stack.settle()
    first = _recall(stack, **asked)
    facts = _get(stack, f"/v1/subjects/{subject}/facts").json()
    memory_id = first["hits"][0]["memory_id"]
    history = _get(stack, f"/v1/facts/{memory_id}/history").json()
    events = _get(stack, f"/v1/subjects/{subject}/events").json()
    assert [h["value"] for h in first["hits"]] == [7001]
    stack.publish([_fact(subject, "project.port", 7002, "r2-port-2", entities=["R2"])])  # supersedes it
    stack.settle()
    second = _recall(stack, **asked)
    assert [h["value"] for h in second["hits"]] == [7002]

    r = _replay(stack, first["receipt"], asked)
    assert r.status_code == 200, r.text
    replayed = r.json()
    assert replayed["same"] is True and replayed["identical"] is True, replayed["parts"]
    assert replayed["replayed"]["hits"] == first["hits"]
    assert {p["part"]: p["same"] for p in replayed["parts"]} == {"cues": True, "exact": True, "ranked": True}
    assert replayed["models_differ"] == []
    again = _replay(stack, second["receipt"], asked).json()
    # the second: the same, byte for byte, its `access` score too: how often a hit was served is no part of the
    # ledger, and its receipt carries the access signals its answer was ordered by (`served`)
    assert again["same"] is True and [h["value"] for h in again["replayed"]["hits"]] == [7002]
    assert again["identical"] is True

    for answer, request in (
        (facts, {"subject": subject}),
        (history, {"memory_id": memory_id}),
        (events, {"subject": subject}),
    ):
        kind = answer["receipt"]["answer"]
        r = _replay(stack, answer["receipt"], request)
        assert r.status_code == 200, r.text
        assert r.json()["same"] is True, (kind, r.json()["parts"])
    now = _get(stack, f"/v1/subjects/{subject}/facts").json()  # the answer now is not the first
    assert now["receipt"]["answer_digest"] != facts["receipt"]["answer_digest"]

    # other parameters than the receipt's: refused, naming the request
    r = _replay(stack, first["receipt"], {**asked, "query": "R2 frontend port"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "request"
    # a forged receipt is not replayed
    forged = {**first["receipt"], "known_at": second["receipt"]["known_at"]}
    r = _replay(stack, forged, asked)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "receipt.signature"


@pytest.mark.parametrize("scoped", [True, False])
def test_replay_of_a_recall_reads_its_question_with_the_vocabulary_of_its_positions(stack: Any, scoped: bool) -> None:
    """A name the question holds became known after the receipt (a fact listing it was written since): the replay
    read the question with today's vocabulary, so its cues differed and an honest receipt failed its replay. It reads
    it with the vocabulary of the versions logged below the receipt's positions."""
    name, subject = f"vzeta{int(scoped)}", f"project:RV{int(scoped)}"
    asked = {"query": f"what does {name} like?", "subject": subject if scoped else None}
    first = _recall(stack, **asked)
    assert first["cues"]["known_entities"] == [], first["cues"]
    stack.publish([_fact(subject, "preference.food", "figs", f"rv-{int(scoped)}", entities=[name], aliases=[])])
    stack.settle()
    second = _recall(stack, **asked)
    assert second["cues"]["known_entities"] == [name], second["cues"]
    r = _replay(stack, first["receipt"], asked)
    assert r.status_code == 200, r.text
    replayed = r.json()
    assert replayed["same"] is True and replayed["identical"] is True, replayed["parts"]
    assert replayed["replayed"]["cues"] == first["cues"]
    again = _replay(stack, second["receipt"], asked).json()  # and the later one with the name known
    assert again["same"] is True and again["replayed"]["cues"]["known_entities"] == [name], again["parts"]


@pytest.mark.parametrize("mode", ["auto", "keyword"])
def test_replay_of_a_recall_of_a_fact_with_more_earlier_versions_than_the_pool_gives_its_answer(
    stack: Any, mode: str
) -> None:
    """A fact with more earlier versions than a stage's candidate pool (LEDGER_RECALL_POOL), each matching the
    question better than the one in force: the read saw only the version in force, and its replay, as known at
    the receipt, must not let the versions ended by then crowd that one out of its candidates."""
    subject = f"project:R6{mode}"
    pool = stack.settings.recall_pool
    began = datetime(2020, 1, 1, tzinfo=UTC)
    versions = []
    for n in range(pool + 5):
        fact = _fact(subject, "deploy.cluster", f"c{n}", f"r6-{mode}-{n}", entities=[subject], aliases=[])
        fact["valid_from"] = rfc3339(began + timedelta(hours=n))
        fact["content"] = "cobalt cluster cobalt cluster cobalt cluster" if n < pool + 4 else "cobalt cluster"
        versions.append(fact)
    stack.publish(versions)
    stack.settle()
    asked = {"subject": subject, "query": "cobalt cluster", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == [f"c{pool + 4}"], answer["hits"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == [f"c{pool + 4}"]


@pytest.mark.parametrize("mode", ["auto", "keyword", "exact"])
def test_replay_of_a_recall_answered_by_a_version_observed_ahead_of_the_clock_gives_its_answer(
    stack: Any, mode: str
) -> None:
    """A version observed a little in the future (inside the contract's skew) answers a recall as known now; its
    receipt was issued before that observed time, yet the version is below its positions, so the replay knows it."""
    subject = f"project:R7{mode}"
    now = datetime.now(UTC)
    old = _fact(subject, "deploy.cluster", "c-old", f"r7-{mode}-1", entities=[subject], aliases=[])
    new = _fact(subject, "deploy.cluster", "c-new", f"r7-{mode}-2", entities=[subject], aliases=[])
    old |= {"content": "the deploy cluster is cobalt", "valid_from": rfc3339(now - timedelta(days=2))}
    old["observed_at"] = old["valid_from"]
    new |= {"content": "the deploy cluster is cobalt", "valid_from": rfc3339(now - timedelta(hours=1))}
    new["observed_at"] = rfc3339(now + timedelta(seconds=120))
    stack.publish([old, new])
    stack.settle()
    query = f"{subject} deploy.cluster" if mode == "exact" else "deploy cluster cobalt"
    asked = {"subject": subject, "query": query, "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["c-new"], answer["hits"]
    assert parse_rfc3339(answer["receipt"]["known_at"]) < parse_rfc3339(new["observed_at"])
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["c-new"]


@pytest.mark.parametrize("mode", ["auto", "keyword"])
def test_replay_of_a_recall_is_the_same_after_more_backdated_versions_than_the_pool(stack: Any, mode: str) -> None:
    """More versions than a stage's candidate pool, each matching the question better than the one that answered,
    observed before the receipt but logged after its positions: the replay reads only what was logged below them,
    so they cannot crowd the answer out of its candidates."""
    subject = f"project:R8{mode}"
    pool = stack.settings.recall_pool
    began = datetime(2022, 1, 1, tzinfo=UTC)
    observed = rfc3339(datetime.now(UTC) - timedelta(days=1))
    first = []
    for n in range(3):
        fact = _fact(subject, "deploy.cluster", f"c{n}", f"r8-{mode}-{n}", entities=[subject], aliases=[])
        first.append(fact | {"content": "cobalt cluster", "valid_from": rfc3339(began + timedelta(days=n))})
        first[-1]["observed_at"] = observed
    stack.publish(first)
    stack.settle()
    asked = {"subject": subject, "query": "cobalt cluster", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["c2"], answer["hits"]
    late = []
    for n in range(pool + 1):  # between c1 and c2, observed an hour before the others
        fact = _fact(subject, "deploy.cluster", f"l{n}", f"r8-{mode}-late-{n}", entities=[subject], aliases=[])
        fact["content"] = "cobalt cluster cobalt cluster cobalt cluster"
        fact["valid_from"] = rfc3339(began + timedelta(days=1, minutes=n + 1))
        fact["observed_at"] = rfc3339(datetime.now(UTC) - timedelta(days=1, hours=1))
        late.append(fact)
    stack.publish(late)
    stack.settle()
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["c2"]


@pytest.mark.parametrize("by", ["target", "time", "time-override-later"])
def test_replay_of_a_recall_after_a_retraction_asks_the_next_stage_as_its_read_did(stack: Any, by: str) -> None:
    """A fact retracted before the read: the read's exact stage found nothing holding and the fuzzy stages answered
    with another fact. As known then, the exact stage also proposes the retracted version: it must not answer
    with it (to be dropped later, leaving nothing), but find nothing and ask the next stage, as the read did; and a
    recall as known now, asked with known_at, answers as the read without it."""
    subject = f"project:R9{by}"
    url = _fact(subject, "api.url", "u1", f"r9-{by}-url", entities=[subject], aliases=[])
    name = _fact(subject, "api.key", "k1", f"r9-{by}-key", entities=[subject], aliases=[])
    url["content"], name["content"] = "api url is u1", "api key name is k1"
    url["valid_from"] = name["valid_from"] = "2025-01-01T00:00:00Z"
    later = []
    if by == "time-override-later":  # an override of the fact, but not in force when the retraction ended it
        later = [_fact(subject, "api.url", "u9", f"r9-{by}-ovr", entities=[subject], aliases=[], kind="preference")]
        later[0] |= {"valid_from": "2025-06-01T00:00:00Z", "valid_to": "2025-06-10T00:00:00Z", "content": "v9"}
    stack.publish([url, name, *later])
    stack.settle()
    retraction = {k: url[k] for k in ("tenant", "subject", "key")} | {"type": "memory.retracted"}
    retraction["event_id"] = f"r9-{by}-no"
    if by == "target":
        retraction["target_version"] = _recall(stack, subject=subject, query="api url")["hits"][0]["version_id"]
    retraction["valid_from"] = "2025-02-01T00:00:00Z"
    stack.publish([retraction])
    stack.settle()
    asked = {"subject": subject, "query": "what is the api url?", "as_of": "2025-04-01T00:00:00Z"}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["k1"], answer["hits"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["k1"]
    assert replayed["replayed"]["trace"]["known_at"] is None  # a replay knows what its positions hold
    known = _recall(stack, **asked, known_at=rfc3339(datetime.now(UTC)))
    assert [h["value"] for h in known["hits"]] == ["k1"], known["hits"]


def test_an_override_a_retraction_by_time_ended_does_not_stand_for_its_fact_as_known_then(stack: Any) -> None:
    """A retraction by time ends the version visible then: an override in force then, not the long-term value. As
    known then, the ended override must not be the fact's version, or the long-term value's hit is dropped."""
    subject = "user:r12"
    tea = _fact(subject, "pref.drink", "tea", "r12-tea", entities=[], aliases=[], kind="preference")
    tea |= {"content": "drinks green tea", "valid_from": "2025-01-01T00:00:00Z"}
    coffee = _fact(subject, "pref.drink", "coffee", "r12-coffee", entities=[], aliases=[], kind="preference")
    coffee |= {"content": "drinks coffee", "valid_from": "2025-03-01T00:00:00Z", "valid_to": "2025-03-31T00:00:00Z"}
    retraction = {"type": "memory.retracted", "tenant": TENANT, "event_id": "r12-no", "subject": subject}
    retraction |= {"key": "pref.drink", "valid_from": "2025-03-10T00:00:00Z"}
    stack.publish([tea, coffee, retraction])
    stack.settle()
    asked = {"subject": subject, "query": "green tea", "as_of": "2025-03-20T00:00:00Z"}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["tea"], answer["hits"]
    known = _recall(stack, **asked, known_at=rfc3339(datetime.now(UTC)))
    assert [h["value"] for h in known["hits"]] == ["tea"], known["hits"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])


@pytest.mark.parametrize("mode", ["auto", "keyword"])
def test_a_recall_answered_through_an_override_in_force_replays_the_same(stack: Any, mode: str) -> None:
    """The question matches the long-term value's words while an override is in force: the fact answers with the
    override (`replaced_by`), as known now, as known then, and in the replay, which the long-term value's candidate
    speaks for as it did for the read (it held then too)."""
    subject = f"user:r13{mode}"
    tea = _fact(subject, "pref.drink", "tea", f"r13-{mode}-tea", entities=[], aliases=[], kind="preference")
    tea |= {"content": "user drinks green tea every morning", "valid_from": "2025-01-01T00:00:00Z"}
    coffee = _fact(subject, "pref.drink", "coffee", f"r13-{mode}-coffee", entities=[], aliases=[], kind="preference")
    coffee |= {"content": "black coffee this month", "valid_from": "2025-03-01T00:00:00Z"}
    coffee["valid_to"] = "2025-03-31T00:00:00Z"
    stack.publish([tea, coffee])
    stack.settle()
    asked = {"subject": subject, "query": "green tea", "as_of": "2025-03-15T00:00:00Z", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["coffee"], answer["hits"]
    known = _recall(stack, **asked, known_at=rfc3339(datetime.now(UTC)))
    assert [h["value"] for h in known["hits"]] == ["coffee"], known["hits"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])


def test_a_recall_at_the_millisecond_an_override_ended_replays_the_same(stack: Any) -> None:
    """An override retracted by time at its own start, asked at that instant: the index proposes it (its end lies in
    the millisecond asked), so the read answered its fact; as known then and in the replay, it speaks the same."""
    subject = "user:r14"
    tea = _fact(subject, "pref.drink", "tea", "r14-tea", entities=[], aliases=[], kind="preference")
    tea |= {"content": "user drinks green tea every morning", "valid_from": "2025-01-01T00:00:00Z"}
    coffee = _fact(subject, "pref.drink", "coffee", "r14-coffee", entities=[], aliases=[], kind="preference")
    coffee |= {"content": "black coffee this month", "valid_from": "2025-03-01T00:00:00Z"}
    coffee["valid_to"] = "2025-03-31T00:00:00Z"
    retraction = {"type": "memory.retracted", "tenant": TENANT, "event_id": "r14-no", "subject": subject}
    retraction |= {"key": "pref.drink", "valid_from": "2025-03-01T00:00:00Z"}
    stack.publish([tea, coffee, retraction])
    stack.settle()
    asked = {"subject": subject, "query": "black coffee", "as_of": "2025-03-01T00:00:00Z", "mode": "keyword"}
    answer = _recall(stack, **asked)
    known = _recall(stack, **asked, known_at=rfc3339(datetime.now(UTC)))
    assert [h["value"] for h in known["hits"]] == [h["value"] for h in answer["hits"]], (known["hits"], answer)
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (answer["hits"], replayed["replayed"]["hits"], replayed["parts"])


@pytest.mark.parametrize("mode", ["auto", "exact"])
def test_replay_of_an_exact_recall_is_the_same_after_more_late_versions_than_its_ask(stack: Any, mode: str) -> None:
    """The exact ask (from PostgreSQL: entity and key) reads a bounded number of versions, latest first: versions of
    the fact valid since it began and logged after a receipt must not fill it in the receipt's replay."""
    subject = f"project:R11{mode}"
    first = _fact(subject, "api.url", "u1", f"r11-{mode}-1", entities=[subject], aliases=[])
    first |= {"content": "api url is u1", "valid_from": "2025-01-01T00:00:00Z"}
    stack.publish([first])
    stack.settle()
    asked = {"subject": subject, "query": f"what is the api.url of {subject}?", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["u1"], answer["hits"]
    late = []
    for n in range(25):
        fact = _fact(subject, "api.url", f"l{n}", f"r11-{mode}-late-{n}", entities=[subject], aliases=[])
        late.append(fact | {"content": f"api url is l{n}", "valid_from": f"2025-02-{n + 1:02d}T00:00:00Z"})
    stack.publish(late)
    stack.settle()
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["u1"]


@pytest.mark.parametrize("mode", ["keyword", "semantic"])
def test_replay_of_a_recall_is_the_same_beside_more_ended_facts_than_the_pool(stack: Any, mode: str) -> None:
    """More facts than a stage's candidate pool, each ended by its own asserted valid_to before the recall's time
    and matching the question better than the fact in force: the read never saw them, nor may its replay."""
    subject = f"project:R10{mode}"
    pool = stack.settings.recall_pool
    ended = []
    for n in range(pool + 10):
        fact = _fact(subject, f"old.codename.{n}", f"a{n}", f"r10-{mode}-{n}", entities=[subject], aliases=[])
        fact |= {"content": f"launch codename alpha alpha alpha launch codename {n}"}
        fact |= {"valid_from": "2025-01-01T00:00:00Z", "valid_to": "2025-06-01T00:00:00Z"}
        ended.append(fact)
    live = _fact(subject, "codename", "zeta", f"r10-{mode}-live", entities=[subject], aliases=[])
    live |= {"content": "the current launch codename is zeta", "valid_from": "2025-07-01T00:00:00Z"}
    stack.publish([*ended, live])
    stack.settle()
    asked = {"subject": subject, "query": "launch codename alpha", "mode": mode}
    answer = _recall(stack, **asked)
    assert [h["value"] for h in answer["hits"]] == ["zeta"], answer["hits"]
    replayed = _replay(stack, answer["receipt"], asked).json()
    assert replayed["same"] is True, (replayed["replayed"]["hits"], replayed["parts"])
    assert [h["value"] for h in replayed["replayed"]["hits"]] == ["zeta"]


def test_replay_of_a_recall_whose_ties_were_ordered_by_access_gives_its_answer(stack: Any) -> None:
    """The class: how often a fact was served is not in the ledger, so a replay (as known then) ordered the hits the
    other signals left equal by version id where the recall had ordered them by access, and such a recall never
    replayed the same. Its receipt carries the access signals that ordered it (`served`: ids and numbers), and the
    replay orders by them: the same hits, in the same order, byte for byte."""
    subject = "project:R7"
    text = "the quokka ledger probe tie phrase"
    stack.publish([_fact(subject, f"tie.0{n}", n, f"r7-{n}", entities=[], aliases=[], content=text) for n in range(3)])
    stack.settle()
    asked = {"subject": subject, "query": "quokka ledger probe tie phrase", "mode": "keyword", "top_k": 1}
    [unserved] = _recall(stack, **asked)["hits"]  # ties in version id order: nothing was served yet
    facts = _get(stack, f"/v1/subjects/{subject}/facts").json()["facts"]
    other = next(f for f in facts if f["memory_id"] != unserved["memory_id"])
    for _ in range(4):  # an exact recall serves it
        assert [h["memory_id"] for h in _recall(stack, subject=subject, query=other["key"])["hits"]] == [
            other["memory_id"]
        ]

    def counted() -> bool:
        with pg(stack.settings) as conn:
            row = conn.execute(
                "SELECT accesses FROM access_counts WHERE tenant = %s AND memory_id = %s", (TENANT, other["memory_id"])
            ).fetchone()
        return row is not None and row[0] >= 4

    deadline = time.monotonic() + 60
    while not counted():
        assert time.monotonic() < deadline, "the accesses were never projected"
        time.sleep(0.2)
    served = _recall(stack, **asked)
    assert [h["memory_id"] for h in served["hits"]] == [other["memory_id"]], served["hits"]  # access broke the tie
    assert served["receipt"].get("served", {}).get(other["memory_id"], 0) > 0, served["receipt"]
    assert _verify(stack, served["receipt"], served).json()["valid"] is True
    r = _replay(stack, served["receipt"], asked)
    assert r.status_code == 200, r.text
    replayed = r.json()
    assert replayed["same"] is True and replayed["identical"] is True, replayed["parts"]
    assert replayed["replayed"]["hits"] == served["hits"]


def test_an_erased_cited_version_verifies_as_erased_showing_nothing(stack: Any) -> None:
    facts = _get(stack, f"/v1/subjects/{GONE}/facts").json()
    receipt = facts["receipt"]
    memory_id = facts["facts"][0]["memory_id"]
    chain = _get(stack, f"/v1/facts/{memory_id}/history").json()["receipt"]
    assert [c["state"] for c in _verify(stack, receipt).json()["cited"]] == ["held"]
    r = stack.client.delete(f"/v1/subjects/{GONE}", params={"tenant": TENANT}, headers=H)
    assert r.status_code == 202, r.text
    stack.settle()
    assert _get(stack, f"/v1/subjects/{GONE}/facts").json()["facts"] == []
    r = _verify(stack, receipt)
    assert r.status_code == 200, r.text
    checked = r.json()
    assert checked["valid"] is True and checked["erased"] == 1
    (c,) = checked["cited"]
    assert c["state"] == "erased" and c["detail"].startswith("erased at "), c
    assert "partition" in c["detail"]
    text = r.text
    assert "ann@example.com" not in text and GONE not in text and "contact.email" not in text
    # its replay re-derives what the ledger holds now: nothing
    replayed = _replay(stack, receipt, {"subject": GONE}).json()
    assert replayed["same"] is False and replayed["replayed"]["facts"] == []
    details = {p["detail"] for p in replayed["parts"] if p["same"] is False}  # why, not only that it differs
    assert details == {"differs: 1 of the 1 versions it cited were erased since (verify it for when)"}, replayed
    r = _replay(stack, chain, {"memory_id": memory_id})  # the fact's history too: no version left, not a 404
    assert r.status_code == 200 and r.json()["same"] is False and r.json()["replayed"]["versions"] == [], r.text


def test_an_erased_subjects_audit_replay_receipt_verifies_every_event_erased(stack: Any) -> None:
    """An audit replay cites every event of its subject, assertions or not; once the subject is erased, each of them
    verifies `erased` (a confirmation or a retraction too, which make no version of their own), and the receipt is
    valid."""
    subject = "user:r10"
    fact = _fact(subject, "contact.phone", "555-0100", "r10-phone", entities=[], aliases=[])
    gone = _fact(subject, "contact.fax", "555-0199", "r10-fax", entities=[], aliases=[])
    confirmed = {k: fact[k] for k in ("tenant", "subject", "key")} | {"type": "memory.confirmed", "event_id": "r10-ok"}
    retracted = {k: gone[k] for k in ("tenant", "subject", "key")} | {"type": "memory.retracted", "event_id": "r10-no"}
    stack.publish([fact, gone])
    stack.settle()
    stack.publish([confirmed, retracted])
    stack.settle()
    events = _get(stack, f"/v1/subjects/{subject}/events").json()
    assert [e["type"] for e in events["events"]] == [
        "memory.asserted",
        "memory.asserted",
        "memory.confirmed",
        "memory.retracted",
    ], events["events"]
    r = stack.client.delete(f"/v1/subjects/{subject}", params={"tenant": TENANT}, headers=H)
    assert r.status_code == 202, r.text
    stack.settle()
    checked = _verify(stack, events["receipt"]).json()
    assert [c["state"] for c in checked["cited"]] == ["erased"] * 4, checked
    assert checked["valid"] is True and checked["erased"] == 4, checked


def test_another_tenants_receipt_is_refused(stack: Any) -> None:
    theirs = _get(stack, f"/v1/subjects/{SUBJECT}/facts", tenant=OTHER).json()["receipt"]
    ours = _get(stack, f"/v1/subjects/{SUBJECT}/facts").json()["receipt"]
    # a key of both tenants, naming the other tenant than the receipt's: 404, nothing said about it
    for path, extra in (("/v1/receipts/verify", {}), ("/v1/receipts/replay", {"request": {"subject": SUBJECT}})):
        r = _post(stack, path, {"tenant": TENANT, "receipt": theirs, **extra})
        assert r.status_code == 404 and r.json()["detail"][0]["code"] == "not_found", r.text
        # a key of the other tenant only: ours is refused, naming the tenant (403) or as not its own (404)
        r = _post(stack, path, {"tenant": TENANT, "receipt": ours, **extra}, H_OTHER)
        assert r.status_code == 403 and r.json()["detail"][0]["code"] == "forbidden_tenant", r.text
        r = _post(stack, path, {"tenant": OTHER, "receipt": ours, **extra}, H_OTHER)
        assert r.status_code == 404, r.text
        # a receipt with its tenant changed is another tenant's: its signature no longer holds
        r = _post(stack, path, {"tenant": OTHER, "receipt": {**ours, "tenant": OTHER}, **extra}, H_OTHER)
        assert r.status_code in (200, 422), r.text
        if r.status_code == 200:
            assert r.json().get("valid") is False
    assert _verify(stack, theirs, headers=H_OTHER).json()["valid"] is True


def _signed_by(receipt: dict[str, Any], signer: ChainSigner) -> dict[str, Any]:
    """`receipt` signed as this service signs, by `signer` (its public key and id named in it)."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    body |= {"key_id": signer.key_id, "public_key": base64.b64encode(signer.public).decode()}
    signature = signer.sign(b"memory-ledger receipt v1\n" + canonical(body))
    return body | {"signature": base64.b64encode(signature).decode()}


def test_a_replay_takes_only_a_receipt_this_ledger_signed(stack: Any) -> None:
    """Whoever writes a receipt (unsigned, signed by a key of their own, or another tenant's relabelled as theirs)
    gets the same 422 naming the signature, whatever the parameters: a replay would otherwise answer whether a
    guessed subject is the one the receipt's keyed request digest was made of, for another tenant's receipt too.
    A receipt of another shape is never a server error. The ledger's own receipt replays."""
    ours = _get(stack, f"/v1/subjects/{SUBJECT}/facts").json()["receipt"]
    theirs = _get(stack, f"/v1/subjects/{SUBJECT}/facts", tenant=OTHER).json()["receipt"]
    stranger = ChainSigner.of_pem(new_signing_key(), "a key of the caller's own")
    relabelled = {**theirs, "tenant": TENANT}
    forged = {
        "unsigned": {**ours, "signature": None},
        "self-signed": _signed_by(ours, stranger),
        "relabelled, unsigned": {**relabelled, "signature": None},
        "relabelled, self-signed": _signed_by(relabelled, stranger),
        "altered": {**ours, "as_of": None},
        "altered, unsigned": {**ours, "as_of": None, "signature": None},
    }
    for name, receipt in forged.items():
        answers = set()
        for guess in (SUBJECT, "project:R0"):
            body = {"tenant": TENANT, "receipt": receipt, "request": {"subject": guess}}
            r = _post(stack, "/v1/receipts/replay", body)
            assert r.status_code == 422, (name, r.text)
            (item,) = r.json()["detail"]
            answers.add((item["code"], item["field"], item["message"]))
        assert len(answers) == 1 and next(iter(answers))[1] == "receipt.signature", (name, answers)
    r = _post(stack, "/v1/receipts/replay", {"tenant": TENANT, "receipt": ours, "request": {"subject": SUBJECT}})
    assert r.status_code == 200 and r.json()["same"] is True, r.text


def test_receipts_of_reads_taken_while_their_subject_is_written_replay_the_same(stack: Any) -> None:
    """While a producer writes to a subject (a new fact every ~30 ms), its facts, history and audit replay are read
    and each receipt replayed: every one is `same`. A receipt names the positions its answer was read at, in the
    answer's own snapshot; positions read after it would take in a write the answer did not show, and its honest
    receipt would replay as changed."""
    subject = "project:busy"
    first = _fact(subject, "k0", 0, "busy-0")
    stack.publish([first])
    stack.settle()
    memory_id = _get(stack, f"/v1/subjects/{subject}/facts").json()["facts"][0]["memory_id"]
    stop = threading.Event()

    def write() -> None:
        with LedgerProducer(stack.settings) as producer:
            n = 0
            while not stop.is_set():
                n += 1
                producer.publish_many([_fact(subject, f"k{n % 5}", n, f"busy-{n}")])
                time.sleep(0.03)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reads = {
        "facts": (f"/v1/subjects/{subject}/facts", {"subject": subject}),
        "history": (f"/v1/facts/{memory_id}/history", {"memory_id": memory_id}),
        "events": (f"/v1/subjects/{subject}/events", {"subject": subject}),
    }
    differed, replayed = [], 0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for name, (path, request) in reads.items():
                receipt = _get(stack, path).json()["receipt"]
                body = {"tenant": TENANT, "receipt": receipt, "request": request}
                r = _post(stack, "/v1/receipts/replay", body)
                assert r.status_code == 200, r.text
                replayed += 1
                if not r.json()["same"]:
                    differed.append(name)
    finally:
        stop.set()
        writer.join(10)
    stack.settle()
    assert replayed >= 15 and not differed, (replayed, differed)


def test_a_recall_as_known_then_shows_nothing_its_receipt_s_positions_leave_out(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall as known at a time reads the fold of each hit's fact after the engine's verification, which read the
    receipt's positions: a retraction applied between the two was shown (the hit's end) though its record lies past
    the positions, and the receipt replayed as changed. Here the retraction is applied just then, every time."""
    subject, t0 = "project:raced", datetime(2026, 2, 1, 12, 0, 0, 777400, tzinfo=UTC)
    stack.publish([_fact(subject, "project.port", 7401, "raced-1", entities=["RC1"], valid_from=rfc3339(t0),
                         observed_at=rfc3339(t0))])  # fmt: skip
    stack.settle()
    retraction = {
        "type": "memory.retracted", "tenant": TENANT, "event_id": "raced-r", "subject": subject, "key": "project.port",
        "valid_from": rfc3339(t0 + timedelta(microseconds=300)),
        "observed_at": rfc3339(t0 + timedelta(microseconds=400)),
    }  # fmt: skip
    engine = stack.client.app.state.resources.recall
    verified = engine.recall

    async def then_retracted(*args: Any, **kwargs: Any) -> Any:
        answer = await verified(*args, **kwargs)
        await asyncio.to_thread(lambda: (stack.publish([retraction]), stack.caught_up()))
        return answer

    monkeypatch.setattr(engine, "recall", then_retracted)
    asked = {"subject": subject, "query": "RC1 project port", "mode": "exact"}
    at = {"as_of": rfc3339(t0 + timedelta(microseconds=100)), "known_at": rfc3339(t0 + timedelta(microseconds=500))}
    answer = _recall(stack, **asked, **at)
    monkeypatch.undo()
    assert [(h["value"], h["valid_to"]) for h in answer["hits"]] == [(7401, None)], answer["hits"]
    r = _replay(stack, answer["receipt"], {**asked, **at})
    assert r.status_code == 200 and r.json()["same"] is True, r.json()["parts"]


def test_a_replays_parameters_are_judged_as_their_reads_route_judges_them(stack: Any) -> None:
    """Parameters that are not a read's: the error its own route gives (the caller's path, text counted in
    characters, a time's own code), under `request`."""
    receipt = _recall(stack)["receipt"]
    for request, field, code, words in (
        ({"query": "q", "filters": {"tags": [1]}}, "request.filters.tags", "wrong_type", "string"),
        ({"query": "q", "subject": "中" * 257}, "request.subject", "invalid_value", "257"),
        ({"query": "q", "as_of": "2026-01-01T00:00:00+24:00"}, "request.as_of", "invalid_time", "offset"),
    ):
        r = _replay(stack, receipt, request)
        assert r.status_code == 422, r.text
        item = r.json()["detail"][0]
        assert (item["field"], item["code"]) == (field, code) and words in item["message"], item
        assert "items" not in item["message"] and "Value error" not in item["message"], item


def test_a_replays_request_naming_another_tenant_is_refused_not_ignored(stack: Any) -> None:
    """The request's `tenant` may be left out or name the replay's; another one, the key's or not, is refused naming
    `request.tenant` (a tenant a request names is never silently read as another)."""
    receipt, asked = _recall(stack)["receipt"], {"subject": SUBJECT, "query": "R1 backend port"}
    for named, status, code in ((OTHER, 422, "invalid_value"), ("not-a-tenant", 403, "forbidden_tenant")):
        r = _replay(stack, receipt, {**asked, "tenant": named})
        assert r.status_code == status, r.text
        (item,) = r.json()["detail"]
        assert (item["field"], item["code"]) == ("request.tenant", code), item
    for request in (asked, {**asked, "tenant": TENANT}):
        r = _replay(stack, receipt, request)
        assert r.status_code == 200 and r.json()["same"], r.text


def test_a_cited_place_of_another_tenants_event_reads_as_an_empty_one(stack: Any) -> None:
    """A receipt of this tenant citing the place of another tenant's event learns nothing of it: the same state and
    detail as a place where the ledger holds no event, while its own event's place still reads held."""
    theirs = _get(stack, f"/v1/subjects/{SUBJECT}/facts", tenant=OTHER).json()["receipt"]
    ours = _get(stack, f"/v1/subjects/{SUBJECT}/facts").json()["receipt"]
    place = {k: theirs["cited"][0][k] for k in ("partition", "offset")}
    forged = {**ours, "cited": [{**ours["cited"][0], **place}]}
    r = _verify(stack, forged)
    assert r.status_code == 200, r.text
    (check,) = r.json()["cited"]
    assert (check["state"], check["detail"]) == ("missing", "the ledger holds no such event at that place"), check
    (own,) = _verify(stack, ours).json()["cited"]
    assert own["state"] == "held", own


def test_the_mcp_tools_verify_and_replay(stack: Any) -> None:
    asyncio.run(_mcp_tools(stack, _recall(stack)))


async def _mcp_tools(stack: Any, first: dict[str, Any]) -> None:
    tools = {t.name: t for t in TOOLS}
    async with Resources.open(stack.settings, warm_embedder=False) as res:
        tenants = frozenset(KEYS[KEY])
        done = await run_tool(tools["verify_receipt"], res, tenants, {"tenant": TENANT, "receipt": first["receipt"]})
        assert not done.is_error and done.structured_content["valid"] is True
        ask = {"subject": SUBJECT, "query": "R1 backend port"}
        done = await run_tool(
            tools["replay_receipt"], res, tenants, {"tenant": TENANT, "receipt": first["receipt"], "request": ask}
        )
        assert not done.is_error and done.structured_content["same"] is True
        done = await run_tool(
            tools["verify_receipt"], res, frozenset(KEYS[OTHER_KEY]), {"tenant": TENANT, "receipt": first["receipt"]}
        )
        assert done.is_error and orjson.loads(done.content[0].text)["status"] == 403
        recalled = await run_tool(tools["recall"], res, tenants, {"tenant": TENANT, "query": "R1 backend port"})
        assert recalled.structured_content["receipt"]["answer"] == "recall"
        # a page the MCP door bounded by its default replays with the request as it was sent, the default left out
        facts = await run_tool(tools["facts"], res, tenants, {"tenant": TENANT, "subject": SUBJECT})
        memory_id = facts.structured_content["facts"][0]["memory_id"]
        history = await run_tool(tools["fact_history"], res, tenants, {"tenant": TENANT, "memory_id": memory_id})
        for read, ask in ((facts, {"subject": SUBJECT}), (history, {"memory_id": memory_id})):
            receipt = read.structured_content["receipt"]
            done = await run_tool(
                tools["replay_receipt"], res, tenants, {"tenant": TENANT, "receipt": receipt, "request": ask}
            )
            assert not done.is_error and done.structured_content["same"] is True, done.content
            other = {**ask, "limit": 7}  # another page is still not the receipt's request
            done = await run_tool(
                tools["replay_receipt"], res, tenants, {"tenant": TENANT, "receipt": receipt, "request": other}
            )
            assert done.is_error and "not the parameters" in done.content[0].text, done.content


def test_a_link_changed_in_postgres_fails_the_receipt_and_ledger_verify(stack: Any) -> None:
    receipt = _get(stack, f"/v1/subjects/{SUBJECT}/facts").json()["receipt"]
    (c,) = receipt["cited"]
    settings = stack.settings
    assert verify(settings).intact
    with pg(settings) as conn:
        conn.execute(
            'UPDATE chain_links SET link = sha256(link) WHERE consumer = %s AND topic = %s AND "partition" = %s '
            'AND "offset" = %s',
            (settings.processor_group, settings.topic, c["partition"], c["offset"]),
        )
    try:
        checked = _verify(stack, receipt).json()
        assert checked["valid"] is False and checked["cited"][0]["state"] == "differs", checked
        assert "link" in checked["cited"][0]["detail"]
        report = verify(settings)
        assert not report.intact
        first = report.first
        assert first is not None and (first.kind, first.partition, first.offset) == (
            "chain",
            c["partition"],
            c["offset"],
        )
    finally:
        with pg(settings) as conn:  # put it back for the other tests
            conn.execute(
                'UPDATE chain_links SET link = %s WHERE consumer = %s AND topic = %s AND "partition" = %s '
                'AND "offset" = %s',
                (bytes.fromhex(c["link"]), settings.processor_group, settings.topic, c["partition"], c["offset"]),
            )


def test_a_recall_receipt_is_read_with_the_answer_and_means_what_its_own_read_would(stack: Any) -> None:
    """The class: a receipt that costs recall a read of its own (a second pool checkout after the answer). Counted on
    the real pool, a recall with its receipt checks out as often as one without; its receipt is the one the receipt's
    own read (api.receipts.issue without a basis) makes of the same answer, its positions cover what it cites, and
    it verifies. A recall as known at a time (its hits re-read apart) still gets a receipt that verifies."""
    asyncio.run(_read_with_the_answer(stack))


async def _read_with_the_answer(stack: Any) -> None:
    from api import reads, receipts
    from api.requests import RecallBody
    from producers.consistency import decode_token

    stack.publish([_fact("project:R5", "project.host", "r5.example", "r5-host-1", entities=["R1", "R5"])])
    stack.settle()
    tenants = frozenset(KEYS[KEY])
    async with Resources.open(stack.settings, warm_embedder=False) as res:
        checkouts = 0
        connection = res.pool.connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal checkouts
            checkouts += 1
            return connection(*args, **kwargs)

        res.pool.connection = counted  # type: ignore[method-assign]  # the real pool, its checkouts counted
        for mode in ("exact", "hybrid", "auto"):
            ask = RecallBody(tenant=TENANT, query="R1", mode=mode, top_k=10)
            await reads.recall(res, tenants, ask, record=False)  # warm: the vocabulary loaded once
            used = {}
            for want in (False, True, False, True):
                checkouts = 0
                answer = await reads.recall(res, tenants, ask.model_copy(update={"receipt": want}), record=False)
                used[want] = checkouts
            assert used[True] == used[False], (mode, used)
            receipt = answer["receipt"]
            cited = [h["event_id"] for h in answer["hits"]]
            assert len(receipt["cited"]) == len(set(cited)) >= 2, (mode, answer["hits"])
            own = await receipts.issue(
                res,
                "recall",
                TENANT,
                {k: v for k, v in answer.items() if k != "receipt"},
                receipts.request_fields("recall", ask),
                cited,
                as_of=answer["trace"]["as_of"],
                ranked=True,
            )
            volatile = ("issued_at", "as_of", "known_at", "signature", "positions", "served")  # "now"; served: grows
            assert {k: v for k, v in receipt.items() if k not in volatile} == {
                k: v for k, v in own.items() if k not in volatile
            }, mode
            positions = decode_token(receipt["positions"])
            for c in receipt["cited"]:
                assert c["offset"] < positions[c["partition"]], (mode, c, positions)
            checked = _verify(stack, receipt, answer).json()
            assert checked["valid"] is True and checked["answer"] is True, (mode, checked)
        known = RecallBody(tenant=TENANT, query="R1", mode="exact", known_at=receipt["known_at"])
        answer = await reads.recall(res, tenants, known, record=False)
        assert answer["hits"] and _verify(stack, answer["receipt"], answer).json()["valid"] is True


def test_a_version_row_carries_what_its_receipt_cites(stack: Any) -> None:
    """The class: a recall's receipt probing `events` and `chain_links` for every verified candidate. Every version
    row carries its event's fingerprint and its record's chain link (written with the row), the verification
    statements read no chain link of their own, and a row without them (written before the columns) still gets its
    receipt, by a read of its own: the same receipt, verified."""
    from projections.search.recall.verify import _ROWS_SQL, _VERIFY_SQL

    settings = stack.settings
    with pg(settings) as conn:
        rows = conn.execute(
            "SELECT f.version_id, f.fingerprint IS NOT DISTINCT FROM e.fingerprint, "
            "f.link IS NOT DISTINCT FROM l.link, l.link IS NOT NULL FROM fact_versions f "
            "JOIN events e ON e.tenant = f.tenant AND e.event_id = f.event_id "
            'LEFT JOIN chain_links l ON l.consumer = %s AND l.topic = %s AND l."partition" = e."partition" '
            'AND l."offset" = e."offset"',
            (settings.processor_group, settings.topic),
        ).fetchall()
    assert rows and all(fp and link and linked for _, fp, link, linked in rows), rows
    for statement in (*_VERIFY_SQL.values(), *_ROWS_SQL.values()):
        assert "chain_links" not in statement, statement
    asyncio.run(_without_the_columns(stack))


async def _without_the_columns(stack: Any) -> None:
    from api import reads
    from api.requests import RecallBody

    settings, tenants = stack.settings, frozenset(KEYS[KEY])
    ask = RecallBody(tenant=TENANT, query="R1", mode="exact", top_k=10)
    async with Resources.open(settings, warm_embedder=False) as res:
        before = await reads.recall(res, tenants, ask, record=False)
        with pg(settings) as conn:
            conn.execute("UPDATE fact_versions SET fingerprint = NULL, link = NULL WHERE tenant = %s", (TENANT,))
        try:
            answer = await reads.recall(res, tenants, ask, record=False)
        finally:
            with pg(settings) as conn:  # put them back for the other tests
                conn.execute(
                    "UPDATE fact_versions f SET fingerprint = e.fingerprint, link = l.link FROM events e "
                    'LEFT JOIN chain_links l ON l.consumer = %s AND l.topic = %s AND l."partition" = e."partition" '
                    'AND l."offset" = e."offset" WHERE e.tenant = f.tenant AND e.event_id = f.event_id '
                    "AND f.tenant = %s",
                    (settings.processor_group, settings.topic, TENANT),
                )
    volatile = ("issued_at", "as_of", "known_at", "signature", "positions", "served")  # "now"; served: grows
    assert answer["hits"] and [h["event_id"] for h in answer["hits"]] == [h["event_id"] for h in before["hits"]]
    assert {k: v for k, v in answer["receipt"].items() if k not in volatile} == {
        k: v for k, v in before["receipt"].items() if k not in volatile
    }
    assert len(answer["receipt"]["cited"]) == len({h["event_id"] for h in answer["hits"]})
    assert _verify(stack, answer["receipt"], answer).json()["valid"] is True


def test_a_facts_or_history_receipt_is_read_in_the_answers_own_statement(stack: Any) -> None:
    """The class: a receipt that costs a read of the projection statements of its own (its positions read apart, in
    a transaction opened for them). Counted on the real connections, facts and history with their receipts (the
    whole list, a page, a page past the end, nothing at all) execute as many statements as without, and open no
    transaction but for the page past the end (read again with its count, in one snapshot); each receipt is the one
    the receipt's own read (api.receipts.issue without a basis) makes of the same answer, and each replays the
    same."""
    asyncio.run(_facts_and_history_with_their_receipts(stack))


async def _facts_and_history_with_their_receipts(stack: Any) -> None:
    import psycopg

    from api import reads, receipts

    subject = "project:R9"
    stack.publish([_fact(subject, f"r9.k{n}", f"v{n}", f"r9-{n}") for n in range(3)])
    stack.publish([_fact(subject, "r9.k0", "v0-again", "r9-0b")])
    stack.settle()
    tenants = frozenset(KEYS[KEY])
    counted = {"execute": 0, "transaction": 0}
    execute, transaction = psycopg.AsyncConnection.execute, psycopg.AsyncConnection.transaction

    # a connection the pool opens meanwhile runs its session set-up: not a statement of the read
    session_setup = (GENERIC_PLANS, search_path(stack.settings.pg_schema))

    def counting(name: str, real: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not (args and any(args[0] == setup for setup in session_setup)):
                counted[name] += 1
            return real(self, *args, **kwargs)

        return call

    async with Resources.open(stack.settings, warm_embedder=False) as res:
        facts = await reads.subject_facts(res, tenants, TENANT, subject)
        memory_id = next(f["memory_id"] for f in facts["facts"] if f["key"] == "r9.k0")
        asks: dict[str, tuple[Any, str, dict[str, Any]]] = {
            "facts": (reads.subject_facts, subject, {}),
            "a page of facts": (reads.subject_facts, subject, {"offset": 1, "limit": 1}),
            "a page past the end": (reads.subject_facts, subject, {"offset": 9, "limit": 1}),
            "no facts": (reads.subject_facts, "project:none-here", {}),
            "history": (reads.history, memory_id, {}),
            "a page of history": (reads.history, memory_id, {"offset": 1, "limit": 5}),
        }
        psycopg.AsyncConnection.execute = counting("execute", execute)  # type: ignore[method-assign]
        psycopg.AsyncConnection.transaction = counting("transaction", transaction)  # type: ignore[method-assign]
        try:
            used = {}
            answers = {}
            for name, (read, target, page) in asks.items():
                for want in (False, True):
                    async with contextlib.AsyncExitStack() as held:
                        if name == "facts" and not want:  # every idle connection held: the pool opens one mid-count
                            for _ in range(res.pool.get_stats()["pool_available"]):
                                await held.enter_async_context(res.pool.connection())
                        counted.update(execute=0, transaction=0)
                        answers[name] = await read(res, tenants, TENANT, target, receipt=want, **page)
                        used[name, want] = dict(counted)
        finally:
            psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
            psycopg.AsyncConnection.transaction = transaction  # type: ignore[method-assign]
        for name in asks:
            past_the_end = name == "a page past the end"
            again = 1 if past_the_end else 0  # the page read again in the count's snapshot
            assert used[name, True]["execute"] == used[name, False]["execute"] + again, (name, used)
            assert used[name, True]["transaction"] == again, (name, used)
        for name, (read, target, page) in asks.items():
            answer = answers[name]
            shown = answer.get("facts", answer.get("versions"))
            assert (len(shown) > 0) == (name not in ("a page past the end", "no facts")), (name, answer)
            ids = [v["event_id"] for v in shown]
            history = read is reads.history
            asked = {"memory_id": target} if history else {"subject": target, "as_of": None, "known_at": None}
            asked |= {"offset": page.get("offset", 0), "limit": page.get("limit")}
            own = await receipts.issue(
                res,
                "history" if history else "facts",
                TENANT,
                {k: v for k, v in answer.items() if k != "receipt"},
                receipts.request_fields("history" if history else "facts", asked),
                ids,
                as_of=None if history else answer["as_of"],
            )
            volatile = ("issued_at", "as_of", "known_at", "signature", "positions")  # "now" when asked
            receipt = answer["receipt"]
            assert {k: v for k, v in receipt.items() if k not in volatile} == {
                k: v for k, v in own.items() if k not in volatile
            }, name
            request = {"memory_id": target} if history else {"subject": target}
            body = {"tenant": TENANT, "receipt": receipt, "request": request | page}
            replayed = _post(stack, "/v1/receipts/replay", body)
            assert replayed.status_code == 200 and replayed.json()["same"] is True, (name, replayed.text)
