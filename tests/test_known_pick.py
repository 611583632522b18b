"""A recall as known at a time keeps, of each fact, the version the fold shows then: its rules against the fold.

Recall's verification as known at `known_at` (projections.search.recall.verify, queries.held_then_sql) picks the
version of each candidate's fact that the ledger knew then and keeps it only if it held at `at`; the search
index's filter as known then (recall.index.ElasticIndex.filters) must propose that version whatever else it leaves
out, with a receipt's positions (`below`) too. The oracle is the pure fold (projections.versions) of the events
observed by `known_at`: the version visible at `at`. Random worlds
(seeded) of facts with long-term versions (some with their own end), overrides, retractions by id and by time, all
observed out of order, written through the real recorder into a private schema; every fact asked at every edge of
every window (1 us either side) as known at every instant an event was observed.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from producers.contract import EventType, MemoryEvent, from_dict, rfc3339, version_id_for
from projections.search.recall.index import ElasticIndex
from projections.search.recall.model import Scope
from projections.search.recall.verify import _KNOWN_SQL
from projections.versions import fold, mark_of, new_version, visible_at
from tests.conftest import unique
from tests.support import private_store
from tests.support.writer import RecorderWriter, drain_all

TENANT, SUBJECT = "kp", "user:kp"
DAY = timedelta(days=1)
START = datetime(2025, 1, 1, tzinfo=UTC)


def _world(seed: int) -> list[MemoryEvent]:
    """Facts of one subject: 1-4 long-term versions (a third with an end of their own), 0-2 overrides (a preference
    with an end), 0-3 retractions (by id of one of its versions, or by time), observed in a shuffled order."""
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


def _shown(events: list[MemoryEvent], known: datetime, at: datetime) -> dict[str, str]:
    """memory_id -> the version the fold of the events observed by `known` shows at `at`."""
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
    return {v.memory_id: v.version_id for v in visible_at(folded, at)}


@pytest.mark.parametrize("seed", range(1, 11))
def test_the_version_kept_as_known_then_is_the_one_the_fold_shows(base_settings: Any, seed: int) -> None:
    settings = base_settings.private(unique("kp"))
    events = _world(seed)
    edges = {t for e in events for t in (e.valid_from, e.valid_to) if t is not None}
    times = sorted(
        {t + d for t in edges for d in (-timedelta(microseconds=1), timedelta(0), timedelta(microseconds=1))}
    )
    knowns = sorted({e.observed_at for e in events})
    mids = sorted({e.memory_id for e in events})
    query = _KNOWN_SQL[False, False, False]
    checked = 0
    with private_store(settings) as (conn, _es):
        with RecorderWriter(settings, conn) as ledger:
            for e in events:
                ledger.apply(e)
        for known in knowns[:: max(1, len(knowns) // 12)] + [knowns[-1]]:
            for at in times:
                params = {"tenant": TENANT, "mids": mids, "at": at, "subject": None, "known_at": known}
                got = {r[0]: r[1] for r in conn.execute(f"SELECT memory_id, version_id FROM ({query}) q", params)}
                assert got == _shown(events, known, at), (seed, rfc3339(known), rfc3339(at))
                checked += 1
    assert checked > 200


@pytest.mark.parametrize("seed", range(1, 4))
def test_the_index_as_known_then_proposes_every_version_the_fold_shows(base_settings: Any, seed: int) -> None:
    """Whatever the index's filter as known then leaves out (ended by its own valid_to, a successor known then,
    logged at or past a replay's positions), it never leaves out the version the fold shows: as known at each
    instant, and as a replay knows (whenever observed, below the positions of that instant)."""
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
                for at in times:
                    scope = Scope(TENANT, at, known_at=scope_known, below=below)
                    body = {"query": {"bool": {"filter": ElasticIndex.filters(scope)}}, "size": 1000, "_source": False}
                    proposed = {h["_id"] for h in es.search(index=settings.es_index, **body)["hits"]["hits"]}
                    shown = set(_shown(events, known, at).values())
                    assert shown <= proposed, (seed, n, rfc3339(at), below, shown - proposed)
                    checked += 1
    assert checked > 200
