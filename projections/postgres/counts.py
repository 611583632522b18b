"""Per-tenant counters for `/v1/stats`, kept by the writers inside their own transactions, so a read is a few index
lookups however many facts a tenant has (projections.postgres.stats reads them, and recounts them to check).

Table `counts (tenant, name, shard, n)` (schema.sql): a count is the sum of `n` over its shards.

- `events` (the event's tenant): + a new event logged by the recorder; - the events an erasure purges.
- `versions` (the fact's tenant): + a version the recorder inserts; - the versions an erasure purges.
- `outbox` (the row's tenant): + a search_outbox row the recorder queues; - one the indexer (or an erasure) removes.
- `dead_letters/<topic>` (the tenant the refused record names, as `dead_letters.tenant` stores it; '' when none can
  be read, which is no tenant's): + a dead letter of that topic the recorder (or the access projector) writes
  (recorder.letter_tenant). `/v1/stats?tenant=` reads the tenant's own, so no tenant learns of another's letters.
- `embed_queue` (the version's tenant, issue 14): + a version an indexer queued for its vectors; - one an embedder
  finished (or found gone). Indexers and embedders write shard -1 under one transaction lock (projections.search.
  claims.TAIL_LOCK), so several of them never deadlock on a counter row.
- `facts_active`, `facts_active_served`, `accesses_active` (the fact's tenant; `/v1/stats` `access`): the facts
  with a version of status `active` (neither superseded nor retracted: a property the projection stores, so the
  count does not depend on the clock), those of them with an `access_counts` row, and the sum of their accesses.
  Kept by projections.postgres.accesses, which says who adjusts them when: the recorder when a fact becomes active
  or stops being active (and when an erasure purges its facts), the access projector when an active fact gets
  accesses.

Exactly once like the rows they count: a redelivered record writes no rows and no counts, a rolled-back batch
neither. Shards keep writers off each other's rows: the recorder adds to the shard of the lowest ledger partition of
its batch, whose position row it holds locked (`FOR UPDATE`) until it commits, so two batches that could write the
same counter row are already serialized by that lock; the indexers and embedders (any number, each finishing its
batch under one transaction-level advisory lock) write shard -1; the access projector writes `access_shard(p)` (-2 -
p) for the lowest access-topic partition p of its batch, whose position row it holds locked, so it never shares a
counter row with the recorder; an erasure adds its access counters on the shard of the lowest ledger partition of
the subject's versions (the erasure's own, which this transaction holds locked, as all the subject's events share
one key). Each writer sends its deltas in one statement sorted by (tenant, name), so counter rows are always locked
in the same order (the erasure's statement writes rows of a shard no other transaction can hold). A rebuild replays
into a fresh schema through the same recorder and access projector, so it recomputes them; a schema created before
the table existed is counted once when it gets it (schema.sql, `meta` row `counts`), and one created before the
access counters gets those once (`meta` row `counts_access`).

The invariant counters of `/v1/stats` are bounded too: `double_active` is 0 while the unique index
`fact_versions_one_current` is valid (it makes a second active version impossible; without it the scan runs),
and the row-local checks (a version's status against its supersession link, an explicit source with a
confidence below 1) count the rows of the partial index `fact_versions_suspect`, which holds only rows that
break one (normally none), at most stats.INVARIANT_CAP of them. The checks that need whole chains (links to the
right successor, versions numbered 1..n), the counters against a recount and the orphans between PostgreSQL
and Elasticsearch are `GET /v1/stats/consistency`'s (stats.recount_check), which says what it scanned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import psycopg

__all__ = [
    "ACCESSES_ACTIVE",
    "ACCESS_COUNTERS",
    "DEAD_LETTERS",
    "EMBED",
    "EVENTS",
    "FACTS_ACTIVE",
    "FACTS_ACTIVE_SERVED",
    "INDEXER_SHARD",
    "OUTBOX",
    "VERSIONS",
    "Deltas",
    "access_shard",
    "add_counts",
    "dead_letters_name",
]

EVENTS, VERSIONS, OUTBOX, DEAD_LETTERS = "events", "versions", "outbox", "dead_letters"
EMBED = "embed_queue"
INDEXER_SHARD = -1
FACTS_ACTIVE, FACTS_ACTIVE_SERVED, ACCESSES_ACTIVE = "facts_active", "facts_active_served", "accesses_active"
ACCESS_COUNTERS = (FACTS_ACTIVE, FACTS_ACTIVE_SERVED, ACCESSES_ACTIVE)

Deltas = Counter  # (tenant, name) -> change, for one transaction


def dead_letters_name(topic: str) -> str:
    """The counter of `topic`'s dead letters (per tenant named; '' for those naming none)."""
    return f"{DEAD_LETTERS}/{topic}"


def access_shard(partition: int) -> int:
    """The access projector's shard for a batch whose lowest access-topic partition is `partition` (below -1)."""
    return -2 - partition


def add_counts(cur: psycopg.Cursor | psycopg.Connection, deltas: Mapping[tuple[str, str], int], shard: int) -> None:
    """Inside the writer's transaction: add `deltas` ((tenant, name) -> change) to the counters of `shard`."""
    rows = sorted((tenant, name, d) for (tenant, name), d in deltas.items() if d)
    if not rows:
        return
    cur.execute(
        "INSERT INTO counts (tenant, name, shard, n) "
        "SELECT t, nm, %s, d FROM unnest(%b::text[], %b::text[], %b::bigint[]) AS x(t, nm, d) "
        "ON CONFLICT (tenant, name, shard) DO UPDATE SET n = counts.n + excluded.n",
        (shard, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]),
    )
