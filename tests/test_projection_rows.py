"""The rows a batch writes hold exactly what its events say, whatever the values.

The recorder hands a batch's rows to PostgreSQL as one jsonb document (orjson) that the statements take apart and
cast to each column's type, so every column of `events` and `fact_versions` must come back as the event (and the
pure core's fold) has it: text with quotes, backslashes, control characters, astral characters and PostgreSQL's
array syntax; floats at their limits; integers at the 64-bit bounds; times with microseconds given in other
offsets; NULLs against empty values. Real PostgreSQL, the Recorder in process, decoded as the worker decodes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from producers.contract import INT_MAX, INT_MIN, EventType, MemoryEvent, Source, SourceType, encode, from_dict
from producers.records import Incoming, decode_record
from producers.settings import Settings
from projections.postgres.recorder import VERSION_COLUMNS, Recorder, connect, row_to_version
from projections.postgres.schema import create_schema
from projections.versions import Version, additions, plan
from tests.conftest import unique
from tests.support import TENANT, at, cleanup, pg

ODD_TEXT = "q\"uote \\back\\slash\ttab\nline {a,b} NULL 'single' 汉字 🎵 \u2028 \x01 end"
ODD_LIST = ["NULL", "null", "a,b", "{x}", 'q"uote', "back\\slash", "汉字 🎵", "tab\tin", "ends with space "]
ODD_VALUE: dict[str, Any] = {
    "bounds": [INT_MAX, INT_MIN, 0, -1, 10**17],
    "floats": [0.1, 1e-7, 1.7976931348623157e308, 5e-324, 2.5, -1.5e-300, 0.30000000000000004],
    "text": ODD_TEXT,
    "nothing": None,
    "flags": [True, False],
    "empty": {},
    "deep": [[[{"k": ["v"]}]]],
}
OFFSET = timezone(timedelta(hours=5, minutes=30))


def _events() -> list[MemoryEvent]:
    t = datetime(2026, 4, 5, 6, 7, 8, 123456, tzinfo=OFFSET)
    odd = MemoryEvent(
        type=EventType.ASSERTED,
        tenant=TENANT,
        subject="user:odd",
        key="pref.odd key",
        scope="test env",
        kind="preference",
        value=ODD_VALUE,
        content=ODD_TEXT,
        entities=ODD_LIST,
        aliases=["🎵", "alias, with comma"],
        tags=["t{1}"],
        source=Source(type=SourceType.EXPLICIT, service="svc", ref='r"1', actor="a\\b"),
        importance=0.12345678901234568,
        observed_at=t,
        valid_from=t - timedelta(microseconds=1),
        valid_to=t + timedelta(days=3, microseconds=7),
    )
    plain = [
        MemoryEvent(
            type=EventType.ASSERTED,
            tenant=TENANT,
            subject="user:odd",
            key="pref.plain",
            value=v,
            content=f"v {i}",
            observed_at=at(i),
            valid_from=at(i),
            source=Source(type=SourceType.INFERRED, service="s"),
            confidence=c,
        )
        for i, (v, c) in enumerate([(None, None), ("x", 0.1), (12345678901234567, 1 / 3), (-1.5e-300, 0.999999)])
    ]
    episode = MemoryEvent(
        type=EventType.ASSERTED,
        tenant=TENANT,
        subject="user:odd",
        kind="episodic",
        content="an episode 🎵",
        observed_at=at(9),
        entities=["Ann"],
    )
    marks = [
        MemoryEvent(type=EventType.CONFIRMED, tenant=TENANT, subject="user:odd", key="pref.plain", observed_at=at(5)),
        MemoryEvent(
            type=EventType.RETRACTED,
            tenant=TENANT,
            subject="user:odd",
            key="pref.plain",
            observed_at=at(6),
            valid_from=at(2.5),
            reason='why "not"',
        ),
        MemoryEvent(
            type=EventType.RETRACTED,
            tenant=TENANT,
            subject="user:odd",
            target_version=episode.version_id,
            observed_at=at(10),
        ),
    ]
    return [odd, *plain, episode, *marks]


@pytest.fixture
def world(base_settings: Settings) -> Iterator[tuple[Settings, Recorder]]:
    settings = base_settings.private(unique("rows"))
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        create_schema(admin, settings.pg_schema)
    try:
        with connect(settings.pg_dsn, settings.pg_schema) as conn:
            yield settings, Recorder(conn, consumer="rows-tests", topic=settings.topic)
    finally:
        cleanup(settings)


def _records(topic: str, events: list[MemoryEvent]) -> list[Incoming]:
    now_ms = int(time.time() * 1000)
    out = [decode_record(topic, 0, i, encode(e), key=e.kafka_key, timestamp_ms=now_ms) for i, e in enumerate(events)]
    assert all(r.event is not None for r in out), [r.error for r in out if r.error]
    return out


def _expected_versions(records: list[Incoming]) -> dict[str, Version]:
    """What the pure core makes of the batch: every fact's chain folded from nothing stored."""
    episodes = {r.event.version_id: r.event.memory_id for r in records if r.event.kind.value == "episodic"}
    resolved = {
        (r.event.tenant, r.event.event_id): episodes[r.event.target_version]
        for r in records
        if r.event.target_version in episodes
    }
    added = additions(((r.event, r.partition, r.offset) for r in records), resolved)
    out: dict[str, Version] = {}
    for mid in added.facts:
        for v in plan([], [], added.versions.get(mid, []), added.marks.get(mid, [])).inserts:
            out[v.version_id] = v
    return out


def _stored(settings: Settings) -> tuple[dict[str, Version], dict[str, tuple]]:
    with pg(settings) as conn:
        cols = ", ".join(f'"{c}"' for c in VERSION_COLUMNS)
        versions = {v.version_id: v for v in map(row_to_version, conn.execute(f"SELECT {cols} FROM fact_versions"))}
        events = {
            row[1]: row
            for row in conn.execute(
                'SELECT tenant, event_id, fingerprint, subject, memory_id, type, kind, key, scope, "partition", '
                '"offset", observed_at, valid_from, valid_to, target_version, payload, key_id FROM events'
            )
        }
    return versions, events


def test_every_column_holds_the_events_values_and_a_redelivery_changes_none(world):
    settings, recorder = world
    events = _events()
    records = _records(settings.topic, events)
    result = recorder.apply_batch(records)
    assert (result.applied, result.dead, result.duplicates) == (len(events), 0, 0)

    versions, logged = _stored(settings)
    expected = _expected_versions(records)
    assert set(versions) == set(expected)
    for vid, want in expected.items():
        got = versions[vid]
        for name in VERSION_COLUMNS:
            assert getattr(got, name) == getattr(want, name), (name, getattr(got, name), getattr(want, name))
            if isinstance(getattr(want, name), float):  # equal and the same double, bit for bit
                assert getattr(got, name).hex() == getattr(want, name).hex(), name
    odd = next(v for v in versions.values() if v.key == "pref.odd key")
    assert odd.value == ODD_VALUE and odd.content == ODD_TEXT
    assert odd.entities == tuple(item.strip() for item in ODD_LIST)  # as the contract cleans them
    assert odd.observed_at == events[0].observed_at and odd.observed_at.microsecond == 123456
    assert odd.asserted_valid_to == events[0].valid_to and odd.confidence == 1.0

    episode_mid = next(v.memory_id for v in versions.values() if v.kind == "episodic")
    assert set(logged) == {e.event_id for e in events}
    for r in records:
        e = r.event
        fact = None if e.type is EventType.ERASED else e.memory_id
        if e.target_version is not None:
            fact = episode_mid  # the targeted retraction of an episode is filed under the episode
        want_row = (
            e.tenant,
            e.event_id,
            e.fingerprint,
            e.subject,
            fact,
            e.type.value,
            e.kind.value,
            e.key,
            e.scope,
            r.partition,
            r.offset,
            e.observed_at,
            e.valid_from,
            e.valid_to,
            e.target_version,
            e.to_wire(),
            None,
        )
        assert logged[e.event_id] == want_row
        assert from_dict(logged[e.event_id][15]) == e  # the payload reads back as the same event

    again = recorder.apply_batch(records)  # redelivered: below the stored position, nothing is written again
    assert (again.applied, again.skipped) == (0, len(records))
    assert _stored(settings) == (versions, logged)


def test_the_same_events_at_other_offsets_are_duplicates_with_no_effect(world):
    settings, recorder = world
    events = _events()
    records = _records(settings.topic, events)
    recorder.apply_batch(records)
    before = _stored(settings)
    moved = [decode_record(r.topic, 1, r.offset, r.raw, timestamp_ms=int(time.time() * 1000)) for r in records]
    result = recorder.apply_batch(moved)  # a producer's retry: same (tenant, event_id), same content
    assert (result.applied, result.duplicates, result.dead) == (0, len(events), 0)
    assert _stored(settings) == before
