"""What `/v1/stats` and `/v1/stats/consistency` read from PostgreSQL (projections.postgres.counts keeps the counters).

`stats_counts`: the counters and the bounded invariant checks, a few index lookups whatever the tenant's size.
`recount_check`: everything scanned in one snapshot, the counters against a recount, what was scanned and how long
it took. The module docstring of projections.postgres.counts says which check is where and why.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from projections.postgres.counts import ACCESS_COUNTERS, EMBED, EVENTS, OUTBOX, VERSIONS, dead_letters_name
from projections.postgres.positions import QUEUE_READ_PREPARED
from projections.postgres.queries import invariant_counts, one_snapshot

__all__ = ["INVARIANT_CAP", "SUSPECT", "recount_check", "stats_counts"]

INVARIANT_CAP = 1000  # at most this many suspect rows are counted per request (more: `invariants_capped`)

# the rows breaking a row-local rule; the same expression as the partial index fact_versions_suspect (schema.sql),
# so the planner answers from that index. The last two are also CHECK constraints: they hold unless one is dropped.
SUSPECT = (
    "(f.status = 'superseded' AND f.superseded_by IS NULL) OR (f.status = 'active' AND f.superseded_by IS NOT NULL) "
    "OR ((f.superseded_by IS NULL) <> (f.superseded_at IS NULL)) "
    "OR ((f.source->>'type') = 'explicit' AND f.confidence <> 1.0)"
)
CHAIN = (
    "(f.status = 'superseded' AND f.superseded_by IS NULL) OR (f.status = 'active' AND f.superseded_by IS NOT NULL) "
    "OR ((f.superseded_by IS NULL) <> (f.superseded_at IS NULL))"
)
EXPLICIT = "(f.source->>'type') = 'explicit' AND f.confidence <> 1.0"


_STATS = f"""
SELECT
  (SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = 'events') AS events_applied,
  (SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = 'versions') AS versions,
  (SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = %(dead)s) AS dlq_count,
  (SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = 'outbox') AS search_outbox_pending,
  (SELECT coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = 'embed_queue') AS vectors_pending,
  (SELECT extract(epoch FROM now() - created_at) FROM search_outbox WHERE tenant = %(tenant)s ORDER BY id LIMIT 1)
    AS outbox_oldest_s,
  (SELECT extract(epoch FROM now() - since) FROM embed_queue WHERE tenant = %(tenant)s ORDER BY id LIMIT 1)
    AS vectors_oldest_s,
  (SELECT count(DISTINCT group_id) FROM episode_links WHERE tenant = %(tenant)s) AS duplicate_groups,
  (SELECT count(*) FROM episode_links WHERE tenant = %(tenant)s) AS duplicate_episodes,
  (SELECT coalesce(bool_and(indisunique AND indisvalid), false) FROM pg_index
     WHERE indexrelid = to_regclass('fact_versions_one_current')) AS one_current_enforced,
  s.chain, s.explicit, s.suspect
FROM (SELECT count(*) FILTER (WHERE {CHAIN}) AS chain, count(*) FILTER (WHERE {EXPLICIT}) AS explicit,
        count(*) AS suspect
      FROM (SELECT f.* FROM fact_versions f WHERE f.tenant = %(tenant)s AND ({SUSPECT}) LIMIT %(cap)s) f) s
"""

_DOUBLE_ACTIVE = """
SELECT count(*) FROM (SELECT memory_id FROM fact_versions
  WHERE tenant = %(tenant)s AND status = 'active' AND valid_to IS NULL AND superseded_by IS NULL
  GROUP BY memory_id HAVING count(*) > 1) d
"""


async def stats_counts(conn: psycopg.AsyncConnection, tenant: str, topic: str) -> dict[str, Any]:
    """The PostgreSQL numbers of /v1/stats for `tenant` (its dead letters of `topic`): counters and bounded checks."""
    args = {"tenant": tenant, "dead": dead_letters_name(topic), "cap": INVARIANT_CAP + 1}
    cur = await conn.execute(_STATS, args, prepare=QUEUE_READ_PREPARED)  # it reads the queues' oldest rows
    row = await cur.fetchone()
    assert row is not None
    events, versions, dead, outbox, vectors, outbox_age, vectors_age, groups, dups = row[:9]
    enforced, chain, explicit, suspect = row[9:]
    if enforced:
        double = 0
    else:  # the index that makes it impossible is gone or invalid: count for real
        cur = await conn.execute(_DOUBLE_ACTIVE, {"tenant": tenant})
        double = (await cur.fetchone())[0]  # type: ignore[index]
    return {
        "double_active": int(double),
        "chain_integrity_violations": int(chain),
        "explicit_confidence_violations": int(explicit),
        "invariants_capped": suspect > INVARIANT_CAP,
        "events_applied": int(events),
        "versions": int(versions),
        "dlq_count": int(dead),
        # what the search projection still has to do, documents and vectors (0: complete, and searchable by every
        # stage: a client waiting for 0 before it asks keeps working with two-phase indexing); not `outbox_pending`,
        # which is the documents alone (in `search_lag`)
        "search_pending": int(outbox) + int(vectors),
        # the two lags of two-phase indexing (the oldest row of each queue, in seconds; None: empty)
        "search_lag": {
            "outbox_pending": int(outbox),
            "vectors_pending": int(vectors),
            "documents_lag_s": None if outbox_age is None else round(float(outbox_age), 3),
            "vectors_lag_s": None if vectors_age is None else round(float(vectors_age), 3),
            # near-duplicate episodes (projections.search.duplicates)
            "duplicate_groups": int(groups),
            "duplicate_episodes": int(dups),
        },
    }


_COUNTED = "SELECT tenant, name, coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s GROUP BY tenant, name"
_RECOUNTED = "SELECT tenant, name, n FROM counts_recount WHERE tenant = %(tenant)s"


async def recount_check(conn: psycopg.AsyncConnection, tenant: str, topic: str) -> dict[str, Any]:
    """The full PostgreSQL check of `tenant`, in one snapshot: every invariant scanned (chains included) and each
    counter against a recount of its rows; what was scanned and how long it took.

    Opens a REPEATABLE READ transaction on `conn` (an autocommit connection) unless one is open: the counters
    and the rows they count are then read at the same instant, so writers running meanwhile cause no drift.
    """
    names = {EVENTS: "events_applied", VERSIONS: "versions", OUTBOX: "search_outbox_pending", EMBED: "vectors_pending"}
    names |= {name: name for name in ACCESS_COUNTERS}  # /v1/stats `access` (facts_active, ...)
    dead = dead_letters_name(topic)
    t0 = time.perf_counter()
    async with one_snapshot(conn):
        scanned = await invariant_counts(conn, tenant)
        counted = {(t, n): int(v) for t, n, v in await (await conn.execute(_COUNTED, {"tenant": tenant})).fetchall()}
        recounted = {
            (t, n): int(v) for t, n, v in await (await conn.execute(_RECOUNTED, {"tenant": tenant})).fetchall()
        }
    counters: dict[str, dict[str, int]] = {}
    for name, field in names.items():
        counters[field] = {"counted": counted.get((tenant, name), 0), "recounted": recounted.get((tenant, name), 0)}
    counters["dlq_count"] = {  # the dead letters naming this tenant (counts.py), never another's or none's
        "counted": counted.get((tenant, dead), 0),
        "recounted": recounted.get((tenant, dead), 0),
    }
    drift = {k: v["counted"] - v["recounted"] for k, v in counters.items() if v["counted"] != v["recounted"]}
    return {
        "invariants": {
            k: scanned[k] for k in ("double_active", "chain_integrity_violations", "explicit_confidence_violations")
        },
        "counters": counters,
        "counter_drift": drift,
        "rows_scanned": {
            "fact_versions": scanned["versions"],
            "events": scanned["events_applied"],
            "search_outbox": scanned["search_outbox_pending"],
            "dead_letters": counters["dlq_count"]["recounted"],
        },
        "ms": round((time.perf_counter() - t0) * 1000, 1),
    }
