"""The access tables' rules that both writers share: the per-fact lock, and what an erasure does to accesses.

Two writers touch the access projection (`accesses`, `access_counts`, `erased_versions`, schema.sql): the access
projector (projections.postgres.access_projector), which adds accesses, and the ledger's Recorder, whose
`subject.erased` removes the accesses of the subject's versions. They run in different transactions of different
consumers, so both take `lock_access_facts` on the facts they touch (sorted, so they never deadlock), and each
sees what the other committed:

- the erasure came first: its versions are in `erased_versions` (salted hashes), and the projector drops an
  access of one of them (`erased_version_ids`) instead of counting it;
- the access came first: the erasure deletes it (`erase_accesses`) and recomputes the fact's aggregate.

Either order gives the same tables, which is what makes a rebuild from offset 0 (both topics replayed in any
interleaving) equal to the live projection. Memory and version ids are digests and the caller is a fingerprint,
so nothing personal is kept; even so an erased subject leaves no access row and no aggregate behind.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from projections.postgres.idempotency import ID_HASH_SQL

__all__ = ["erase_accesses", "erased_version_ids", "lock_access_facts", "recount"]


def lock_access_facts(cur: psycopg.Cursor, memory_ids: Iterable[str]) -> None:
    """Transaction-scoped advisory locks on the facts' access rows, in memory_id order (one order for everyone)."""
    ids = sorted(set(memory_ids))
    if ids:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('access:' || m, 0)) "
            "FROM unnest(%b::text[]) WITH ORDINALITY AS t(m, i) ORDER BY i",
            (ids,),
        )


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


def erase_accesses(cur: psycopg.Cursor, tenant: str, subject: str) -> None:
    """`subject.erased`, before the subject's fact_versions are deleted: forget the accesses of its versions.

    Its version ids are kept as salted hashes (`erased_versions`), so an access of one of them that the access
    projector has not applied yet is dropped when it comes; the accesses already applied are deleted and the
    facts' aggregates recomputed (an aggregate left with no accesses is gone).
    """
    cur.execute("SELECT memory_id, version_id FROM fact_versions WHERE tenant = %s AND subject = %s", (tenant, subject))
    rows = cur.fetchall()
    if not rows:
        return
    memory_ids = sorted({m for m, _ in rows})
    version_ids = [v for _, v in rows]
    lock_access_facts(cur, memory_ids)
    cur.execute(
        "INSERT INTO erased_versions (tenant, id_hash) "
        f"SELECT %s, {ID_HASH_SQL.format('v')} FROM unnest(%b::text[]) AS x(v) ON CONFLICT DO NOTHING",
        (tenant, version_ids),
    )
    cur.execute("DELETE FROM accesses WHERE tenant = %s AND version_id = ANY(%s)", (tenant, version_ids))
    recount(cur, tenant, memory_ids)
