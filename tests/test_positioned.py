"""Every positioned projection keeps the same guarantees: the ledger's Recorder and the AccessProjector alike.

One class, run for each projection on real PostgreSQL: a batch over two partitions holding a poison record (one
PostgreSQL refuses, by a CHECK constraint added for the test) and a record the contract refuses, delivered,
redelivered whole, then redelivered with one new record. Each time both projections must give the same numbers:
what was applied, skipped and dead-lettered, under which codes, the positions (result and table), the dead
letters (once each, the database's reason for the poison one), their counters, and one log line per new letter.
The worker's path too: the one BatchRunner, decoding with the projection's own decoder, runs either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from producers.contract import AccessEvent, access_id_for, encode, encode_access
from producers.records import decode_record
from producers.settings import Settings
from projections.postgres.access_projector import AccessProjector, decode_access_record
from projections.postgres.counts import dead_letters_name
from projections.postgres.recorder import Recorder, connect
from projections.postgres.schema import create_schema
from stream_processors.agents import BatchRunner
from tests.conftest import unique
from tests.support import TENANT, asserted, cleanup, pg

POISON = "POISON"
NOT_JSON = b"\xff not json"  # bad_json for either contract, naming no tenant


def _ledger_raw(i: int, poison: bool = False) -> bytes:
    return encode(asserted(f"user:{i}", POISON if poison else f"k{i}", i))


def _access_raw(i: int, poison: bool = False) -> bytes:
    caller = POISON if poison else "key:tests"
    access_id = access_id_for(TENANT, caller, f"serving-{i}", f"m{i}", f"v{i}")
    return encode_access(
        AccessEvent(
            access_id=access_id,
            tenant=TENANT,
            memory_id=f"m{i}",
            version_id=f"v{i}",
            stage="keyword",
            caller=caller,
            accessed_at=datetime(2026, 2, 2, 9, 0, tzinfo=UTC),
        )
    )


# projection -> (its class, encode record i (poison or not), decode, the CHECK that makes a record poison)
KINDS: dict[str, tuple[type, Callable[..., bytes], Callable[..., Any], str]] = {
    "ledger": (
        Recorder,
        _ledger_raw,
        lambda t, p, o, raw: decode_record(t, p, o, raw, timestamp_ms=0),
        f"ALTER TABLE events ADD CONSTRAINT poison CHECK (key IS DISTINCT FROM '{POISON}')",
    ),
    "access": (
        AccessProjector,
        _access_raw,
        decode_access_record,
        f"ALTER TABLE accesses ADD CONSTRAINT poison CHECK (caller <> '{POISON}')",
    ),
}


@pytest.fixture(params=sorted(KINDS))
def world(request: pytest.FixtureRequest, base_settings: Settings) -> Iterator[dict[str, Any]]:
    kind, encode_one, decode_one, ddl = KINDS[request.param]
    settings = base_settings.private(unique("pos"))
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    try:
        with pg(settings) as conn:
            conn.execute(ddl)
        topic = settings.topic if kind is Recorder else settings.access_topic
        with connect(settings.pg_dsn, settings.pg_schema) as conn:
            yield {
                "settings": settings,
                "topic": topic,
                "projection": kind(conn, consumer="positioned-tests", topic=topic),
                "record": lambda p, o, raw: decode_one(topic, p, o, raw),
                "encode": encode_one,
            }
    finally:
        cleanup(settings)


def _table(settings: Settings, topic: str) -> dict[str, Any]:
    with pg(settings) as conn:
        return {
            "positions": dict(
                conn.execute('SELECT "partition", next_offset FROM positions WHERE topic = %s', (topic,)).fetchall()
            ),
            "letters": {
                (p, o): (code, message)
                for p, o, code, message in conn.execute(
                    'SELECT "partition", "offset", code, message FROM dead_letters WHERE topic = %s', (topic,)
                )
            },
            "counted": dict(
                conn.execute(
                    "SELECT tenant, sum(n)::int FROM counts WHERE name = %s GROUP BY tenant",
                    (dead_letters_name(topic),),
                ).fetchall()
            ),
        }


def _numbers(result: Any) -> tuple:
    return (result.applied, result.duplicates, result.skipped, result.dead, result.dead_codes, result.positions)


def test_a_redelivered_batch_with_a_poison_record_has_one_behaviour(world, caplog):
    settings, topic, projection = world["settings"], world["topic"], world["projection"]
    record, raw = world["record"], world["encode"]
    batch = [
        record(0, 0, raw(0)),
        record(0, 1, raw(1, poison=True)),  # PostgreSQL refuses it: bisected out, dead-lettered
        record(0, 2, NOT_JSON),  # the contract refuses it: dead-lettered before any write
        record(0, 3, raw(3)),
        record(1, 0, raw(4)),
    ]
    letters_logged = lambda: [r for r in caplog.records if r.getMessage().startswith("dead letter ")]  # noqa: E731

    with caplog.at_level(logging.WARNING, logger=type(projection).__module__):
        first = projection.apply_batch(batch)
    assert _numbers(first) == (3, 0, 0, 2, {"unstorable": 1, "bad_json": 1}, {0: 4, 1: 1})
    stored = _table(settings, topic)
    assert stored["positions"] == {0: 4, 1: 1}
    assert {po: code for po, (code, _) in stored["letters"].items()} == {(0, 1): "unstorable", (0, 2): "bad_json"}
    reason = stored["letters"][(0, 1)][1]
    assert reason.startswith("23514") and "poison" in reason, reason  # the database's SQLSTATE and constraint
    assert stored["counted"] == {TENANT: 1, "": 1}  # the poison record names its tenant; the garbage none
    assert len(letters_logged()) == 2
    assert any("bisecting" in r.getMessage() for r in caplog.records)

    caplog.clear()
    again = projection.apply_batch(batch)  # redelivered whole: nothing happens again
    assert _numbers(again) == (0, 0, 5, 0, {}, {0: 4, 1: 1})
    assert _table(settings, topic) == stored and letters_logged() == []

    later = projection.apply_batch([*batch[2:], record(0, 4, raw(5))])  # overlapping the end, one record new
    assert _numbers(later) == (1, 0, 3, 0, {}, {0: 5, 1: 1})
    assert _table(settings, topic)["positions"] == {0: 5, 1: 1}
    assert projection.positions() == {0: 5, 1: 1}


def test_the_one_runner_runs_either_projection_as_the_worker_does(world):
    settings, topic, raw = world["settings"], world["topic"], world["encode"]
    now_ms = int(time.time() * 1000)  # the broker's time: the ledger's decoder checks the clock skew against it
    batch = [  # as the agent hands it over: topic, partition, offset, key, value, timestamp
        (topic, 0, 0, b"k", raw(0), now_ms),
        (topic, 0, 1, b"k", raw(1, poison=True), now_ms),
        (topic, 0, 2, b"k", NOT_JSON, now_ms),
        (topic, 1, 0, b"k", raw(4), now_ms),
    ]
    runner = BatchRunner(settings, type(world["projection"]))
    try:
        assert runner.topic == topic
        assert _numbers(runner.apply(batch)) == (2, 0, 0, 2, {"unstorable": 1, "bad_json": 1}, {0: 3, 1: 1})
        assert _numbers(runner.apply(batch)) == (0, 0, 4, 0, {}, {0: 3, 1: 1})
        assert runner.positions({0, 1, 2}) == {0: 3, 1: 1, 2: 0}
        assert set(_table(settings, topic)["letters"]) == {(0, 1), (0, 2)}
    finally:
        runner.close()
