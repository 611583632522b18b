"""The access tables' rules that both writers share: the per-fact lock, and what an erasure does to accesses.

The access projector adds accesses and the Recorder's `subject.erased` removes them, in different transactions,
so both take `lock_access_facts` (sorted, so they never deadlock): whichever comes second sees what the first
committed, and either order, a redelivery or a rebuild gives the same tables and `/v1/stats` counters. An erased
subject leaves no access row and no aggregate behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import psycopg

from projections.postgres.counts import (
    ACCESSES_ACTIVE,
    FACTS_ACTIVE,
    FACTS_ACTIVE_SERVED,
    Deltas,
    add_counts,
)
from projections.postgres.idempotency import ID_HASH_SQL
from projections.versions import ACTIVE, Version

__all__ = [
    "active_transitions",
    "erase_accesses",
    "erased_version_ids",
    "keep_erased_versions",
    "lock_access_facts",
    "recount",
    "served_deltas",
    "transition_deltas",
]


def lock_access_facts(cur: psycopg.Cursor, memory_ids: Iterable[str]) -> None:
    """Transaction-scoped advisory locks on the facts' access rows, in memory_id order (one order for everyone)."""
    ids = sorted(set(memory_ids))
    if ids:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('access:' || m, 0)) "
            "FROM unnest(%b::text[]) WITH ORDINALITY AS t(m, i) ORDER BY i",
            (ids,),
        )


def active_transitions(
    stored: Mapping[str, Sequence[Version]], inserts: Iterable[Version], updates: Iterable[Version]
) -> dict[tuple[str, str], int]:
    """(tenant, memory_id) -> +1 (the fact becomes active) or -1 (it stops being active), for the facts whose rows
    `inserts` and `updates` change (a fact is active while one of its versions has status `active`)."""
    changed: dict[str, dict[str, Version]] = {}
    for v in (*updates, *inserts):
        changed.setdefault(v.memory_id, {})[v.version_id] = v
    out: dict[tuple[str, str], int] = {}
    for mid, new in changed.items():
        before = {v.version_id: v for v in stored.get(mid, ())}
        was = any(v.status == ACTIVE for v in before.values())
        now = any(v.status == ACTIVE for v in {**before, **new}.values())
        if was != now:
            out[(next(iter(new.values())).tenant, mid)] = 1 if now else -1
    return out


def _aggregates(cur: psycopg.Cursor, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """(tenant, memory_id) -> accesses, for the keys with an access_counts row."""
    cur.execute(
        "SELECT a.tenant, a.memory_id, a.accesses FROM access_counts a "
        "JOIN unnest(%b::text[], %b::text[]) AS x(t, m) ON a.tenant = x.t AND a.memory_id = x.m",
        ([t for t, _ in keys], [m for _, m in keys]),
    )
    return {(t, m): int(n) for t, m, n in cur.fetchall()}


def transition_deltas(cur: psycopg.Cursor, transitions: Mapping[tuple[str, str], int]) -> Deltas:
    """The recorder's share of the access counters for facts that become active (+1) or inactive (-1): takes their
    access locks (so an access projector serving them waits, or is seen), then counts their aggregates in or out."""
    deltas: Deltas = Deltas()
    if not transitions:
        return deltas
    keys = sorted(transitions)
    lock_access_facts(cur, (m for _, m in keys))
    served = _aggregates(cur, keys)
    for (tenant, mid), d in transitions.items():
        deltas[(tenant, FACTS_ACTIVE)] += d
        if (tenant, mid) in served:
            deltas[(tenant, FACTS_ACTIVE_SERVED)] += d
            deltas[(tenant, ACCESSES_ACTIVE)] += d * served[(tenant, mid)]
    return deltas


def served_deltas(cur: psycopg.Cursor, new: Mapping[tuple[str, str], int]) -> Deltas:
    """The access projector's share, before it adds `new` ((tenant, memory_id) -> new accesses) to access_counts and
    holding those facts' access locks: the accesses of active facts, and an active fact served for the first time."""
    deltas: Deltas = Deltas()
    if not new:
        return deltas
    keys = sorted(new)
    cur.execute(
        "SELECT DISTINCT f.tenant, f.memory_id FROM fact_versions f "
        "JOIN unnest(%b::text[], %b::text[]) AS x(t, m) ON f.memory_id = x.m AND f.tenant = x.t "
        "WHERE f.status = 'active'",
        ([t for t, _ in keys], [m for _, m in keys]),
    )
    active = {(t, m) for t, m in cur.fetchall()}
    if not active:
        return deltas
    served = _aggregates(cur, sorted(active))
    for key in sorted(active):
        deltas[(key[0], ACCESSES_ACTIVE)] += new[key]
        if key not in served:
            deltas[(key[0], FACTS_ACTIVE_SERVED)] += 1
    return deltas


def erased_version_ids(cur: psycopg.Cursor, tenants: list[str], version_ids: list[str]) -> set[tuple[str, str]]:
    """(tenant, version_id) of the pairs whose version belonged to an erased subject."""
    if not version_ids:
        return set()
    cur.execute(
        "SELECT x.t, x.v FROM unnest(%b::text[], %b::text[]) AS x(t, v) WHERE EXISTS (SELECT 1 FROM "
        f"erased_versions e WHERE e.tenant = x.t AND e.id_hash = {ID_HASH_SQL.format('x.v')})",
        (tenants, version_ids),
    )
    return set(cur.fetchall())


def recount(cur: psycopg.Cursor, tenant: str, memory_ids: list[str]) -> None:
    """Recompute the facts' aggregates from the `accesses` log (no row for a fact without accesses)."""
    if not memory_ids:
        return
    cur.execute("DELETE FROM access_counts WHERE tenant = %s AND memory_id = ANY(%s)", (tenant, memory_ids))
    cur.execute(
        "INSERT INTO access_counts (tenant, memory_id, accesses, last_accessed_at) "
        "SELECT tenant, memory_id, count(*), max(accessed_at) FROM accesses "
        "WHERE tenant = %s AND memory_id = ANY(%s) GROUP BY tenant, memory_id",
        (tenant, memory_ids),
    )


def keep_erased_versions(cur: psycopg.Cursor, tenant: str, version_ids: list[str]) -> None:
    """Keep erased version ids as salted hashes (`erased_versions`): an access of one arriving later is dropped, a
    receipt citing one verifies erased."""
    if version_ids:
        cur.execute(
            "INSERT INTO erased_versions (tenant, id_hash) "
            f"SELECT %s, {ID_HASH_SQL.format('v')} FROM unnest(%b::text[]) AS x(v) ON CONFLICT DO NOTHING",
            (tenant, version_ids),
        )


def erase_accesses(cur: psycopg.Cursor, tenant: str, subject: str) -> None:
    """`subject.erased`, before the subject's fact_versions are deleted: forget the accesses of its versions.

    Its version ids are kept as salted hashes (`erased_versions`), so an access of one of them that the access
    projector has not applied yet is dropped when it comes; the accesses already applied are deleted and the
    facts' aggregates recomputed (an aggregate left with no accesses is gone).
    """
    cur.execute(
        'SELECT memory_id, version_id, status, "partition" FROM fact_versions WHERE tenant = %s AND subject = %s',
        (tenant, subject),
    )
    rows = cur.fetchall()
    if not rows:
        return
    memory_ids = sorted({m for m, *_ in rows})
    version_ids = [v for _, v, *_ in rows]
    lock_access_facts(cur, memory_ids)
    # the access counters lose the subject's active facts (their versions are deleted next), on the shard of the
    # subject's partition: its events share one key, so this batch holds that partition's position row locked
    gone = {(tenant, m): -1 for m, _, status, _ in rows if status == ACTIVE}
    add_counts(cur, transition_deltas(cur, gone), shard=min(p for *_, p in rows))
    keep_erased_versions(cur, tenant, version_ids)
    cur.execute("DELETE FROM accesses WHERE tenant = %s AND version_id = ANY(%s)", (tenant, version_ids))
    recount(cur, tenant, memory_ids)
