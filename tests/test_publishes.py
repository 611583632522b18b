"""One publish per event within an API process (api.resources.Publishes, api.writes._published_here): pure."""

from __future__ import annotations

import asyncio

import pytest

from api.resources import Publishes
from api.writes import _published_here
from producers.contract import from_dict
from projections.postgres.idempotency import Claim

pytestmark = pytest.mark.unit


def _event(event_id: str) -> object:
    return from_dict({"type": "memory.asserted", "tenant": "t", "event_id": event_id, "subject": "s", "key": "k",
                      "content": "c"})  # fmt: skip


def test_a_published_event_is_answered_its_position_until_its_record_is_refused() -> None:
    """A retry of an event this process published is answered the first publish's position (nothing sent again),
    unless the worker refused that very record since (a dead letter at its position: `Claim.letters`), as a record
    sealed with a key an erasure destroyed is: then it is the retry's to publish anew, as the letter's message asks;
    a letter of the id elsewhere (another content, refused before) changes nothing."""

    async def scenario() -> None:
        publishes = Publishes()
        key, fp = ("t", "e1"), "f1"
        first = {key: (0, _event("e1"))}
        published, mine = await _published_here(publishes, first, {key: Claim("new")}, {key: fp})
        assert (published, mine) == ({}, [key])
        publishes.finish((*key, fp), (3, 7))
        published, mine = await _published_here(publishes, first, {key: Claim("claimed")}, {key: fp})
        assert (published, mine) == ({key: (3, 7)}, [])
        elsewhere = Claim("claimed", letters=((3, 6),))  # a record of the id refused before this one: no matter
        published, mine = await _published_here(publishes, first, {key: elsewhere}, {key: fp})
        assert (published, mine) == ({key: (3, 7)}, [])
        published, mine = await _published_here(publishes, first, {key: Claim("claimed", letters=((3, 7),))}, {key: fp})
        assert (published, mine) == ({}, [key])
        publishes.finish((*key, fp), None)  # that publish failed: forgotten, the next ask sends it
        assert publishes.get((*key, fp)) is None

    asyncio.run(scenario())


def test_requests_for_the_same_event_at_once_wait_for_one_publish_and_never_for_each_other() -> None:
    """Two requests each holding an event the other publishes: each waits only for what it does not hold, so
    neither waits for the other (a request waits holding none of its own)."""

    async def scenario() -> None:
        publishes = Publishes()
        a, b = ("t", "a"), ("t", "b")
        events = {a: (0, _event("a")), b: (1, _event("b"))}
        fps = {a: "fa", b: "fb"}
        claims = {a: Claim("new"), b: Claim("new")}
        _, mine = await _published_here(publishes, events, claims, fps)
        assert mine == [a, b]
        waiting = asyncio.ensure_future(_published_here(publishes, events, claims, fps))
        await asyncio.sleep(0)
        assert not waiting.done()
        publishes.finish((*a, "fa"), (0, 1))
        publishes.finish((*b, "fb"), None)  # b failed: the waiter sends it itself
        published, mine = await asyncio.wait_for(waiting, 5)
        assert (published, mine) == ({a: (0, 1)}, [b])

    asyncio.run(scenario())
