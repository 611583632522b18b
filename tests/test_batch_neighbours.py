"""A record's batch neighbours never change what it does: the same records in one batch or one at a time give the
same projection (`projection_checksum`, what `ledger verify` compares with a rebuild, which batches otherwise).

Against the real PostgreSQL, through the recorder: each case is a history applied one event at a time, then records
a raw producer could put in one batch, applied as one batch into one schema and one by one into another. The
cases are the neighbours that made a difference: another tenant's mark sharing an event id (its stored twin was
left out of a refold: a retracted fact of the other tenant came back), an assertion refused for its id (a
retraction naming its version was filed under that version's fact, as though it had been logged), and a retraction
refused for its id (the record logged under that id was filed under the fact the refused one aimed at).

Records of one subject in two partitions (a raw producer keying it otherwise) have no offset order: an erasure covers
those of another partition logged at or before it by the log's timestamps, whichever the worker reaches first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import orjson
import psycopg
import pytest

from producers.contract import EventType, MemoryEvent, encode, version_id_for
from producers.records import Incoming, decode_record
from producers.settings import Settings
from projections.postgres.queries import projection_checksum
from tests.conftest import unique
from tests.support import RecorderWriter, wire
from tests.support.events import asserted, at, episode, erased, marked
from tests.support.stores import private_schema

Case = tuple[list[MemoryEvent], list[MemoryEvent]]  # (the history before, one batch's records)


def _other_tenants_mark_with_the_same_id(mark: EventType) -> Case:
    history = [
        asserted("user:g", "seat", "window", 1, tenant="globex", event_id="g-1"),
        marked(EventType.RETRACTED, "user:g", "seat", 2, tenant="globex", event_id="shared-id"),
    ]
    batch = [
        marked(EventType.CONFIRMED, "user:g", "seat", 3, tenant="globex", event_id="g-confirm"),
        asserted("user:a", "seat", "aisle", 3, tenant="acme", event_id="a-1"),
        marked(mark, "user:a", "seat", 4, tenant="acme", event_id="shared-id"),
    ]
    return history, batch


def _a_refused_assertion_before_a_retraction_of_its_version() -> Case:
    history = [
        asserted("user:r", "seat", "window", 1, event_id="r-1"),
        marked(EventType.CONFIRMED, "user:r", "seat", 2, event_id="taken-id"),
    ]
    batch = [
        asserted("user:r", "seat", "aisle", 3, event_id="taken-id"),  # the id is a confirmation's: refused
        MemoryEvent(
            type=EventType.RETRACTED,
            tenant="acme",
            subject="user:r",
            valid_from=history[0].valid_from,
            observed_at=history[1].observed_at,
            event_id="r-retract",
            target_version=version_id_for("acme", "taken-id"),
        ),  # fmt: skip
        asserted("user:r", "seat", "middle", 4, event_id="r-2"),
    ]
    return history, batch


def _a_refused_retraction_of_an_episode_sharing_a_logged_records_id(logged: EventType) -> Case:
    history = [
        episode("user:e", "we talked about seats", at(1), "chat", event_id="e-ep"),
        asserted("user:e", "seat", "window", 2, event_id="e-1"),
    ]
    first = (
        asserted("user:e", "seat", "aisle", 3, event_id="shared")
        if logged is EventType.ASSERTED
        else marked(logged, "user:e", "seat", 3, event_id="shared")
    )
    refused = MemoryEvent(
        type=EventType.RETRACTED, tenant="acme", subject="user:e", valid_from=at(3), observed_at=at(3),
        event_id="shared", target_version=version_id_for("acme", "e-ep"),
    )  # fmt: skip
    return history, [first, refused]


CASES: dict[str, Callable[[], Case]] = {
    "another tenant's retraction with the same id": lambda: _other_tenants_mark_with_the_same_id(EventType.RETRACTED),
    "another tenant's confirmation with the same id": lambda: _other_tenants_mark_with_the_same_id(EventType.CONFIRMED),
    "a refused assertion before a retraction of its version": _a_refused_assertion_before_a_retraction_of_its_version,
    **{
        f"a refused retraction of an episode with the id of a logged {t.value}": (
            lambda t=t: _a_refused_retraction_of_an_episode_sharing_a_logged_records_id(t)
        )
        for t in (EventType.RETRACTED, EventType.CONFIRMED, EventType.ASSERTED)
    },
}


def _applied(settings: Settings, history: list[MemoryEvent], batch: list[MemoryEvent], *, together: bool) -> str:
    with private_schema(settings), RecorderWriter(settings) as ledger:
        for event in history:
            ledger.apply(event)
        if together:
            ledger.apply(*batch)
        else:
            for event in batch:
                ledger.apply(event)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            return projection_checksum(conn, settings.pg_schema)


@pytest.mark.parametrize("case", list(CASES))
def test_one_batch_and_one_record_at_a_time_give_the_same_projection(base_settings: Settings, case: str) -> None:
    history, batch = CASES[case]()
    together = _applied(base_settings.private(unique("nb")), history, batch, together=True)
    alone = _applied(base_settings.private(unique("nb")), history, batch, together=False)
    assert together == alone, case


def test_another_tenants_mark_with_the_same_id_leaves_a_retracted_fact_retracted(base_settings: Settings) -> None:
    """The case as a tenant sees it: globex's retracted fact stays retracted whatever acme's batch holds."""
    settings = base_settings.private(unique("nb"))
    history, batch = _other_tenants_mark_with_the_same_id(EventType.CONFIRMED)
    with private_schema(settings) as conn, RecorderWriter(settings) as ledger:
        for event in history:
            ledger.apply(event)
        ledger.apply(*batch)
        rows = conn.execute("SELECT status FROM fact_versions WHERE tenant = 'globex'").fetchall()
    assert rows == [("retracted",)], rows


def test_resolutions_of_one_letter_in_one_batch_are_written_without_bisecting(
    base_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Two re-drives and a discard of one letter in one batch: its first resolution in ledger position is written
    by the batch's one statement, not after a bisection parting them (which would also keep the first)."""
    settings = base_settings.private(unique("nb"))
    link = {"dead_letter": {"partition": 0, "offset": 0}}
    fixes = [wire("user:l", event_id=f"fix-{n}", value=n) | link for n in (1, 2)]
    discard = {"type": "deadletter.discarded", "tenant": "acme", "subject": "user:l", "event_id": "deadletter:0:0"}
    raws = [orjson.dumps(wire("user:l", event_id="bad", content=...)), *map(orjson.dumps, [*fixes, discard | link])]
    records = [decode_record(settings.topic, 0, o, raw, timestamp_ms=0) for o, raw in enumerate(raws)]
    with private_schema(settings) as conn, RecorderWriter(settings) as ledger:
        ledger.recorder.apply_batch(records[:1])
        with caplog.at_level(logging.WARNING):
            ledger.recorder.apply_batch(records[1:])
        rows = conn.execute("SELECT state, event_id FROM dead_letter_resolutions").fetchall()
    assert not [r for r in caplog.records if "bisecting" in r.getMessage()], caplog.text
    assert rows == [("redriven", "fix-1")], rows


_T = 1_700_000_000_000  # the erasure's log time (ms)


def _record(settings: Settings, partition: int, offset: int, value: bytes, dt_ms: int) -> Incoming:
    return decode_record(settings.topic, partition, offset, value, timestamp_ms=_T + dt_ms)


def _erasure(settings: Settings) -> Incoming:
    return _record(settings, 0, 0, encode(erased("user:x", event_id="x-erased", observed_at=at(2))), 0)


def _state(conn: psycopg.Connection, settings: Settings) -> tuple:
    """The projection's checksum and what it leaves out that an erasure writes: letters' resolutions, the erased
    ids and version ids (how many), the letters."""
    return (
        projection_checksum(conn, settings.pg_schema),
        *(
            tuple(conn.execute(q).fetchall())
            for q in (
                "SELECT event_id, status FROM fact_versions ORDER BY 1",
                'SELECT "partition", "offset", state, event_id FROM dead_letter_resolutions',
                "SELECT count(*), count(fp_hash) FROM erased_events",  # salted per schema: counted
                "SELECT count(*) FROM erased_versions",
                'SELECT "partition", "offset", code, raw IS NULL FROM dead_letters ORDER BY 1, 2',
            )
        ),
    )


def _ends(base_settings: Settings, orders: dict[str, Callable[[Settings], list[Incoming]]]) -> dict[tuple, tuple]:
    """Each order of records applied as one batch and one record at a time, each into a schema of its own, and a
    re-send of every record after them: (order, together) -> `_state`, the re-sends' result."""
    found = {}
    for name, records_of in orders.items():
        for together in (True, False):
            settings = base_settings.private(unique("nb"))
            records = records_of(settings)
            with private_schema(settings) as conn, RecorderWriter(settings) as ledger:
                for batch in [records] if together else [[r] for r in records]:
                    ledger.recorder.apply_batch(batch)
                again = [_record(settings, 3, n, r.raw, 10**8) for n, r in enumerate(x for x in records if x.partition)]
                replay = ledger.recorder.apply_batch(again)
                found[(name, together)] = (_state(conn, settings), (replay.applied, replay.erased_replays))
    return found


def _cross_partition(settings: Settings, logged_after: bool) -> list[Incoming]:
    """A refused record of user:x and a re-drive of its letter asserting a fact, at partition 1, logged before the
    erasure of user:x at partition 0 (the re-drive a second after it: `logged_after`)."""
    bad = orjson.dumps({**orjson.loads(encode(asserted("user:x", "seat", "aisle", 1))), "content": None})
    fix = asserted("user:x", "seat", "window", 1, event_id="x-1").model_copy(
        update={"dead_letter": {"partition": 1, "offset": 0}}
    )
    return [_record(settings, 1, 0, bad, -2000), _record(settings, 1, 1, encode(fix), 1000 if logged_after else -1000)]


@pytest.mark.parametrize("logged_after", [False, True], ids=["logged before", "logged after"])
def test_an_erasure_covers_its_subjects_records_in_another_partition_by_log_time(
    base_settings: Settings, logged_after: bool
) -> None:
    """Logged before the erasure, the other partition's records go with the subject in every order and batching:
    the projection, the letter's resolution, the erased ids and version ids end the same, and a re-send is an erased
    replay; logged after it, the re-drive is news when the worker reaches it after the erasure."""
    found = _ends(
        base_settings,
        {
            "erasure first": lambda st: [_erasure(st), *_cross_partition(st, logged_after)],
            "erasure last": lambda st: [*_cross_partition(st, logged_after), _erasure(st)],
        },
    )
    if not logged_after:
        assert len(set(found.values())) == 1, found
        (state, replay) = found[("erasure first", True)]
        assert state[1] == () and state[2] == ((1, 0, "redriven", None),) and replay == (0, 1), found
    else:  # news once the erasure is applied; applied before it, it went with the subject (in doubt, erased)
        first = found[("erasure first", True)]
        assert first[0][1] == (("x-1", "active"),) and first[0][2] == ((1, 0, "redriven", "x-1"),), found
        assert found[("erasure first", False)] == first, found
        assert all(v[0][1] == () for k, v in found.items() if k[0] == "erasure last"), found


def test_a_covered_record_never_takes_the_id_of_news_before_it_in_the_batch(base_settings: Settings) -> None:
    """One id in two other partitions: news logged after the erasure, then a record logged before it. One batch or
    one at a time, the news is applied and the covered one is refused for its id (a conflict), as first come."""

    def records(settings: Settings) -> list[Incoming]:
        news = encode(asserted("user:x", "seat", "window", 3, event_id="same-id"))
        old = encode(asserted("user:x", "seat", "aisle", 1, event_id="same-id"))
        return [_erasure(settings), _record(settings, 2, 0, news, 1000), _record(settings, 1, 0, old, -1000)]

    found = _ends(base_settings, {"news first": records})
    assert found[("news first", True)] == found[("news first", False)], found
    assert found[("news first", True)][0][1] == (("same-id", "active"),), found


def test_news_retracting_a_covered_records_version_is_filed_as_when_that_record_was_never_logged(
    base_settings: Settings,
) -> None:
    """A retraction logged after the erasure names the version of a record it covers, both in other partitions:
    one batch or one at a time, the covered record is not there to file the retraction under."""

    def records(settings: Settings) -> list[Incoming]:
        old = encode(asserted("user:x", "seat", "aisle", 1, event_id="x-old"))
        retraction = MemoryEvent(
            type=EventType.RETRACTED, tenant="acme", subject="user:x", valid_from=at(3), observed_at=at(3),
            event_id="x-retract", target_version=version_id_for("acme", "x-old"),
        )  # fmt: skip
        return [
            _erasure(settings),
            _record(settings, 1, 0, old, -1000),
            _record(settings, 2, 0, encode(retraction), 1000),
        ]

    found = _ends(base_settings, {"erasure first": records})
    assert found[("erasure first", True)] == found[("erasure first", False)], found


@pytest.mark.parametrize("erasing", [True, False], ids=["an erasure's batch", "another batch"])
def test_an_erasure_and_a_record_of_another_worker_never_commit_unseen_by_each_other(
    base_settings: Settings, erasing: bool
) -> None:
    """Two workers apply their partitions at once, each in its own transaction: a batch holding an erasure waits for
    every batch under way in the schema (here one of another worker, held open), and any other batch waits for a
    batch holding an erasure; batches without one never wait for each other."""
    settings = base_settings.private(unique("nb"))
    with private_schema(settings) as conn, RecorderWriter(settings) as ledger:
        ledger.conn.execute("SET lock_timeout = '20s'")  # a gate that never opens fails here, not at the suite's end
        ledger.conn.commit()
        ledger.apply(asserted("user:w", "seat", "window", 1, event_id="w-1"))
        gate = "hashtextextended(current_schema() || '/erasure gate', 0)"
        with psycopg.connect(settings.pg_dsn) as other:  # another worker's transaction, under way
            other.execute(f"SET search_path TO {settings.pg_schema}")
            other.execute(f"SELECT pg_advisory_xact_lock{'_shared' if erasing else ''}({gate})")
            erasure = encode(erased("user:x", event_id="x-erased", observed_at=at(2)))
            fact = encode(asserted("user:v", "k", 1, 2))
            record = _record(settings, 0, 1, erasure, 0) if erasing else _record(settings, 1, 0, fact, 0)
            done = threading.Event()
            worker = threading.Thread(target=lambda: (ledger.recorder.apply_batch([record]), done.set()))
            worker.start()
            assert not done.wait(1.0), "applied while the other worker's batch was under way"
            other.rollback()
            assert done.wait(30), "never applied"
            worker.join(5)
        with psycopg.connect(settings.pg_dsn) as third:  # two batches without an erasure share the gate
            third.execute(f"SET search_path TO {settings.pg_schema}")
            third.execute(f"SELECT pg_advisory_xact_lock_shared({gate})")
            result = ledger.recorder.apply_batch([_record(settings, 2, 0, encode(asserted("user:u", "k", 1, 3)), 0)])
            assert result.applied == 1
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 3
