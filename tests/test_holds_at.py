"""One "holds at t" rule, three spellings that must agree: Python, SQL, the search index's filter.

A version holds at valid time t on [valid_from, min(valid_to, superseded_at)); of those that hold, an override
(a preference with an asserted valid_to) wins inside its window, else the latest. Python: projections.versions
`holds_at` / `visible_at`. SQL: projections.postgres.queries `holds_at_sql` / `visible_sql`, used by
`current_facts` and by recall's verification. Elasticsearch: projections.search.recall.index.holds_at_filter.

Chains are folded by the pure core from events chosen for their edges (supersession, retractions untargeted and
targeted, overrides overlapping, starting or ending where another version starts or ends, a retraction at a
version's own valid_from, late history, ties on valid_from) plus seeded random ones, written to a private schema
and index; every t at and 1 us (ES: 1 ms) around each boundary, and between them, is asked of all three. The index
keeps milliseconds, so its filter also takes a version ending in the millisecond of t (verification, in SQL, then
drops it): the index's set is Python's plus exactly those.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from elasticsearch.helpers import bulk
from psycopg import sql
from psycopg.rows import dict_row

from producers.contract import EventType, MemoryEvent
from projections.postgres.queries import current_facts, holds_at_sql
from projections.postgres.recorder import VERSION_COLUMNS, version_to_row
from projections.search.documents import build_doc, rows_sql
from projections.search.mapping import ensure_index, physical_indices
from projections.search.recall.index import holds_at_filter
from projections.search.recall.model import Match, RecallQuery
from projections.search.recall.verify import verify
from projections.versions import Version, fold, holds_at, mark_of, new_version, visible_at
from tests.conftest import unique
from tests.support import async_pool, private_store

TENANT = "acme"
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


class Events:
    """Assertions and marks with times in hours from T0."""

    def __init__(self) -> None:
        self.events: list[MemoryEvent] = []

    def said(self, subject, key, value, h, *, to=None, obs=None, kind="state", **kw) -> MemoryEvent:
        e = MemoryEvent(
            type=EventType.ASSERTED,
            tenant=TENANT,
            subject=subject,
            key=key,
            kind=kind,
            value=value,
            content=f"{subject} {key} {value}",
            valid_from=at(h),
            valid_to=None if to is None else at(to),
            observed_at=at(obs if obs is not None else h),
            **kw,
        )
        self.events.append(e)
        return e

    def retracted(self, subject, key, h, *, target: MemoryEvent | None = None, obs=None) -> None:
        self.events.append(
            MemoryEvent(
                type=EventType.RETRACTED,
                tenant=TENANT,
                subject=subject,
                key=key,
                valid_from=at(h),
                observed_at=at(obs if obs is not None else h),
                target_version=None if target is None else target.version_id,
            )
        )

    def chains(self) -> list[Version]:
        """Every fact's rows as the recorder would store them (the pure core's fold)."""
        versions, marks = defaultdict(list), defaultdict(list)
        for offset, e in enumerate(self.events):
            if e.type is EventType.ASSERTED:
                versions[e.memory_id].append(new_version(e, 0, offset))
            else:
                marks[e.memory_id].append(mark_of(e))
        return [v for mid in versions for v in fold(versions[mid], marks[mid])]


def edge_cases() -> Events:
    ev = Events()
    # a main lane: supersession, then a retraction of the current version, then a new value
    ev.said("user:1", "profile.city", "paris", 1)
    ev.said("user:1", "profile.city", "lyon", 3)
    ev.said("user:1", "profile.city", "nice", 5)
    ev.retracted("user:1", "profile.city", 6)
    ev.said("user:1", "profile.city", "lille", 8)
    # a long-term preference and overrides: overlapping, starting where another ends, one retracted inside its
    # window (untargeted: it ends the override in force, the long-term value shows again), one retracted at its
    # own start (an empty window), one targeted retraction of the long-term value while an override is in force
    ev.said("user:1", "pref.drink", "tea", 0, kind="preference")
    ev.said("user:1", "pref.drink", "coffee", 2, to=4, kind="preference")
    ev.said("user:1", "pref.drink", "espresso", 3, to=3.5, kind="preference")
    ev.said("user:1", "pref.drink", "water", 4, to=6, kind="preference")
    ev.retracted("user:1", "pref.drink", 5)
    ev.said("user:1", "pref.drink", "juice", 7, to=9, kind="preference")
    ev.retracted("user:1", "pref.drink", 7)
    long_term = ev.said("user:1", "pref.drink", "green tea", 6, kind="preference")
    ev.said("user:1", "pref.drink", "milk", 10, to=11, kind="preference")
    ev.retracted("user:1", "pref.drink", 10.5, target=long_term)
    # overrides starting together: the one told later wins; told together too: the version_id decides
    ev.said("user:4", "pref.seat", "aisle", 0, kind="preference")
    ev.said("user:4", "pref.seat", "window", 2, to=5, obs=3, kind="preference")
    ev.said("user:4", "pref.seat", "middle", 2, to=4, obs=1, kind="preference")
    ev.said("user:4", "pref.seat", "front", 6, to=8, obs=6, kind="preference")
    ev.said("user:4", "pref.seat", "back", 6, to=7, obs=6, kind="preference")
    # a state with its own end, a gap, a new value at exactly another's end
    ev.said("user:2", "project.port", 8080, 1, to=2)
    ev.said("user:2", "project.port", 9090, 4)
    ev.said("user:2", "project.host", "a", 2, to=4)
    ev.said("user:2", "project.host", "b", 4)
    # late history (told after the later value) and ties on valid_from (observed_at and then version_id decide)
    ev.said("user:3", "team", "payments", 5, obs=1)
    ev.said("user:3", "team", "search", 2, obs=6)
    ev.said("user:3", "team", "infra", 5, obs=2)
    ev.said("user:3", "team", "ads", 5, obs=2)
    # a targeted retraction of a version no longer in force (no effect) and of the one in force
    old = ev.said("user:3", "office", "berlin", 1)
    now = ev.said("user:3", "office", "rome", 3)
    ev.retracted("user:3", "office", 4, target=old)
    ev.retracted("user:3", "office", 4, target=now)
    # an episode (its own fact) and an event in the past
    ev.said("user:3", None, "met bob", 2, kind="episodic")
    ev.said("order:1", "order.status", "refunded", 3, kind="event")
    return ev


def random_chains(seed: int, facts: int = 12) -> Events:
    rng = random.Random(seed)
    ev = Events()
    for n in range(facts):
        subject, key, kind = f"user:r{n % 3}", f"k{n}", rng.choice(["state", "preference", "event"])
        for i in range(rng.randint(1, 6)):
            h = rng.randint(0, 12)  # whole hours: many ties and shared boundaries
            to = h + rng.randint(1, 6) if kind == "preference" and rng.random() < 0.6 else None
            ev.said(subject, key, f"v{i}", h, to=to, obs=rng.randint(0, 24), kind=kind)
        for _ in range(rng.randint(0, 2)):
            ev.retracted(subject, key, rng.randint(0, 12), obs=rng.randint(0, 24))
    return ev


def boundaries(rows: list[Version], step: timedelta) -> list[datetime]:
    """Every boundary of the rows, `step` before and after each, midpoints between them, and far outside."""
    edges = sorted(
        {t for v in rows for t in (v.valid_from, v.valid_to, v.superseded_at, v.asserted_valid_to) if t is not None}
    )
    ts = {edges[0] - timedelta(days=1), edges[-1] + timedelta(days=1)}
    for a, b in zip(edges, edges[1:], strict=False):
        ts.add(a + (b - a) / 2)
    for e in edges:
        ts |= {e - step, e, e + step}
    return sorted(ts)


@pytest.fixture(scope="module")
def store(base_settings):
    settings = base_settings.private(unique("holds"))
    with private_store(settings) as (conn, es):
        yield settings, conn, es


def _write(settings, conn, es, rows: list[Version]) -> None:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in VERSION_COLUMNS)
    with conn.cursor() as cur:
        cur.execute("DELETE FROM fact_versions")
        cur.executemany(
            sql.SQL("INSERT INTO fact_versions ({}) VALUES ({})").format(
                cols, sql.SQL(", ").join(sql.Placeholder() * len(VERSION_COLUMNS))
            ),
            [version_to_row(v) for v in rows],
        )
    for old in physical_indices(es, settings.es_index):  # a fresh index for each set of rows
        es.indices.delete(index=old)
    index = ensure_index(es, settings, dim=4)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(rows_sql(sql.SQL("true")))
        docs = [{"_index": index, "_id": r["version_id"], "_source": build_doc(r, None)} for r in cur.fetchall()]
    bulk(es, docs, refresh="wait_for")


def _sql_holding(conn, t: datetime) -> set[str]:
    query = sql.SQL("SELECT f.version_id FROM fact_versions f WHERE f.tenant = %(tenant)s AND {}").format(
        holds_at_sql("t")
    )
    return {r[0] for r in conn.execute(query, {"tenant": TENANT, "t": t})}


def _end(v: Version) -> datetime | None:
    """The version's effective end: min(valid_to, superseded_at), what the index keeps as `valid_to`."""
    return min((x for x in (v.valid_to, v.superseded_at) if x is not None), default=None)


def _ms(t: datetime | None) -> datetime | None:
    return None if t is None else t.replace(microsecond=t.microsecond // 1000 * 1000)


def _es_holding(es, settings, t: datetime) -> set[str]:
    res = es.search(
        index=settings.es_index,
        query={"bool": {"filter": [{"term": {"tenant": TENANT}}, *holds_at_filter(t)]}},
        size=1000,
        source=False,
    )
    return {h["_id"] for h in res["hits"]["hits"]}


async def _visible_by_sql(settings, rows: list[Version], ts: list[datetime]) -> dict[datetime, tuple[list, list]]:
    """For each t: (current_facts' version ids per subject, recall verification's version ids)."""
    subjects = sorted({v.subject for v in rows})
    matches = [Match(v.version_id, v.memory_id, "exact") for v in {v.memory_id: v for v in rows}.values()]
    out = {}
    pool = async_pool(settings)
    await pool.open()
    try:
        for t in ts:
            facts = []
            async with pool.connection() as conn:
                for s in subjects:
                    facts.append([f["version_id"] for f in await current_facts(conn, TENANT, s, t)])
            verified = await verify(pool, RecallQuery(tenant=TENANT, query="x"), t, matches)
            out[t] = (facts, sorted(row["version_id"] for row, _ in verified))
    finally:
        await pool.close()
    return out


def _check(settings, conn, es, rows: list[Version]) -> int:
    _write(settings, conn, es, rows)
    subjects = sorted({v.subject for v in rows})
    ts = boundaries(rows, timedelta(microseconds=1))
    by_sql = asyncio.run(_visible_by_sql(settings, rows, ts))
    for t in ts:
        assert _sql_holding(conn, t) == {v.version_id for v in rows if holds_at(v, t)}, t
        visible = visible_at(rows, t)
        per_subject = [[v.version_id for v in visible if v.subject == s] for s in subjects]
        facts, verified = by_sql[t]
        assert facts == per_subject, t  # current_facts: the same versions, in the same order
        assert verified == sorted(v.version_id for v in visible), t
    es_ts = boundaries(rows, timedelta(milliseconds=1))  # the index keeps milliseconds
    for t in es_ts:
        ending_then = {v.version_id for v in rows if v.valid_from <= t and _ms(_end(v)) == _ms(t)}
        assert _es_holding(es, settings, t) == {v.version_id for v in rows if holds_at(v, t)} | ending_then, t
    return len(ts) + len(es_ts)


def test_sql_index_and_python_agree_on_the_edges(store):
    rows = edge_cases().chains()
    statuses = {v.status for v in rows}
    assert statuses == {"active", "superseded", "retracted"}
    assert any(v.asserted_valid_to is not None and v.valid_to == v.valid_from for v in rows)  # an empty window
    assert _check(*store, rows) > 100
    seat = [v for v in rows if v.key == "pref.seat"]
    assert [v.value for v in visible_at(seat, at(3))] == ["window"]
    assert [v.value for v in visible_at(seat, at(6))] == [
        max((v for v in seat if v.valid_from == at(6)), key=lambda v: v.version_id).value
    ]
    # the rule itself, on a few of them: an override wins inside its window and only there
    drink = sorted((v for v in rows if v.key == "pref.drink"), key=lambda v: v.valid_from)
    value = {h: [v.value for v in visible_at(drink, at(h))] for h in (1.5, 2, 3, 3.5, 4, 5, 7, 10, 10.5, 11)}
    assert value == {
        1.5: ["tea"],
        2: ["coffee"],
        3: ["espresso"],
        3.5: ["coffee"],
        4: ["water"],
        5: ["tea"],  # the retraction at 5 ended the override in force; the long-term value shows again
        7: ["green tea"],  # juice was retracted at its own start
        10: ["milk"],
        10.5: ["milk"],
        11: [],  # the long-term green tea was retracted (targeted) at 10.5
    }


@pytest.mark.parametrize("seed", range(4))
def test_sql_index_and_python_agree_on_random_chains(store, seed):
    assert _check(*store, random_chains(seed).chains()) > 50
