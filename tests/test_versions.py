"""The pure version core (projections.versions): policies, order independence, invariants. No server."""

from __future__ import annotations

import dataclasses
import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest

from producers.contract import EventType, MemoryEvent, version_id_for
from projections.versions import (
    EFFECTS,
    Mark,
    Route,
    Version,
    apply,
    chain_problems,
    effects,
    fold,
    mark_of,
    new_version,
    route,
    visible_at,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(days: float) -> datetime:
    return T0 + timedelta(days=days)


def vid(eid: str) -> str:
    """The version_id of the assertion `eid` (tenant-scoped)."""
    return version_id_for("acme", eid)


def ev(
    eid: str,
    day: float,
    *,
    type: str = "memory.asserted",
    value=None,
    kind="state",
    to=None,
    obs=None,
    key="pref.drink",
    **kw,
):
    data = dict(
        event_id=eid,
        type=type,
        tenant="acme",
        subject="user:1",
        key=key,
        kind=kind,
        valid_from=at(day),
        observed_at=at(obs if obs is not None else day),
        **kw,
    )
    if type == "memory.asserted":
        data["content"] = f"drinks {value}"
        data["value"] = value
    if to is not None:
        data["valid_to"] = at(to)
    return MemoryEvent(**data)


class Store:
    """Applies changes the way the recorder does: rows by id, marks kept."""

    def __init__(self) -> None:
        self.rows: dict[str, Version] = {}
        self.marks: list[Mark] = []
        self.mark_fact: dict[str, str] = {}
        self.offset = 0

    def feed(self, event: MemoryEvent):
        self.offset += 1
        mid = event.memory_id  # the recorder hands apply() the rows and marks of the event's fact only
        rows = [v for v in self.rows.values() if v.memory_id == mid]
        marks = [m for m in self.marks if self.mark_fact[m.event_id] == mid]
        changes = apply(event, rows, marks, partition=0, offset=self.offset)
        for v in changes.outbox:
            self.rows[v.version_id] = v
        if route(event.type) is Route.MARK and event.event_id not in {m.event_id for m in self.marks}:
            self.marks.append(mark_of(event))
            self.mark_fact[event.event_id] = mid
        return changes

    def chain(self) -> list[Version]:
        return sorted(self.rows.values(), key=lambda v: v.version)


def state_of(rows):
    """Rows without the arrival-dependent columns (partition/offset)."""
    return sorted((dataclasses.replace(v, partition=0, offset=0) for v in rows), key=lambda v: v.version_id)


def test_state_supersedes_previous_version():
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("b", 1, value=2))
    a, b = s.chain()
    assert (a.status, a.superseded_by, a.superseded_at, a.version) == ("superseded", vid("b"), at(1), 1)
    assert (b.status, b.superseded_by, b.version) == ("active", None, 2)
    assert chain_problems(s.chain()) == []
    assert [v.value for v in visible_at(s.chain(), at(5))] == [2]
    assert [v.value for v in visible_at(s.chain(), at(0.5))] == [1]


def test_late_event_with_older_valid_from_becomes_history():
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("c", 10, value=3))
    changes = s.feed(ev("b", 5, value=2, obs=20))  # arrives last, holds in between
    assert {v.event_id for v in changes.inserts} == {"b"}
    assert {v.event_id for v in changes.updates} == {"a", "c"}  # a re-pointed, c renumbered
    a, b, c = s.chain()
    assert (a.superseded_by, b.superseded_by, c.superseded_by) == (vid("b"), vid("c"), None)
    assert (b.status, b.superseded_at, c.status, c.version) == ("superseded", at(10), "active", 3)
    assert [v.value for v in visible_at(s.chain(), at(7))] == [2]
    assert [v.value for v in visible_at(s.chain(), at(11))] == [3]


def test_duplicate_event_id_has_no_effect():
    s = Store()
    s.feed(ev("a", 0, value=1))
    before = s.chain()
    assert not s.feed(ev("a", 3, value=99))
    assert s.chain() == before
    s.feed(ev("r", 1, type="memory.confirmed"))
    assert not s.feed(ev("r", 1, type="memory.confirmed"))
    assert s.chain()[0].confirmed_count == 1


def test_preference_override_shadows_without_superseding():
    s = Store()
    s.feed(ev("long", 0, value="concise", kind="preference"))
    s.feed(ev("tmp", 5, value="detailed", kind="preference", to=6))
    long, tmp = s.chain()
    assert long.status == "active" and long.superseded_by is None
    assert tmp.status == "active" and tmp.valid_to == at(6)
    assert [v.value for v in visible_at(s.chain(), at(5.5))] == ["detailed"]
    assert [v.value for v in visible_at(s.chain(), at(7))] == ["concise"]
    assert [v.value for v in visible_at(s.chain(), at(4))] == ["concise"]
    # an open-ended preference still supersedes the long-term one
    s.feed(ev("new", 8, value="bullet points", kind="preference"))
    assert s.rows[vid("long")].superseded_by == vid("new") and s.rows[vid("tmp")].superseded_by is None
    assert chain_problems(s.chain()) == []


def test_episodic_is_append_only():
    s = Store()
    e1 = MemoryEvent(event_id="e1", type="memory.asserted", tenant="acme", subject="u", kind="episodic", content="x")
    e2 = MemoryEvent(event_id="e2", type="memory.asserted", tenant="acme", subject="u", kind="episodic", content="y")
    assert e1.memory_id != e2.memory_id
    for e in (e1, e2):
        s.feed(e)
    assert {(v.status, v.version, v.superseded_by) for v in s.chain()} == {("active", 1, None)}


def test_retraction_ends_the_active_version():
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("b", 2, value=2))
    s.feed(ev("r", 4, type="memory.retracted"))
    a, b = s.chain()
    assert (b.status, b.valid_to) == ("retracted", at(4))
    assert a.status == "superseded"
    assert visible_at(s.chain(), at(5)) == []
    assert [v.value for v in visible_at(s.chain(), at(3))] == [2]
    # a later assertion makes the fact current again
    s.feed(ev("c", 6, value=3))
    assert [v.value for v in visible_at(s.chain(), at(7))] == [3]
    assert chain_problems(s.chain()) == []


def test_retraction_then_late_assertion_before_it_is_retracted_too():
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("r", 5, type="memory.retracted"))
    s.feed(ev("b", 3, value=2, obs=9))  # holds from 3, so the retraction at 5 ends it, not a
    a, b = s.chain()
    assert (a.status, a.valid_to, a.superseded_by) == ("superseded", None, vid("b"))
    assert (b.status, b.valid_to) == ("retracted", at(5))


def seat_history(s: Store) -> None:
    """Long-term `seat=aisle` (a preference) and a one-week override `window` from day 5 to day 12."""
    s.feed(ev("long", 0, value="aisle", kind="preference"))
    s.feed(ev("tmp", 5, value="window", kind="preference", to=12))


def seats(s: Store, *days: float) -> list[list[str]]:
    return [[v.value for v in visible_at(s.chain(), at(d))] for d in days]


def test_untargeted_retraction_ends_the_override_and_keeps_the_long_term_value():
    """Retracting `seat` during the override means "not the window seat", not "no seat"."""
    s = Store()
    seat_history(s)
    s.feed(ev("r", 7, type="memory.retracted"))
    assert (s.rows[vid("tmp")].status, s.rows[vid("tmp")].valid_to) == ("retracted", at(7))
    assert (s.rows[vid("long")].status, s.rows[vid("long")].valid_to) == ("active", None)
    assert seats(s, 4, 6, 8, 13) == [["aisle"], ["window"], ["aisle"], ["aisle"]]
    assert chain_problems(s.chain()) == []


@pytest.mark.parametrize("day", [9, 7, 13])
def test_a_second_retraction_then_ends_the_long_term_value(day):
    s = Store()
    seat_history(s)
    s.feed(ev("r1", 7, type="memory.retracted"))
    s.feed(ev("r2", day, type="memory.retracted", obs=day + 0.1))  # at 7 too: it comes after r1 (observed later)
    assert (s.rows[vid("long")].status, s.rows[vid("long")].valid_to) == ("retracted", at(day))
    assert (s.rows[vid("tmp")].status, s.rows[vid("tmp")].valid_to) == ("retracted", at(7))
    assert seats(s, 4, day - 0.5 if day > 7 else 6, day + 0.5) == [["aisle"], ["aisle" if day > 7 else "window"], []]


def test_untargeted_retraction_without_an_override_ends_the_main_lane_version():
    s = Store()
    seat_history(s)
    s.feed(ev("r", 2, type="memory.retracted"))  # before the window: the long-term value was visible
    assert (s.rows[vid("long")].status, s.rows[vid("long")].valid_to) == ("retracted", at(2))
    assert (s.rows[vid("tmp")].status, s.rows[vid("tmp")].valid_to) == ("active", at(12))
    assert seats(s, 1, 3, 6, 13) == [["aisle"], [], ["window"], []]


def test_targeted_retraction_of_the_long_term_value_while_an_override_is_in_force():
    s = Store()
    seat_history(s)
    s.feed(ev("r", 7, type="memory.retracted", target_version=vid("long")))
    assert (s.rows[vid("long")].status, s.rows[vid("long")].valid_to) == ("retracted", at(7))
    assert (s.rows[vid("tmp")].status, s.rows[vid("tmp")].valid_to) == ("active", at(12))
    assert seats(s, 4, 6, 8, 13) == [["aisle"], ["window"], ["window"], []]


def test_targeted_retraction_of_the_override_ends_exactly_it():
    s = Store()
    seat_history(s)
    s.feed(ev("r", 6, type="memory.retracted", target_version=vid("tmp")))
    assert (s.rows[vid("tmp")].status, s.rows[vid("tmp")].valid_to) == ("retracted", at(6))
    assert s.rows[vid("long")].status == "active"
    assert seats(s, 5.5, 7) == [["window"], ["aisle"]]


@pytest.mark.parametrize(
    "target, day",
    [
        ("tmp", 3),  # before the override's window
        ("tmp", 12),  # at its end (valid_to is exclusive)
        ("tmp", 20),  # after it
        ("a", 4),  # a main-lane version already superseded at 2
        ("b", 1),  # a main-lane version not yet in force
        ("nothing", 6),  # no such version at all
    ],
)
def test_a_target_not_in_force_has_no_effect(target, day):
    s = Store()
    seat_history(s)
    s.feed(ev("a", 0, value="x"))  # same key, state kind: joins the main lane with `long`
    s.feed(ev("b", 2, value="y"))
    before = s.chain()
    assert not s.feed(ev("r", day, type="memory.retracted", target_version=vid(target)))
    assert s.chain() == before


def test_a_target_in_another_fact_has_no_effect():
    s = Store()
    seat_history(s)
    s.feed(ev("food", 0, value="vegetarian", key="pref.food"))
    s.feed(ev("other-tenant", 0, value="aisle").model_copy(update={"tenant": "other"}))
    before = s.chain()
    for i, target in enumerate((vid("food"), version_id_for("other", "other-tenant"), version_id_for("other", "long"))):
        assert not s.feed(ev(f"r{i}", 6, type="memory.retracted", target_version=target))
    assert s.chain() == before
    assert [v.value for v in visible_at(s.chain(), at(6)) if v.key == "pref.drink" and v.tenant == "acme"] == ["window"]


def test_retractions_with_targets_give_the_same_chain_in_any_order():
    history = [
        ev("long", 0, value="aisle", kind="preference"),
        ev("tmp", 5, value="window", kind="preference", to=12),
        ev("later", 20, value="middle", kind="preference", obs=21),
        ev("r1", 7, type="memory.retracted"),
        ev("r2", 7, type="memory.retracted", obs=8),
        ev("t1", 22, type="memory.retracted", target_version=vid("later")),
        ev("t2", 6, type="memory.retracted", target_version=vid("tmp")),
        ev("c", 3, type="memory.confirmed"),
    ]
    reference = None
    rng = random.Random(10)
    orders = [history, history[::-1]] + [rng.sample(history, len(history)) for _ in range(300)]
    for order in orders:
        s = Store()
        for e in order:
            s.feed(e)
        got = state_of(s.rows.values())
        reference = reference or got
        assert got == reference
    rows = {v.event_id: v for v in reference}
    # t2 ends the override at 6, so r1 (at 7) ends the long-term version and r2 finds nothing
    assert (rows["tmp"].status, rows["tmp"].valid_to) == ("retracted", at(6))
    assert (rows["long"].status, rows["long"].valid_to) == ("retracted", at(7))
    assert (rows["later"].status, rows["later"].valid_to) == ("retracted", at(22))


def test_confirmation_counts_on_the_version_in_force():
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("c1", 1, type="memory.confirmed"))
    s.feed(ev("c2", 2, type="memory.confirmed"))
    a = s.chain()[0]
    assert (a.confirmed_count, a.last_confirmed_at, a.value) == (2, at(2), 1)
    assert len(s.rows) == 1  # no new value


def test_new_version_copies_the_event():
    e = ev("a", 0, value={"port": 8080}, entities=["P1"], source={"type": "explicit"})
    v = new_version(e, partition=3, offset=42)
    assert (v.partition, v.offset, v.confidence, v.entities, v.source) == (3, 42, 1.0, ("P1",), {"type": "explicit"})
    assert (v.version_id, v.event_id) == (e.version_id, "a") == (vid("a"), "a")


def test_version_ids_are_tenant_scoped():
    """The same producer-chosen event_id in two tenants makes two distinct versions."""
    mine, theirs = ev("same", 0, value=1), ev("same", 0, value=1).model_copy(update={"tenant": "other"})
    assert new_version(mine, 0, 0).version_id != new_version(theirs, 0, 1).version_id
    assert new_version(mine, 0, 0).event_id == new_version(theirs, 0, 1).event_id == "same"


def test_every_event_type_has_a_route():
    """One exhaustive dispatch: a new EventType without a route fails here, not in a stalled worker."""
    expected = {
        EventType.ASSERTED: Route.VERSION,
        EventType.RETRACTED: Route.MARK,
        EventType.CONFIRMED: Route.MARK,
        EventType.ERASED: Route.ERASURE,
        EventType.DISCARDED: Route.RESOLUTION,
    }
    for member in EventType:
        assert route(member) is expected.get(member), f"{member!r} has no route"


def test_mark_carries_its_target():
    target = vid("long")
    assert mark_of(ev("r", 1, type="memory.retracted", target_version=target)).target == target
    assert mark_of(ev("r", 1, type="memory.retracted")).target is None
    assert mark_of(ev("c", 1, type="memory.confirmed")).target is None


def test_erasure_changes_no_fact():
    erase = MemoryEvent(event_id="x", type="subject.erased", tenant="acme", subject="user:1")
    assert not apply(erase, [], [], partition=0, offset=0)
    with pytest.raises(ValueError):
        new_version(erase, 0, 0)
    with pytest.raises(ValueError):
        mark_of(erase)


def _random_history(rng: random.Random, n: int) -> list[MemoryEvent]:
    out = []
    for i in range(n):
        day = rng.randrange(0, 30)
        roll = rng.random()
        if roll < 0.5:
            out.append(ev(f"s{i}", day, value=i, obs=day + rng.random()))
        elif roll < 0.65:
            out.append(ev(f"p{i}", day, value=i, kind="preference", to=day + rng.randrange(1, 5)))
        elif roll < 0.75:
            out.append(ev(f"r{i}", day, type="memory.retracted"))
        elif roll < 0.85:  # targeted at any assertion of the history (in force at `day` or not), or at nothing
            target = vid(f"{rng.choice('sp')}{rng.randrange(n)}")
            out.append(ev(f"t{i}", day, type="memory.retracted", target_version=target))
        else:
            out.append(ev(f"c{i}", day, type="memory.confirmed"))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_any_arrival_order_gives_the_same_chain_and_invariants_hold(seed):
    rng = random.Random(seed)
    history = _random_history(rng, rng.randrange(2, 12))
    reference = None
    for _ in range(6):
        order = history[:]
        rng.shuffle(order)
        s = Store()
        for e in order + order[:2]:  # with some redelivered duplicates
            s.feed(e)
            assert chain_problems(list(s.rows.values())) == []
        got = state_of(s.rows.values())
        reference = reference or got
        assert got == reference
    # the incremental result equals one fold over everything
    s_once = fold(
        [new_version(e, 0, 0) for e in history if e.type is EventType.ASSERTED],
        [mark_of(e) for e in history if e.type is not EventType.ASSERTED],
    )
    assert state_of(s_once) == reference
    for day in range(0, 32, 3):
        per_fact = visible_at(s_once, at(day + 0.5))
        assert len(per_fact) <= 1


def test_chain_problems_detects_broken_chains():
    s = Store()
    for e in (ev("a", 0, value=1), ev("b", 1, value=2)):
        s.feed(e)
    a, b = s.chain()
    assert chain_problems([dataclasses.replace(a, superseded_at=None), b])
    assert chain_problems([a, dataclasses.replace(b, version=3)])
    assert chain_problems([dataclasses.replace(a, status="active", superseded_by=None, superseded_at=None), b])
    assert chain_problems([a, dataclasses.replace(b, superseded_by="zz", superseded_at=at(3), status="superseded")])


def test_all_pairs_of_two_assertions_keep_one_current():
    for (d1, k1), (d2, k2) in itertools.product([(0, "state"), (1, "preference")], repeat=2):
        s = Store()
        s.feed(ev("x", d1, value=1, kind=k1))
        s.feed(ev("y", d2 + 0.5, value=2, kind=k2))
        current = [v for v in s.rows.values() if v.status == "active" and v.superseded_by is None]
        assert len(current) == 1


def effects_of(s: Store) -> dict[str, tuple[str, str | None]]:
    return {eid: (e["effect"], e["version_id"]) for eid, e in effects(s.rows.values(), s.marks).items()}


def test_effects_of_assertions_active_superseded_history():
    """The audit replay says what each event did."""
    s = Store()
    s.feed(ev("a", 0, value=1))
    s.feed(ev("c", 10, value=3))
    s.feed(ev("b", 5, value=2, obs=20))  # arrives last with an older valid_from: history
    got = effects(s.rows.values(), s.marks)
    assert {k: v["effect"] for k, v in got.items()} == {"a": "superseded", "b": "history", "c": "active"}
    assert got["c"]["version_id"] == vid("c")
    assert "arrived after c" in got["b"]["detail"] and "superseded by b" in got["a"]["detail"]


def test_effects_of_retractions_say_what_they_ended_or_why_nothing():
    s = Store()
    seat_history(s)
    assert effects_of(s) == {"long": ("active", vid("long")), "tmp": ("override", vid("tmp"))}
    s.feed(ev("r1", 7, type="memory.retracted"))
    s.feed(ev("r2", 7, type="memory.retracted", obs=8))
    s.feed(ev("r3", 8, type="memory.retracted"))
    s.feed(ev("t1", 10, type="memory.retracted", target_version=vid("tmp")))
    s.feed(ev("t3", 20, type="memory.retracted", target_version=vid("tmp")))
    s.feed(ev("t2", 6, type="memory.retracted", target_version=vid("food")))
    got = effects(s.rows.values(), s.marks)
    assert {k: (v["effect"], v["version_id"]) for k, v in got.items()} == {
        "long": ("retracted", vid("long")),
        "tmp": ("retracted", vid("tmp")),
        "r1": ("ended", vid("tmp")),
        "r2": ("ended", vid("long")),
        "r3": ("no_effect", None),
        "t1": ("no_effect", None),
        "t2": ("no_effect", None),
        "t3": ("no_effect", None),
    }
    assert "by retraction r1" in got["tmp"]["detail"] and "override tmp" in got["r1"]["detail"]
    assert got["r3"]["detail"] == (
        "no version in force at 2026-01-09T00:00:00.000000Z (already retracted: "
        "tmp at 2026-01-08T00:00:00.000000Z by r1, long at 2026-01-08T00:00:00.000000Z by r2)"
    )
    assert got["t1"]["detail"] == (
        "target tmp not in force at 2026-01-11T00:00:00.000000Z "
        "(already retracted: tmp at 2026-01-08T00:00:00.000000Z by r1)"
    )
    assert got["t3"]["detail"] == "target tmp not in force at 2026-01-21T00:00:00.000000Z"  # its window was over
    assert "is not a version of this fact" in got["t2"]["detail"]


def test_effects_of_confirmations():
    s = Store()
    s.feed(ev("c0", 0, type="memory.confirmed"))  # before anything was asserted
    s.feed(ev("tmp", 5, value="window", kind="preference", to=12))
    s.feed(ev("c1", 6, type="memory.confirmed"))  # only an override in force: confirmations count on the main lane
    s.feed(ev("a", 8, value="aisle", kind="preference"))
    s.feed(ev("c2", 9, type="memory.confirmed"))
    got = effects(s.rows.values(), s.marks)
    assert (got["c2"]["effect"], got["c2"]["version_id"]) == ("confirmed", vid("a"))
    assert (got["c0"]["effect"], got["c0"]["detail"]) == (
        "no_effect",
        "no version in force at 2026-01-01T00:00:00.000000Z",
    )
    assert (got["c1"]["effect"], got["c1"]["detail"]) == (
        "no_effect",
        "no long-term version in force at 2026-01-07T00:00:00.000000Z",
    )
    assert s.rows[vid("a")].confirmed_count == 1


def test_marks_of_a_fact_that_never_existed_have_no_effect():
    marks = [
        mark_of(ev("r", 1, type="memory.retracted")),
        mark_of(ev("t", 1, type="memory.retracted", target_version=vid("x"))),
        mark_of(ev("c", 1, type="memory.confirmed")),
    ]
    got = effects([], marks)
    assert {k: v["effect"] for k, v in got.items()} == {"r": "no_effect", "t": "no_effect", "c": "no_effect"}
    assert all(v["version_id"] is None and v["detail"] for v in got.values())


@pytest.mark.parametrize("seed", range(25))
def test_effects_cover_every_event_agree_with_the_chain_and_ignore_order(seed):
    rng = random.Random(seed)
    history = _random_history(rng, rng.randrange(2, 14))
    versions = [new_version(e, 0, 0) for e in history if e.type is EventType.ASSERTED]
    marks = [mark_of(e) for e in history if e.type is not EventType.ASSERTED]
    got = effects(versions, marks)
    assert set(got) == {e.event_id for e in history}
    assert all(v["effect"] in EFFECTS and isinstance(v["detail"], str) and v["detail"] for v in got.values())
    for _ in range(4):
        assert effects(rng.sample(versions, len(versions)), rng.sample(marks, len(marks))) == got
    rows = {v.version_id: v for v in fold(versions, marks)}
    ended = sorted(v["version_id"] for v in got.values() if v["effect"] == "ended")
    assert ended == sorted(vid for vid, v in rows.items() if v.status == "retracted")  # each retraction ends one
    confirms = [v["version_id"] for v in got.values() if v["effect"] == "confirmed"]
    assert all(rows[vid].confirmed_count == confirms.count(vid) for vid in rows)
    for v in rows.values():
        assert got[v.event_id]["version_id"] == v.version_id
        assert (got[v.event_id]["effect"] == "retracted") == (v.status == "retracted")


def test_one_dispatch_serves_every_event_type() -> None:
    """`additions` is the recorder's and apply's one path: every type lands somewhere (or is the erasure barrier)."""
    from producers.contract import EventType, from_dict
    from projections.versions import Route, additions, route

    base = {"tenant": "t", "subject": "s", "key": "k", "content": "c", "observed_at": "2026-01-01T00:00:00Z"}
    for event_type in EventType:
        data = {**base, "type": event_type.value}
        if event_type is EventType.ERASED:
            data = {k: v for k, v in data.items() if k not in ("key", "content")}
        if event_type is EventType.DISCARDED:
            data |= {"dead_letter": {"partition": 0, "offset": 3}, "reason": "r"}
        event = from_dict(data)
        if route(event_type) is Route.ERASURE:
            with pytest.raises(ValueError, match="purges the subject"):
                additions([(event, 0, 0)])
            continue
        if route(event_type) is Route.RESOLUTION:  # a dead letter's resolution: the recorder's, no fact's
            assert additions([(event, 0, 7)]).facts == [], event_type
            continue
        added = additions([(event, 0, 7)])
        assert added.facts == [event.memory_id], event_type
