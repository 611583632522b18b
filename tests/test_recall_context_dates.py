"""Episode cues: calendar dates prefer the turns said then, and an episode
hit can carry its neighbouring turns as context.

Dates: two speakers' turns say nearly the same thing months apart; a question naming one turn's month (or day, or
year; English, Chinese, ISO) gets that turn first with the reason in its explanation, and the other still (a
preference, not a filter); a question naming no date is answered as with the preference off; facts never move.

Context: a conversation of one service, with a second service's turns interleaved at the same times, another
tenant's turns at the same times, a turn outside the window and a turn whose validity ended. `context_turns` = n
returns the n turns before and after from the same tenant and service within the window, any speaker, in time
order, never one that no longer holds (or not yet), nothing for facts, nothing unasked, and a 422 naming the field
beyond the bound.

The rule for neighbours (same tenant and service, within the window) stands in for a session id the contract
does not have.

Against the real servers (the recorder into a private schema, drained into a private index, the API over HTTP);
then pure unit tests of the date reading, as a class: every written form, and the non-dates around them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from producers.contract import MemoryEvent
from projections.embedding import load_embedder
from projections.search.dates import MAX_DATES, TOLD_WITHIN_DAYS, DateCue, find_dates
from tests.conftest import unique
from tests.support import RecorderWriter, drain_all, episode, private_store

DATED, CHAT, OTHER = "datedco", "chatco", "chatco-other"
KEYS = {"k-ctx": [DATED, CHAT, OTHER]}
JUNE = datetime(2025, 6, 14, 15, 0, tzinfo=UTC)
OCTOBER = datetime(2025, 10, 13, 18, 0, tzinfo=UTC)
SESSION = datetime(2025, 3, 2, 10, 0, tzinfo=UTC)

CONVERSATION = [  # (speaker, text): one session of service "chat", a second apart
    ("person:ana", "Ana: Did you finish the model ship you were building?"),
    ("person:ben", "Ben: Yes, I glued the last mast on yesterday evening."),
    ("person:ana", "Ana: What colour did you paint the hull?"),
    ("person:ben", "Ben: A deep navy blue, with a red stripe along the waterline."),
    ("person:ana", "Ana: That sounds lovely, send me a photo."),
]


def _episode(tenant: str, subject: str, content: str, when: datetime, service: str) -> MemoryEvent:
    return episode(subject, content, when, service, tenant=tenant)


@pytest.fixture(scope="module")
def world(base_settings):
    name = unique("ctx")
    settings = base_settings.private(name, api_keys=KEYS, recall_context_window_s=600.0)
    embedder = load_embedder(settings)
    with private_store(settings) as (conn, es):
        ledger = RecorderWriter(settings, conn)
        ids: dict[str, MemoryEvent] = {}
        # dates: the same thing said in June and in October, by two speakers; and one fact
        for tag, subject, content, when in [
            ("june", "person:cleo", "Cleo: We went camping by the lake with the kids and roasted marshmallows.", JUNE),
            (
                "october",
                "person:dan",
                "Dan: We went camping by the lake with our kids and roasted marshmallows.",
                OCTOBER,
            ),
        ]:
            ids[tag] = ledger.publish(_episode(DATED, subject, content, when, "chat"))[0]
        ids["fact"] = ledger.assert_fact(
            DATED, "person:cleo", "person.camping_spot", "Cleo's favourite camping spot is the lake", "lake",
            valid_from=OCTOBER,
        )  # fmt: skip
        # context: the conversation, with a second service and another tenant talking at the same times
        for i, (subject, text) in enumerate(CONVERSATION):
            t = SESSION + timedelta(seconds=i)
            ids[f"turn{i}"] = ledger.publish(_episode(CHAT, subject, text, t, "chat"))[0]
            ids[f"mail{i}"] = ledger.publish(_episode(CHAT, "person:eve", f"Eve (mail {i}): invoice {i}", t, "mail"))[0]
            ledger.publish(_episode(OTHER, subject, f"secret of the other tenant {i}", t, "chat"))
        ids["later"] = ledger.publish(
            _episode(CHAT, "person:ana", "Ana: the next day, about the ship again", SESSION + timedelta(days=1), "chat")
        )[0]
        ended = _episode(CHAT, "person:ben", "Ben: (a turn valid one second)", SESSION + timedelta(seconds=5), "chat")
        ledger.publish(ended.model_copy(update={"valid_to": SESSION + timedelta(seconds=6)}))
        drain_all(settings, conn, es, embedder)
        off = settings.model_copy(update={"time_preference": 1.0})
        with TestClient(create_app(settings)) as client, TestClient(create_app(off)) as plain:
            yield {"client": client, "plain": plain, "ids": ids}
        ledger.close()


def recall(client: TestClient, tenant: str, query: str, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/recall", json={"tenant": tenant, "query": query, **body}, headers={"X-API-Key": "k-ctx"})
    assert r.status_code == 200, r.text
    return r.json()


# --- dates ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("When did they go camping by the lake in June?", "june"),
        ("camping by the lake with the kids in October", "october"),
        ("What happened at the lake camping trip on October 13, 2025?", "october"),
        ("camping by the lake, 14 June 2025", "june"),
        ("2025年6月 在湖边露营 camping by the lake", "june"),
        ("camping by the lake 2025-10-13", "october"),
        ("camping by the lake on June 10", "june"),  # told within a week after: still the June turn
    ],
)
def test_a_named_date_prefers_the_turn_said_then_and_keeps_the_other(world, query, first):
    res = recall(world["client"], DATED, query)
    assert res["cues"]["dates"], res["cues"]
    eps = [h for h in res["hits"] if h["kind"] == "episodic"]
    other = "october" if first == "june" else "june"
    assert [h["memory_id"] for h in eps[:2]] == [world["ids"][first].memory_id, world["ids"][other].memory_id]
    assert any(p.startswith("date cue ") for p in eps[0]["match"]["preferred"]), eps[0]["match"]
    assert eps[1]["match"]["scores"]["preference"] == pytest.approx(0.6)
    assert eps[0]["score"] >= eps[1]["score"]


@pytest.mark.parametrize("query", ["When did they go camping by the lake?", "camping by the lake with the kids"])
def test_without_a_date_the_order_is_as_with_the_preference_off(world, query):
    on, off = recall(world["client"], DATED, query), recall(world["plain"], DATED, query)
    assert on["cues"]["dates"] == []
    assert [(h["memory_id"], h["score"]) for h in on["hits"]] == [(h["memory_id"], h["score"]) for h in off["hits"]]


def test_a_date_never_moves_a_fact(world):
    on = recall(world["client"], DATED, "Cleo camping spot lake in June")
    off = recall(world["plain"], DATED, "Cleo camping spot lake in June")
    fact = [h for h in on["hits"] if h["kind"] == "state"]
    assert fact and "preference" not in fact[0]["match"]["scores"]
    assert fact[0]["score"] == next(h["score"] for h in off["hits"] if h["memory_id"] == fact[0]["memory_id"])


# --- context turns ----------------------------------------------------------------------------------------


def _hit_of(res: dict[str, Any], e: MemoryEvent) -> dict[str, Any]:
    return next(h for h in res["hits"] if h["memory_id"] == e.memory_id)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_context_turns_are_the_sessions_neighbours_in_time_order(world, n):
    ids = world["ids"]
    res = recall(world["client"], CHAT, "what colour did you paint the hull", context_turns=n, top_k=10)
    h = _hit_of(res, ids["turn2"])
    got = [(c["offset"], c["memory_id"]) for c in h["context"]]
    before = [ids[f"turn{i}"].memory_id for i in range(max(0, 2 - n), 2)]
    after = [ids[f"turn{i}"].memory_id for i in range(3, min(5, 3 + n))]
    want = [(i - len(before), m) for i, m in enumerate(before)] + [(i + 1, m) for i, m in enumerate(after)]
    assert got == want  # the same service only, any speaker, never the ended turn or the next day's
    assert "source.service" in h["match"]["context"] and "600 s" in h["match"]["context"]
    for c in h["context"]:
        assert c["source"]["service"] == "chat" and "secret" not in c["content"]


def test_context_never_crosses_a_tenant_or_a_service(world):
    ids = world["ids"]
    res = recall(world["client"], CHAT, "invoice 2", context_turns=5, top_k=10)
    h = _hit_of(res, ids["mail2"])
    assert [c["memory_id"] for c in h["context"]] == [ids[f"mail{i}"].memory_id for i in (0, 1, 3, 4)]
    for hit in res["hits"]:
        for c in hit.get("context") or []:
            assert c["source"]["service"] == hit["source"]["service"] and "secret" not in c["content"]


def test_a_turn_after_as_of_is_not_there_yet(world):
    ids = world["ids"]
    as_of = (SESSION + timedelta(seconds=2, milliseconds=500)).isoformat().replace("+00:00", "Z")
    res = recall(world["client"], CHAT, "what colour did you paint the hull", context_turns=3, top_k=10, as_of=as_of)
    h = _hit_of(res, ids["turn2"])
    assert [c["memory_id"] for c in h["context"]] == [ids["turn0"].memory_id, ids["turn1"].memory_id]


def test_no_context_unless_asked_and_none_for_facts(world):
    res = recall(world["client"], CHAT, "what colour did you paint the hull", top_k=10)
    assert all("context" not in h and "context" not in h["match"] for h in res["hits"])
    assert "context" not in res["trace"]["stages_ms"]
    res = recall(world["client"], DATED, "Cleo camping spot lake", context_turns=2, top_k=10)
    fact = [h for h in res["hits"] if h["kind"] == "state"]
    assert fact and all("context" not in h for h in fact)


def test_a_turn_alone_in_its_window_has_an_empty_context(world):
    res = recall(world["client"], CHAT, "the next day about the ship again", context_turns=2, top_k=10)
    assert _hit_of(res, world["ids"]["later"])["context"] == []


@pytest.mark.parametrize("bad", [-1, 6, 1000, "two", 1.5, None])
def test_context_turns_out_of_bounds_is_a_422_naming_the_field(world, bad):
    r = world["client"].post(
        "/v1/recall",
        json={"tenant": CHAT, "query": "ship", "context_turns": bad},
        headers={"X-API-Key": "k-ctx"},
    )
    assert r.status_code == 422, r.text
    assert "context_turns" in r.text


# --- the date reading, pure -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("on october 13, 2023", (2023, 10, 13)),
        ("oct 13 2023", (2023, 10, 13)),
        ("13 october 2023", (2023, 10, 13)),
        ("1 february, 2023", (2023, 2, 1)),
        ("the 23rd of may", (None, 5, 23)),
        ("may 23", (None, 5, 23)),
        ("july 2023", (2023, 7, None)),
        ("in june", (None, 6, None)),
        ("during the month of august", (None, 8, None)),
        ("in 2023", (2023, None, None)),
        ("2023-05-08", (2023, 5, 8)),
        ("2023-05", (2023, 5, None)),
        ("2023年5月8日", (2023, 5, 8)),
        ("2023 年 5 月", (2023, 5, None)),
        ("5月8号", (None, 5, 8)),
        ("2023年", (2023, None, None)),
        ("5月份", (None, 5, None)),
        ("february 29", (None, 2, 29)),  # exists in some year
        # with a day and a month, any year of the calendar (a year alone stays 1800-2999: "march 5000" is a count)
        ("on 31 december 9999", (9999, 12, 31)),
        ("0001-01-01", (1, 1, 1)),
        ("january 2, 0100", (100, 1, 2)),
        ("9999年12月31日", (9999, 12, 31)),
    ],
)
def test_every_written_form_of_a_date_is_read(text, want):
    got = find_dates(text)
    assert [(d.year, d.month, d.day) for d in got] == [want], got


@pytest.mark.parametrize(
    "text",
    [
        "may i ask what the port is",
        "the mayor said",
        "port 8080 and 2023",  # a bare number is no year
        "3个月 以前",  # three months, not March
        "february 30, 2023",  # no such day
        "february 30",
        "june2023x",
        "in 123456",
        "0000-01-01",  # no year 0
        "march 5000",
        "1.5 days",
        "x" * 100_000,
        "\x00 in \x00 june",  # a NUL is no space between words
        "",
    ],
)
def test_what_is_no_date_is_not_read_as_one(text):
    assert find_dates(text) == ()


def test_dates_are_bounded_and_deduplicated():
    text = " ".join(f"in {y}" for y in range(2000, 2050)) + " in 2000 in 2000"
    got = find_dates(text)
    assert len(got) == MAX_DATES and len({(d.year, d.month, d.day) for d in got}) == MAX_DATES


def test_a_date_matches_the_day_and_the_days_after_it_was_told():
    d = DateCue("may 23", None, 5, 23)
    assert d.matches(datetime(2023, 5, 23, 23, 59, tzinfo=UTC))
    assert d.matches(datetime(2023, 5, 23, tzinfo=UTC) + timedelta(days=TOLD_WITHIN_DAYS))
    assert not d.matches(datetime(2023, 5, 23, tzinfo=UTC) + timedelta(days=TOLD_WITHIN_DAYS + 1))
    assert not d.matches(datetime(2023, 5, 22, 23, 59, tzinfo=UTC))
    assert DateCue("in june", None, 6, None).matches(datetime(1999, 7, 3, tzinfo=UTC))  # June 26 + a week
    assert not DateCue("in 2023", 2023, None, None).matches(datetime(2022, 12, 31, tzinfo=UTC))
    assert DateCue("y1", 1, 1, 1).matches(datetime(1, 1, 1, tzinfo=UTC))  # the first day: no underflow
    assert not DateCue("y", 9999, 12, 31).matches(datetime(1, 1, 1, tzinfo=UTC))
