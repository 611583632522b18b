"""A recall as known at a time keeps, of each fact, the version the fold shows then: its rules against the fold.

Recall's verification as known at `known_at` (projections.search.recall.verify) lets a candidate speak for its
fact only if its version held at `at` as the ledger knew it then, and answers with the version the fold shows
then; the search index's filter as known then (recall.index.ElasticIndex.filters) must propose every version that
held then, whatever else it leaves out, with a receipt's positions (`below`) too. The oracle is the pure fold
(projections.versions) of the events observed by `known_at`. A world of one override retracted by its id after a
retraction by time was known (seed 0), and random worlds (seeded) of facts with long-term
versions (some with an end of their own), overrides, retractions by id and by time, observed out of order and
written through the real recorder into a private schema; each fact asked at every edge of every window (1 us
either side) as known at instants an event was observed.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from producers.contract import EventType, MemoryEvent, from_dict, rfc3339, version_id_for
from projections.postgres.queries import below_json
from projections.search.recall.current import known_sql
from projections.search.recall.index import ElasticIndex
from projections.search.recall.model import Match, RecallQuery, Scope
from projections.search.recall.verify import verify
from projections.versions import fold, holds_at, mark_of, new_version, visible_at
from tests.conftest import unique
from tests.support import async_pool, private_store
from tests.support.writer import RecorderWriter, drain_all

TENANT, SUBJECT = "kp", "user:kp"
DAY = timedelta(days=1)
START = datetime(2025, 1, 1, tzinfo=UTC)


def _world(seed: int) -> list[MemoryEvent]:
    """Facts of one subject: 1-4 long-term versions (a third with an end of their own), 0-2 overrides (a preference
    with an end), 0-3 retractions (by id of one of its versions, or by time), observed in a shuffled order."""
    if seed == 0:
        return _override_retracted_later()
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    for f in range(6):
        key, ids = f"k{f}", []
        for n in range(rnd.randint(1, 4)):
            e = {"kind": "state", "valid_from": START + rnd.randint(0, 60) * DAY}
            if rnd.random() < 0.33:
                e["valid_to"] = e["valid_from"] + rnd.randint(1, 30) * DAY
            ids.append(f"s{seed}-{f}-v{n}")
            out.append({**e, "type": "memory.asserted", "event_id": ids[-1], "key": key, "value": n})
        for n in range(rnd.randint(0, 2)):
            began = START + rnd.randint(0, 60) * DAY
            ids.append(f"s{seed}-{f}-o{n}")
            out.append(
                {"type": "memory.asserted", "event_id": ids[-1], "key": key, "value": 100 + n, "kind": "preference"}
                | {"valid_from": began, "valid_to": began + rnd.randint(1, 20) * DAY}
            )
        for n in range(rnd.randint(0, 3)):
            retraction = {"type": "memory.retracted", "event_id": f"s{seed}-{f}-r{n}", "key": key}
            retraction["valid_from"] = START + rnd.randint(0, 80) * DAY
            if rnd.random() < 0.5:
                retraction["target_version"] = version_id_for(TENANT, rnd.choice(ids))
            out.append(retraction)
    observed = [START + 100 * DAY + i * timedelta(hours=1) for i in range(len(out))]
    rnd.shuffle(observed)
    events = []
    for e, seen in zip(out, observed, strict=True):
        times = {k: rfc3339(v) for k, v in e.items() if k in ("valid_from", "valid_to")}
        asserted = {"content": f"{e['key']} is {e.get('value')}"} if e["type"] == "memory.asserted" else {}
        events.append(from_dict({**e, **times, **asserted, "tenant": TENANT, "subject": SUBJECT,
                                 "observed_at": rfc3339(seen)}))  # fmt: skip
    return sorted(events, key=lambda e: e.observed_at)  # the log's order: as observed


def _override_retracted_later() -> list[MemoryEvent]:
    """A retraction by time inside an override's window, known early, and a retraction of that override by its id
    before it, known late: as known between the two, the first ended the override (in force then) and the
    long-term value held on; as known after both, it ended the long-term value."""
    base = {"tenant": TENANT, "subject": SUBJECT, "key": "k0"}
    observed = iter(START + 100 * DAY + i * timedelta(hours=1) for i in range(10))

    def event(**fields: Any) -> MemoryEvent:
        times = {k: rfc3339(v) for k, v in fields.items() if isinstance(v, datetime)}
        return from_dict({**base, **fields, **times, "observed_at": rfc3339(next(observed))})

    tea = event(type="memory.asserted", event_id="z-tea", value="tea", content="tea", valid_from=START)
    coffee = event(type="memory.asserted", event_id="z-coffee", value="coffee", content="coffee", kind="preference",
                   valid_from=START + 59 * DAY, valid_to=START + 89 * DAY)  # fmt: skip
    by_time = event(type="memory.retracted", event_id="z-by-time", valid_from=START + 68 * DAY)
    by_id = event(type="memory.retracted", event_id="z-by-id", valid_from=START + 63 * DAY,
                  target_version=coffee.version_id)  # fmt: skip
    return [tea, coffee, by_time, by_id]


def _ms(t: datetime) -> datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _in_millisecond(v: Any, at: datetime) -> bool:
    """`v` holds at `at` as the index's `date` fields judge it: begun by the millisecond of `at`, not ended before."""
    ends = [t for t in (v.valid_to, v.superseded_at) if t is not None]
    return _ms(v.valid_from) <= _ms(at) and (not ends or _ms(min(ends)) >= _ms(at))


def _as_known(events: list[MemoryEvent], known: datetime, at: datetime) -> tuple[dict[str, str], set[str]]:
    """By the fold of the events observed by `known`: memory_id -> the version it shows at `at`, and the versions
    that held at `at` (any lane) to the millisecond the index keeps."""
    seen = [e for e in events if e.observed_at <= known]
    versions = {e.version_id: new_version(e, 0, i) for i, e in enumerate(seen) if e.type is EventType.ASSERTED}
    by_fact: dict[str, list[Any]] = defaultdict(list)
    for v in versions.values():
        by_fact[v.memory_id].append(v)
    marks: dict[str, list[Any]] = defaultdict(list)
    for e in seen:
        if e.type is EventType.RETRACTED:
            target = versions.get(e.target_version or "")
            marks[target.memory_id if target is not None else e.memory_id].append(mark_of(e))
    folded = [v for mid, vs in by_fact.items() for v in fold(vs, marks.get(mid, []))]
    held = {v.version_id for v in folded if _in_millisecond(v, at)}
    assert {v.version_id for v in folded if holds_at(v, at)} <= held
    return {v.memory_id: v.version_id for v in visible_at(folded, at)}, held


@pytest.mark.parametrize("seed", range(7))
def test_a_candidate_speaks_as_known_then_only_if_it_held_then(base_settings: Any, seed: int) -> None:
    """Each fact asked through one candidate, each of its versions in turn: answered, with the version the fold
    shows, exactly when that candidate held then."""
    settings = base_settings.private(unique("kp"))
    events = _world(seed)
    edges = {t for e in events for t in (e.valid_from, e.valid_to) if t is not None}
    near = (-timedelta(microseconds=1), timedelta(0), timedelta(microseconds=1))
    times = sorted({t + d for t in edges for d in near})
    knowns = sorted({e.observed_at for e in events})
    of_fact: dict[str, list[str]] = defaultdict(list)
    for e in events:
        if e.type is EventType.ASSERTED:
            of_fact[e.memory_id].append(e.version_id)
    rnd = random.Random(seed)

    async def check(pool: Any) -> int:
        checked = 0
        for known in knowns[:: max(1, len(knowns) // 8)] + [knowns[-1]]:
            for at in rnd.sample(times, min(len(times), 40)):
                shown, held = _as_known(events, known, at)
                for k in range(max(len(vs) for vs in of_fact.values())):  # each version of a fact in turn
                    asked = {mid: vs[k] for mid, vs in of_fact.items() if k < len(vs)}
                    matches = [Match(vid, mid, "keyword", {"rrf": 1.0}) for mid, vid in asked.items()]
                    answer = await verify(pool, RecallQuery(TENANT, "q", known_at=known), at, matches)
                    got = {row["memory_id"]: (row["version_id"], m.version_id) for row, m in answer}
                    want = {mid: (shown[mid], vid) for mid, vid in asked.items() if vid in held and mid in shown}
                    assert got == want, (seed, rfc3339(known), rfc3339(at))
                    checked += 1
        return checked

    with private_store(settings) as (conn, _es):
        with RecorderWriter(settings, conn) as ledger:
            for e in events:
                ledger.apply(e)

        async def run() -> int:
            async with async_pool(settings) as pool:
                return await check(pool)

        assert asyncio.run(run()) > 100


@pytest.mark.parametrize("seed", range(4))
def test_the_index_as_known_then_proposes_every_version_the_fold_shows(base_settings: Any, seed: int) -> None:
    """Whatever the index's filter as known then leaves out (ended by its own valid_to, a successor known then, a
    retraction known then, logged at or past a replay's positions), it never leaves out the version the fold shows:
    as known at each instant, and as a replay knows (whenever observed, below the positions of that instant). The
    same of PostgreSQL's exact ask."""
    settings = base_settings.private(unique("kpi"))
    events = _world(seed)
    edges = {t for e in events for t in (e.valid_from, e.valid_to) if t is not None}
    near = (-timedelta(microseconds=1), timedelta(0), timedelta(microseconds=1), timedelta(milliseconds=1))
    times = sorted({t + d for t in edges for d in near})
    checked = 0
    with private_store(settings) as (conn, es):
        with RecorderWriter(settings, conn) as ledger:
            for e in events:  # in observed order, at offsets 0, 1, ...: the first n observed are those below n
                ledger.apply(e)
        drain_all(settings, conn, es, None)
        for n in range(1, len(events) + 1, max(1, len(events) // 8)):
            known = events[n - 1].observed_at
            for scope_known, below in ((known, None), (known, {0: n}), (datetime.max.replace(tzinfo=UTC), {0: n})):
                pg_known = known_sql(below is not None)  # the exact ask's as PostgreSQL answers it (recall.current)
                for at in times:
                    scope = Scope(TENANT, at, known_at=scope_known, below=below)
                    body = {"query": {"bool": {"filter": ElasticIndex.filters(scope)}}, "size": 1000, "_source": False}
                    proposed = {h["_id"] for h in es.search(index=settings.es_index, **body)["hits"]["hits"]}
                    params = {"tenant": TENANT, "at": at, "known_at": scope_known, "below": below_json(below or {})}
                    asked = f"SELECT version_id FROM fact_versions f WHERE f.tenant = %(tenant)s AND {pg_known}"
                    from_pg = {row[0] for row in conn.execute(asked, params).fetchall()}
                    _shown, held = _as_known(events, known, at)
                    assert held <= proposed, (seed, n, rfc3339(at), below, held - proposed)
                    assert held <= from_pg, ("postgres", seed, n, rfc3339(at), below, held - from_pg)
                    checked += 1
    assert checked > 200
