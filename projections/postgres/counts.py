"""Per-tenant counters for `/v1/stats`, kept by the writers inside their own transactions, so a read is a few index
lookups however many facts a tenant has (projections.postgres.stats reads them, and recounts them to check).

Table `counts (tenant, name, shard, n)`: a count is the sum of `n` over its shards; docs/INTERNALS.md says which
writer adds to which counter on which shard. Exactly once like the rows they count, as they are written in the same
transaction. Shards keep writers off each other's rows, and each writer sends its deltas in one statement sorted by
(tenant, name), so counter rows are always locked in the same order (no deadlock). `dead_letters/<topic>` counts
under the tenant the refused record names, so `/v1/stats?tenant=` tells no tenant of another's letters.
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
