"""Overrides and retractions, and what each event did, through the real PostgreSQL projection and the real app.

- A retraction ends the version *visible* at its time: with a long-term preference and a
  temporary override in force, it ends the override and the long-term value shows again; a
  `target_version` retraction ends exactly that version.
- The audit replay (`GET /v1/subjects/{s}/events`) says what each event did, including the
  retractions and confirmations that matched nothing (before: accepted, silently no effect).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from producers.contract import from_dict, rfc3339, version_id_for
from producers.settings import Settings
from tests.conftest import unique
from tests.support import MALFORMED_CURSORS, RecorderWriter, private_store

TENANT, SUBJECT, KEY = "audit", "user:1", "preference.seat"
HEADERS = {"X-API-Key": "audit-key"}
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def day(n: float) -> str:
    return rfc3339(T0 + timedelta(days=n))


class Writer(RecorderWriter):
    """Events about SUBJECT's KEY straight through the recorder the projector runs (one offset each)."""

    def write(self, **fields) -> str:
        event = from_dict({"tenant": TENANT, "subject": SUBJECT, "key": KEY, **fields})
        result = self.apply(event)
        assert result.dead == 0, result
        return event.event_id


@pytest.fixture
def stack(base_settings: Settings) -> Iterator[tuple[Writer, TestClient]]:
    settings = base_settings.private(unique("audit"), api_keys={"audit-key": [TENANT]})
    with (
        private_store(settings),
        Writer(settings, consumer=settings.processor_group) as writer,  # as the worker: its pages' cursors are within
        TestClient(create_app(settings)) as client,
    ):
        yield writer, client


def seat(client: TestClient, at: str) -> str | None:
    r = client.get(f"/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT, "as_of": at}, headers=HEADERS)
    assert r.status_code == 200, r.text
    values = [f["value"] for f in r.json()["facts"] if f["key"] == KEY]
    assert len(values) <= 1
    return values[0] if values else None


def effects(client: TestClient) -> dict[str, dict]:
    r = client.get(f"/v1/subjects/{SUBJECT}/events", params={"tenant": TENANT}, headers=HEADERS)
    assert r.status_code == 200, r.text
    return {e["event_id"]: e["effect"] for e in r.json()["events"]}


def asserted(value: str, valid_from: str, valid_to: str | None = None, kind: str = "preference") -> dict:
    fields = {"type": "memory.asserted", "kind": kind, "value": value, "content": f"prefers {value}"}
    fields |= {"observed_at": valid_from, "valid_from": valid_from}
    if valid_to:
        fields["valid_to"] = valid_to
    return fields


def test_retracting_inside_an_override_keeps_the_long_term_value(stack) -> None:
    writer, client = stack
    aisle = writer.write(**asserted("aisle", day(0)))
    window = writer.write(**asserted("window", day(1), valid_to=day(8)))
    assert seat(client, day(2)) == "window"
    retraction = writer.write(type="memory.retracted", observed_at=day(3), valid_from=day(3))
    assert seat(client, day(2)) == "window", "the past is unchanged"
    assert seat(client, day(4)) == "aisle", "the override ended; the long-term preference shows again"
    assert seat(client, day(9)) == "aisle"
    got = effects(client)
    assert got[retraction]["effect"] == "ended" and got[retraction]["version_id"] == version_id_for(TENANT, window)
    assert got[window]["effect"] == "retracted"
    assert got[aisle]["effect"] == "active"
    # a second retraction now ends the long-term one
    second = writer.write(type="memory.retracted", observed_at=day(5), valid_from=day(5))
    assert seat(client, day(6)) is None
    assert effects(client)[second]["version_id"] == version_id_for(TENANT, aisle)


def test_a_targeted_retraction_ends_exactly_its_version(stack) -> None:
    writer, client = stack
    aisle = writer.write(**asserted("aisle", day(0)))
    writer.write(**asserted("window", day(1), valid_to=day(8)))
    target = version_id_for(TENANT, aisle)
    retraction = writer.write(type="memory.retracted", observed_at=day(3), valid_from=day(3), target_version=target)
    assert seat(client, day(4)) == "window", "the override in force stays"
    assert seat(client, day(9)) is None, "and after it, the long-term value is gone"
    assert effects(client)[retraction] == {**effects(client)[retraction], "effect": "ended", "version_id": target}


@pytest.mark.parametrize("kind", ["state", "preference"])
def test_a_retraction_naming_only_its_target_version_ends_that_version(stack, kind) -> None:
    """The contract lets target_version alone (no key) say which fact a retraction ends: it ends that version of a
    fact of any kind, not only an episode's; with the key of another fact it still ends nothing."""
    writer, client = stack
    aisle = writer.write(**asserted("aisle", day(0), kind=kind))
    target = version_id_for(TENANT, aisle)
    other_key = writer.write(
        type="memory.retracted", key="preference.meal", observed_at=day(1), valid_from=day(1), target_version=target
    )
    assert seat(client, day(2)) == "aisle"
    retraction = writer.write(
        type="memory.retracted", key=None, observed_at=day(3), valid_from=day(3), target_version=target
    )
    assert seat(client, day(2)) == "aisle" and seat(client, day(4)) is None
    got = effects(client)
    assert got[other_key]["effect"] == "no_effect", got[other_key]
    assert got[retraction] == {**got[retraction], "effect": "ended", "version_id": target}
    assert got[aisle]["effect"] == "retracted"


def test_the_door_names_no_fact_for_a_retraction_it_cannot_place(stack) -> None:
    """A retraction naming its target_version is filed by the worker under the target's fact (an episode's, or any
    when no key is named): the door, which cannot know it, answers no memory_id rather than a wrong one."""
    _, client = stack
    base = {"type": "memory.retracted", "tenant": TENANT, "subject": SUBJECT}
    targeted = {**base, "event_id": "r-target", "target_version": version_id_for(TENANT, "some-episode")}
    keyed = {**base, "event_id": "r-key", "key": KEY}
    r = client.post("/v1/events", json={"events": [targeted, keyed]}, headers=HEADERS)
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first["accepted"] and first["memory_id"] is None, first
    assert second["accepted"] and second["memory_id"] == from_dict(keyed).memory_id, second


def test_a_fact_in_force_at_as_of_reads_active_whatever_its_chain_says_of_later(stack) -> None:
    """A version superseded or retracted from a later valid time holds until then: a facts answer at a time before
    says `active` (the chain's later fate is in superseded_at and valid_to), and after it the later value."""
    writer, client = stack
    writer.write(**asserted("aisle", day(0), kind="state"))
    writer.write(**asserted("window", day(10), kind="state"))  # supersedes it from day 10 on

    def facts(at: str) -> list[tuple]:
        r = client.get(f"/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT, "as_of": at}, headers=HEADERS)
        assert r.status_code == 200, r.text
        return [(f["value"], f["status"], f["superseded_at"], f["valid_to"]) for f in r.json()["facts"]]

    assert facts(day(5)) == [("aisle", "active", day(10), None)]
    assert facts(day(11)) == [("window", "active", None, None)]
    writer.write(type="memory.retracted", observed_at=day(12), valid_from=day(20))  # ends it from day 20 on
    assert facts(day(15)) == [("window", "active", None, day(20))]
    assert facts(day(21)) == []
    r = client.get(
        f"/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT, "as_of": day(15), "limit": 5}, headers=HEADERS
    )
    assert [f["status"] for f in r.json()["facts"]] == ["active"], r.text  # a page alike


def test_the_audit_replay_says_when_it_shows_the_first_limit_events_only(stack) -> None:
    writer, client = stack
    ids = [writer.write(**asserted(f"v{n}", day(n), kind="state")) for n in range(4)]

    def replay(**params) -> dict:
        r = client.get(f"/v1/subjects/{SUBJECT}/events", params={"tenant": TENANT, **params}, headers=HEADERS)
        assert r.status_code == 200, r.text
        return r.json()

    cut = replay(limit=2)
    assert [e["event_id"] for e in cut["events"]] == ids[:2] and cut["more"] is True
    for whole in (replay(limit=4), replay()):
        assert [e["event_id"] for e in whole["events"]] == ids and whole["more"] is False
    within = replay(limit=1, **{"from": day(3)})  # within from/to: more of those only
    assert [e["event_id"] for e in within["events"]] == ids[3:] and within["more"] is False


def _replay(client: TestClient, **params) -> dict:
    r = client.get(f"/v1/subjects/{SUBJECT}/events", params={"tenant": TENANT, **params}, headers=HEADERS)
    assert r.status_code == 200, r.text
    return r.json()


def _walk(client: TestClient, **params) -> tuple[list[str], list[dict]]:
    """Every page of the audit replay by its next_cursor: the event ids in order, and the pages."""
    pages = [_replay(client, **params)]
    while pages[-1]["more"]:
        assert pages[-1]["next_cursor"] is not None, pages[-1]
        pages.append(_replay(client, **{**params, "cursor": pages[-1]["next_cursor"]}))
        assert len(pages) < 50, "the cursor does not move"
    assert pages[-1]["next_cursor"] is None
    return [e["event_id"] for page in pages for e in page["events"]], pages


def test_the_audit_replay_pages_by_its_cursor_through_every_event_once(stack) -> None:
    writer, client = stack
    ids = [writer.write(**asserted(f"v{n}", day(n), kind="state")) for n in range(5)]
    # marks and another fact: an event's effect on a page is what the whole log says of it
    ids.append(writer.write(type="memory.confirmed", observed_at=day(5), valid_from=day(5)))
    ids.append(writer.write(**asserted("v6", day(6)), key="preference.meal"))
    whole = _replay(client)
    assert [e["event_id"] for e in whole["events"]] == ids and whole["next_cursor"] is None
    for limit in (1, 2, 3, 6, 7, 10_000):
        walked, pages = _walk(client, limit=limit)
        assert walked == ids, limit
        assert all(len(page["events"]) <= limit for page in pages)
        assert [e for page in pages for e in page["events"]] == whole["events"], limit
    walked, _ = _walk(client, limit=2, **{"from": day(2), "to": day(6)})  # within from/to, paged alike
    assert walked == ids[2:6]
    # a page boundary is a position: an event logged between two pages joins the end, and the next page starts
    # where the last one ended, whatever was logged meanwhile
    first = _replay(client, limit=3)
    later = writer.write(**asserted("v7", day(7), kind="state"))
    rest, _ = _walk(client, limit=3, cursor=first["next_cursor"])
    assert [e["event_id"] for e in first["events"]] + rest == [*ids, later]
    # a cursor past the last event: nothing more, said so
    last = _replay(client)["events"][-1]
    beyond = _replay(client, cursor=f"{last['partition']}:{last['offset']}")
    assert beyond["events"] == [] and beyond["more"] is False and beyond["next_cursor"] is None


def test_facts_pages_walked_with_the_first_pages_times_are_one_list_while_writes_land(stack) -> None:
    """As the README says: a write between two pages shifts the rest, unless every page is asked with the first
    page's `as_of` and its receipt's `known_at` (what is observed later stays out)."""
    writer, client = stack
    for n, key in enumerate(("k.a", "k.b", "k.c", "k.d")):
        writer.write(**asserted(f"v{n}", day(n), kind="state"), key=key)

    def page(offset: int, **times: str) -> dict:
        params = {"tenant": TENANT, "offset": offset, "limit": 2, **times}
        r = client.get(f"/v1/subjects/{SUBJECT}/facts", params=params, headers=HEADERS)
        assert r.status_code == 200, r.text
        return r.json()

    first = page(0)
    pinned = {"as_of": first["as_of"], "known_at": first["receipt"]["known_at"]}
    later = rfc3339(datetime.now(UTC) + timedelta(seconds=5))
    writer.write(type="memory.retracted", key="k.a", observed_at=later, valid_from=day(4))  # between the pages
    second = page(2, **pinned)
    walked = [f["key"] for f in first["facts"] + second["facts"]]
    assert walked == ["k.a", "k.b", "k.c", "k.d"], walked
    assert "known_at" not in first and second["known_at"] == pinned["known_at"], second  # a view as known then says so
    shifted = [f["key"] for f in first["facts"] + page(2)["facts"]]  # unpinned: the rest moved up by one
    assert shifted == ["k.a", "k.b", "k.d"], shifted


def test_an_erasure_between_two_pages_leaves_the_cursor_valid(stack) -> None:
    writer, client = stack
    for n in range(5):
        writer.write(**asserted(f"v{n}", day(n), kind="state"))
    first = _replay(client, limit=2)
    erased = writer.write(type="subject.erased", key=None, observed_at=day(6))
    after = _replay(client, cursor=first["next_cursor"])
    assert [e["event_id"] for e in after["events"]] == [erased] and after["more"] is False


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS)
def test_a_cursor_that_is_no_position_is_refused_naming_it(stack, cursor: str) -> None:
    _, client = stack
    r = client.get(f"/v1/subjects/{SUBJECT}/events", params={"tenant": TENANT, "cursor": cursor}, headers=HEADERS)
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == ["cursor"], r.text


@pytest.mark.parametrize(
    ("cursor", "says"),
    [("2147483648:0", "past what Kafka holds"), ("0:9223372036854775808", "past what Kafka holds"),
     ("0:" + "9" * 20, "past what Kafka holds"), ("9" * 11 + ":0", "past what Kafka holds"),
     ("\u0663:5", "ASCII digits"), ("1:5:6", "ASCII digits")],
)  # fmt: skip
def test_a_cursor_is_refused_for_what_is_wrong_with_it(stack, cursor: str, says: str) -> None:
    """Digits in the cursor's form that name no place Kafka can hold are refused as that, not as non-digits."""
    _, client = stack
    r = client.get(f"/v1/subjects/{SUBJECT}/events", params={"tenant": TENANT, "cursor": cursor}, headers=HEADERS)
    assert r.status_code == 422 and says in r.json()["detail"][0]["message"], r.text


def test_the_audit_replay_says_what_each_event_did(stack) -> None:
    writer, client = stack
    first = writer.write(**asserted("aisle", day(0), kind="state"))
    second = writer.write(**asserted("window", day(2), kind="state"))
    late = writer.write(**asserted("middle", day(1), kind="state"))  # arrives last, holds in the past
    confirmed = writer.write(type="memory.confirmed", observed_at=day(3), valid_from=day(3))
    nothing = writer.write(type="memory.retracted", key="preference.meal", observed_at=day(3), valid_from=day(3))
    too_early = writer.write(type="memory.confirmed", observed_at=day(4), valid_from="2020-01-01T00:00:00Z")
    wrong_target = writer.write(
        type="memory.retracted", observed_at=day(4), valid_from=day(4), target_version=version_id_for(TENANT, "nope")
    )
    got = effects(client)
    assert got[second]["effect"] == "active"
    assert got[first]["effect"] == "superseded"
    assert got[late]["effect"] in ("history", "superseded")
    assert got[confirmed]["effect"] == "confirmed" and got[confirmed]["version_id"] == version_id_for(TENANT, second)
    for eid in (nothing, too_early, wrong_target):
        assert got[eid]["effect"] == "no_effect", got[eid]
        assert got[eid]["detail"], "a no-effect event says why"
