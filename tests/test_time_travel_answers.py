"""Every part of an answer obeys the answer's one `as_of` / `known_at`: time travel never reads the future.

One world with versions and conversation turns observed before and after an instant K, asked at valid times
before and after, as known at K (or now). For every read path that takes the times (recall over HTTP and the MCP
`recall_at` tool, a subject's facts over HTTP and MCP, the context block over HTTP and MCP) and every part of its
answer (hits, their verification, their context turns, their near-duplicate groups, fact rows, context lines):

- known_at K: no id of a version, episode or retraction observed after K appears anywhere, and every version
  shown has the status and end the ledger gave it at K (the pure fold over the events observed by K is the
  oracle); a retraction observed after K does not hide what K knew;
- as_of t: no version valid only after t is shown as a memory (hit, context turn, duplicate, fact, line); a
  successor named as the shown version's `superseded_by` is what is known now, and allowed.

Against the real servers: the recorder into a private schema, drained (documents, vectors, duplicate links) into a
private index; the HTTP API in process, the MCP server as a child over Streamable HTTP.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import orjson
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api.main import create_app
from producers.contract import (
    AccessEvent,
    EventType,
    Kind,
    MemoryEvent,
    Source,
    SourceType,
    access_id_for,
    encode_access,
    parse_rfc3339,
    rfc3339,
)
from projections.embedding import load_embedder
from projections.postgres.access_projector import AccessProjector, decode_access_record
from projections.postgres.queries import episode_holds_sql
from projections.versions import fold, holds_at, mark_of, new_version
from tests.conftest import unique
from tests.support import RecorderWriter, drain_all, episode, private_store
from tests.support.servers import McpHttpServer

TENANT, KEY = "tt", "k-tt"
S = datetime(2025, 5, 1, 9, 0, tzinfo=UTC)  # the conversation starts
K = S + timedelta(seconds=2, milliseconds=500)  # the known-at instant: turns 0-2 are known, 3 and 4 are not
LATER = S + timedelta(hours=1)  # a valid time when everything holds (what was not retracted)
HULL, PORT, HIKE = "what colour did you paint the hull", "backend port of P1", "hiked Mount Tamalpais at sunrise fog"
HIKE_TEXT = "We hiked up Mount Tamalpais at sunrise and watched the fog roll over the bay."

CONVERSATION = [
    ("person:ana", "Ana: Did you finish the model ship you were building?"),
    ("person:ben", "Ben: Yes, I glued the last mast on yesterday evening."),
    ("person:ana", "Ana: What colour did you paint the hull?"),
    ("person:ben", "Ben: A deep navy blue, with a red stripe along the waterline."),
    ("person:ana", "Ana: That sounds lovely, send me a photo."),
]


def _episode(subject: str, content: str, observed: datetime, service: str, valid_from: datetime | None = None):
    return episode(subject, content, observed, service, tenant=TENANT, valid_from=valid_from or observed)


def _fact(value: int, when: datetime) -> MemoryEvent:
    return MemoryEvent(
        type=EventType.ASSERTED,
        tenant=TENANT,
        subject="project:P1",
        key="project.port",
        value=value,
        content=f"P1 backend port is {value}",
        aliases=["backend port"],
        entities=["P1"],
        source=Source(type=SourceType.EXPLICIT, service="tests"),
        observed_at=when,
        valid_from=when,
    )


def _said(key: str, content: str, when: datetime, **fields: Any) -> MemoryEvent:
    """A fact of Ana's whose other versions share no word with it: only its own text finds each version."""
    return MemoryEvent(
        type=EventType.ASSERTED,
        tenant=TENANT,
        subject="person:ana",
        key=key,
        value=content,
        content=content,
        entities=["person:ana"],
        source=Source(type=SourceType.EXPLICIT, service="tests"),
        observed_at=when,
        valid_from=when,
        **fields,
    )


ESPRESSO, TEA = "Ana drinks a double espresso every morning", "Ana switched to jasmine tea"
AISLE, WINDOW = "Ana books an aisle seat on flights", "for the Lisbon trip only: window, please"
THEREMIN = "Ana rehearses the theremin every Thursday"
ENDS = S + timedelta(seconds=1, microseconds=900)  # the theremin's end: 900 us into a millisecond
NOW = LATER + timedelta(days=1)  # after everything was logged: as known now


def _world() -> list[MemoryEvent]:
    s = timedelta(seconds=1)
    turns = [_episode(s, text, S + timedelta(seconds=i), "chat") for i, (s, text) in enumerate(CONVERSATION)]
    late = _episode("person:ben", "Ben: (said at 1.5 s, logged at 20 s) the hull took two coats", S + timedelta(
        seconds=20), "chat", valid_from=S + timedelta(seconds=1, milliseconds=500))  # fmt: skip
    # turn 1 retracted after K: as known at K it is still a turn of the conversation
    retract_turn1 = _retract(turns[1], S + timedelta(seconds=30), S + timedelta(seconds=30))
    hikes = [
        _episode("person:cleo", HIKE_TEXT, S - timedelta(seconds=30), "hikes"),
        _episode("person:cleo", HIKE_TEXT, S + timedelta(seconds=40), "hikes"),  # its near-duplicate, after K
    ]
    port = [_fact(8080, S - timedelta(seconds=60)), _fact(9090, S + timedelta(seconds=3))]  # 9090 after K
    drink = [_said("drink.morning", ESPRESSO, S - 60 * s), _said("drink.morning", TEA, S + 4 * s)]  # tea after K
    seat = [  # a long-term preference and an override of it that ended before K
        _said("seat.flight", AISLE, S - 100 * s, kind=Kind.PREFERENCE),
        _said("seat.flight", WINDOW, S - 50 * s, kind=Kind.PREFERENCE, valid_to=S - 40 * s),
    ]
    theremin = _said("hobby.music", THEREMIN, S - 5 * s, valid_to=ENDS)
    return [*turns, late, *hikes, *port, retract_turn1, *_edges(), theremin, *seat, *drink]


def _retract(e: MemoryEvent, when: datetime, observed: datetime) -> MemoryEvent:
    return MemoryEvent(
        type=EventType.RETRACTED,
        tenant=TENANT,
        subject=e.subject,
        target_version=e.version_id,
        observed_at=observed,
        valid_from=when,
    )


def _edges() -> list[MemoryEvent]:
    """Episodes of another subject and service whose retractions sit on the edges of the known-at rule."""
    s = timedelta(seconds=1)
    e1 = _episode("person:dora", "Dora: first note", S - 100 * s, "notes")
    e2 = _episode("person:dora", "Dora: second note", S - 100 * s, "notes").model_copy(update={"valid_to": S - 20 * s})
    e3 = _episode("person:dora", "Dora: third note", S - 90 * s, "notes")
    return [
        e1,
        e2,
        e3,
        _retract(e1, S - 50 * s, S - 50 * s),  # known at K
        _retract(e1, S - 70 * s, S + 50 * s),  # an earlier end, learnt after K
        _retract(e2, S - 10 * s, S - 10 * s),  # after its own end: no effect
        _retract(e2, S - 100 * s, S + 60 * s),  # at its own valid_from, learnt after K
        _retract(e3, S - 200 * s, S - 60 * s),  # before it began: no effect
    ]


def _served_after_k(settings, conn, served: list[MemoryEvent]) -> None:
    """Accesses of these versions recorded after K, through the access projector (the worker's code)."""
    projector = AccessProjector(conn, consumer="tt-access", topic=settings.access_topic)
    records = []
    for i, e in enumerate(served * 5):
        a = AccessEvent(
            access_id=access_id_for(TENANT, "caller", f"serving-{i}", e.memory_id, e.version_id),
            tenant=TENANT,
            memory_id=e.memory_id,
            version_id=e.version_id,
            stage="exact",
            caller="caller",
            accessed_at=S + timedelta(seconds=100),
        )
        records.append(decode_access_record(settings.access_topic, 0, i, encode_access(a)))
    assert projector.apply_batch(records).applied == len(records)


@pytest.fixture(scope="module")
def world(base_settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("tt"), api_keys={KEY: [TENANT]}, recall_context_window_s=600.0)
    events = _world()
    with private_store(settings) as (conn, es):
        with RecorderWriter(settings, conn) as ledger:
            for e in events:
                ledger.apply(e)
            drain_all(settings, conn, es, load_embedder(settings))
            _served_after_k(settings, ledger.conn, [events[2], events[8]])
        links = conn.execute("SELECT count(*) FROM episode_links").fetchone()[0]
        assert links >= 1, "the two hikes must be linked as near-duplicates for the groups to be tested"
        with McpHttpServer(settings) as mcp, TestClient(create_app(settings)) as client:
            yield {"client": client, "mcp": mcp.url, "events": events, "conn": conn}


def _mcp(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
            async with Client(streamable_http_client(url, http_client=http)) as c:
                r = await c.call_tool(tool, arguments)
        assert not r.is_error, r.content
        return r.structured_content or {}

    return asyncio.run(call())


def _http(client: TestClient, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    if method == "GET":
        r = client.get(path, params=body, headers={"X-API-Key": KEY})
    else:
        r = client.post(path, json=body, headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    return r.json()


def _times(as_of: datetime, known_at: datetime | None) -> dict[str, str]:
    return {"as_of": rfc3339(as_of), **({"known_at": rfc3339(known_at)} if known_at else {})}


def _ask(world: dict[str, Any], door: str, path: str, as_of: datetime, known_at: datetime | None) -> list[dict]:
    """Every answer of `path` through `door` at these times (one per question or subject)."""
    t = _times(as_of, known_at)
    out = []
    if path == "recall":
        for query in (HULL, PORT, HIKE):
            body = {"tenant": TENANT, "query": query, "top_k": 10, "context_turns": 2, "explain": True, **t}
            out.append(
                _http(world["client"], "POST", "/v1/recall", body)
                if door == "http"
                else _mcp(world["mcp"], "recall_at", body)
            )
    elif path == "facts":
        for subject in ("project:P1", "person:ana", "person:ben", "person:cleo"):
            if door == "http":
                out.append(_http(world["client"], "GET", f"/v1/subjects/{subject}/facts", {"tenant": TENANT, **t}))
            else:
                out.append(_mcp(world["mcp"], "facts", {"tenant": TENANT, "subject": subject, **t}))
    else:  # the context block takes a valid time only
        for subject, question in (("project:P1", PORT), ("person:ana", HULL), ("person:cleo", HIKE)):
            body = {"tenant": TENANT, "subject": subject, "question": question, "format": "json",
                    "include_history": True, "budget_tokens": 4000, **t}  # fmt: skip
            out.append(
                _http(world["client"], "POST", "/v1/context", body)
                if door == "http"
                else _mcp(world["mcp"], "context", body)
            )
    return out


def _known_state(events: list[MemoryEvent], known_at: datetime | None) -> dict[str, Any]:
    """version_id -> the version as the pure fold made it from the events observed by `known_at` (all: None)."""
    seen = [e for e in events if known_at is None or e.observed_at <= known_at]
    versions = {e.version_id: new_version(e, 0, i) for i, e in enumerate(seen) if e.type is EventType.ASSERTED}
    by_fact: dict[str, list] = defaultdict(list)
    for v in versions.values():
        by_fact[v.memory_id].append(v)
    marks: dict[str, list] = defaultdict(list)
    for e in seen:
        if e.type is EventType.RETRACTED:  # a targeted retraction belongs to its target's fact
            target = versions.get(e.target_version or "")
            marks[target.memory_id if target is not None else e.memory_id].append(mark_of(e))
    return {v.version_id: v for mid, vs in by_fact.items() for v in fold(vs, marks.get(mid, []))}


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf and every dict of an answer."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}.{i}")
    else:
        yield path, node


def _ids(e: MemoryEvent) -> set[str]:
    ids = {e.event_id, e.version_id}
    return ids | {e.memory_id} if e.kind.value == "episodic" and e.type is EventType.ASSERTED else ids


def _end(d: dict[str, Any]) -> datetime | None:
    ends = [parse_rfc3339(d[k]) for k in ("valid_to", "superseded_at") if d.get(k)]
    return min(ends) if ends else None


CASES = {"past-as-known-then": (K, K), "later-as-known-then": (LATER, K), "past-as-known-now": (K, None)}
PATHS = {
    "POST-recall": ("http", "recall"),
    "mcp-recall_at": ("mcp", "recall"),
    "GET-facts": ("http", "facts"),
    "mcp-facts": ("mcp", "facts"),
    "POST-context": ("http", "context"),
    "mcp-context": ("mcp", "context"),
}
# every path at every pair of times it takes (the context block takes a valid time only)
ANSWERS = [
    pytest.param(door, path, as_of, known_at, id=f"{name}-{when}")
    for name, (door, path) in PATHS.items()
    for when, (as_of, known_at) in CASES.items()
    if path != "context" or known_at is None
]


@pytest.mark.parametrize(("door", "path", "as_of", "known_at"), ANSWERS)
def test_no_part_of_an_answer_comes_from_after_its_times(world, door, path, as_of, known_at) -> None:
    events: list[MemoryEvent] = world["events"]
    oracle = _known_state(events, known_at)
    unknown = {i for e in events if known_at is not None and e.observed_at > known_at for i in _ids(e)}
    not_yet = {
        i for e in events if e.type is EventType.ASSERTED and e.valid_from > as_of for i in _ids(e)
    }  # valid only after as_of: never shown as a memory
    answers = _ask(world, door, path, as_of, known_at)
    shown: set[str] = set()
    for answer in answers:
        for where, value in _walk(answer):
            if isinstance(value, str):
                assert value not in unknown, f"{where} = {value}: observed after known_at {known_at}"
            if isinstance(value, str) and value in not_yet and not where.endswith(".superseded_by"):
                raise AssertionError(f"{where} = {value}: valid only after as_of {as_of}")
            if isinstance(value, dict) and value.get("version_id") in oracle:
                shown.add(value["version_id"])
                if value.get("status") in ("active", "superseded", "retracted") and known_at is not None:
                    v = oracle[value["version_id"]]
                    want_end = min([t for t in (v.valid_to, v.superseded_at) if t is not None], default=None)
                    assert (value["status"], _end(value)) == (v.status, want_end), f"{where}: as known at {known_at}"
    # accesses are recorded too: all of this world's after K, so an answer as known then ranks by none of them
    scored = [h["match"]["scores"] for a in answers for h in a.get("hits", [])]
    if known_at is not None:
        assert not [sc for sc in scored if "access" in sc], scored
    elif path == "recall":
        assert any("access" in sc for sc in scored), scored
    # what the times do show is there: the answer is not vacuous
    held = {vid for vid, v in oracle.items() if holds_at(v, as_of)}
    port_then = next(e for e in events if e.value == (8080 if as_of < S + timedelta(seconds=3) or known_at else 9090))
    assert port_then.version_id in shown
    assert events[2].version_id in shown and events[2].version_id in held  # turn 2, the hull question
    hike = events[6] if known_at is not None or as_of < events[7].valid_from else None
    if hike is not None:
        assert hike.version_id in shown


@pytest.mark.parametrize("door", ["http", "mcp"])
@pytest.mark.parametrize(("as_of", "known_at"), list(CASES.values()), ids=list(CASES))
def test_context_turns_are_the_turns_of_those_times(world, door, as_of, known_at) -> None:
    events: list[MemoryEvent] = world["events"]
    turns, late = events[:5], events[5]
    want_before = [turns[0].memory_id, turns[1].memory_id]  # turn 1's retraction was observed after K
    if known_at is None and as_of >= turns[1].valid_from + timedelta(seconds=30):
        want_before = [turns[0].memory_id]
    want_after = [late.memory_id] if known_at is None else []  # turn 3 is valid after K, the late turn logged after
    answers = _ask(world, door, "recall", as_of, known_at)
    hit = next(h for h in answers[0]["hits"] if h["memory_id"] == turns[2].memory_id)
    got = [(c["offset"], c["memory_id"]) for c in hit.get("context") or []]
    want = [(i - len(want_before), m) for i, m in enumerate(want_before)] + [
        (i + 1, m) for i, m in enumerate(want_after)
    ]
    assert got == want


def test_the_sql_rule_for_an_episode_as_known_then_is_the_folds(world) -> None:
    """queries.episode_holds_sql against the pure fold of the events observed by k, at every edge of every episode
    (1 us either side) and every instant a retraction was logged at, as known then and as known now."""
    events: list[MemoryEvent] = world["events"]
    episodes = [e for e in events if e.type is EventType.ASSERTED and e.kind.value == "episodic"]
    edges = {t for e in events for t in (e.valid_from, e.valid_to, e.observed_at) if t is not None}
    times = sorted(
        {t + d for t in edges for d in (-timedelta(microseconds=1), timedelta(0), timedelta(microseconds=1))}
    )
    knowns = [None, *sorted({e.observed_at for e in events if e.type is EventType.RETRACTED})]
    query = "SELECT f.version_id FROM fact_versions f WHERE f.version_id = ANY(%(vids)s) AND {}"
    vids = [e.version_id for e in episodes]
    checked = 0
    for known in knowns:
        sql_text = query.format(episode_holds_sql("t", "known" if known else None))
        oracle = _known_state(events, known)
        for t in times:
            got = {r[0] for r in world["conn"].execute(sql_text, {"vids": vids, "t": t, "known": known}).fetchall()}
            want = {v for v in vids if v in oracle and holds_at(oracle[v], t)}
            assert got == want, (t, known)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("door", ["http", "mcp"])
@pytest.mark.parametrize(("as_of", "known_at"), [(LATER, K), (LATER, None)], ids=["as-known-then", "as-known-now"])
def test_a_retraction_logged_later_does_not_hide_what_was_known(world, door, as_of, known_at) -> None:
    """Turn 1 was retracted at 30 s, logged then: as known at K it still holds later; as known now it does not."""
    turn1 = world["events"][1]
    body = {"tenant": TENANT, "query": "glued the last mast", "top_k": 10, **_times(as_of, known_at)}
    res = (
        _http(world["client"], "POST", "/v1/recall", body) if door == "http" else _mcp(world["mcp"], "recall_at", body)
    )
    found = {h["memory_id"]: h for h in res["hits"]}
    if known_at is None:
        assert turn1.memory_id not in found, res["hits"]
    else:
        assert found[turn1.memory_id]["status"] == "active" and found[turn1.memory_id]["valid_to"] is None, found


def _recall(world: dict[str, Any], door: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"tenant": TENANT, "top_k": 50, **body}
    return (
        _http(world["client"], "POST", "/v1/recall", body) if door == "http" else _mcp(world["mcp"], "recall_at", body)
    )


def _found(answer: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Each hit's fact, the version shown and the version that led to it (order and scores aside: ended versions
    among the candidates move the others' ranks)."""
    return {(h["memory_id"], h["version_id"], orjson.dumps(h["match"]["verified"]).decode()) for h in answer["hits"]}


@pytest.mark.parametrize("door", ["http", "mcp"])
@pytest.mark.parametrize("as_of", [LATER, K], ids=["later", "past"])
@pytest.mark.parametrize("mode", ["auto", "keyword", "semantic"])
def test_as_known_now_recall_answers_what_recall_answers(world, door, as_of, mode) -> None:
    """As known at an instant after everything was logged, each question finds the facts and versions that recall
    without `known_at` finds: a version the ledger has replaced since (the espresso, by the tea) matching the
    question never answers with its successor, and an override that ended (the window seat) never stands for the
    long-term value it shadowed."""
    questions = (ESPRESSO, "double espresso", TEA, AISLE, "aisle seat", WINDOW, HULL, PORT, HIKE)
    for query in questions:
        body = {"query": query, "mode": mode, "as_of": rfc3339(as_of)}
        plain, known = _recall(world, door, body), _recall(world, door, {**body, "known_at": rfc3339(NOW)})
        assert _found(known) == _found(plain), (query, plain["hits"], known["hits"])


@pytest.mark.parametrize("door", ["http", "mcp"])
def test_the_version_known_then_is_found_by_its_own_words(world, door) -> None:
    """As known at K the espresso was Ana's drink (the tea came after): asking for it finds it, shown as itself.
    As known then or now, no hit was led to by a version other than the one it shows."""
    espresso = world["events"][-2]
    then = _recall(world, door, {"query": "double espresso", "as_of": rfc3339(LATER), "known_at": rfc3339(K)})
    assert espresso.version_id in {h["version_id"] for h in then["hits"]}, then["hits"]
    for known_at in (K, NOW):
        for query in ("double espresso", TEA):
            body = {"query": query, "as_of": rfc3339(LATER), "known_at": rfc3339(known_at)}
            hits = _recall(world, door, body)["hits"]
            assert all(h["match"]["verified"] == {"candidate": h["version_id"]} for h in hits), hits


@pytest.mark.parametrize("mode", ["auto", "keyword", "semantic", "exact"])
def test_a_fact_is_found_up_to_the_microsecond_its_window_ends(world, mode) -> None:
    """The index keeps times to the millisecond: a fact ending 900 us into one is found at every valid time before
    its end, inside that millisecond too, as the facts route shows it, and at none from its end on."""
    for as_of, holds in ((ENDS - timedelta(microseconds=400), True), (ENDS - timedelta(microseconds=1), True),
                         (ENDS, False), (ENDS + timedelta(microseconds=100), False)):  # fmt: skip
        query = THEREMIN if mode != "exact" else "person:ana hobby.music"
        hits = _recall(world, "http", {"query": query, "mode": mode, "as_of": rfc3339(as_of)})["hits"]
        asked = {"tenant": TENANT, **_times(as_of, None)}
        facts = _http(world["client"], "GET", "/v1/subjects/person:ana/facts", asked)
        assert (THEREMIN in [f["content"] for f in facts["facts"]]) is holds, (as_of, facts)
        assert (THEREMIN in [h["content"] for h in hits]) is holds, (mode, as_of, hits)
