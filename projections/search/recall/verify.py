"""Verification: every candidate's fact is re-read in PostgreSQL, and only the version that holds there counts.

What the index says is only ever a candidate: a lagging index can delay a new value, never resurrect an old one.
A candidate whose fact has a newer version that holds at `at` is answered by that version
(`match.verified.replaced_by`); one whose fact does not hold at `at` (retracted, erased, out of its window), or
fails the caller's filters, is dropped. As known at `known_at`, the fold of each candidate's fact as the ledger
knew it then decides instead of the current state, and only a candidate that held then speaks (the index then
also proposes versions ended since): a version it had already replaced by then matching the question never
answers with its successor's text (recall as known now is recall without `known_at`); the caller re-folds each
hit as known then (api.reads).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from projections.postgres.queries import one_snapshot, shown_as_known, visible_sql
from projections.postgres.receipts import BASIS_COLUMNS, CITED_COLUMNS, Basis
from projections.search.documents import ROW_COLUMNS
from projections.search.recall.model import Match, RecallQuery

__all__ = ["verify"]


def _verify_sql(with_subject: bool, basis: bool) -> str:
    """The candidates' facts, each as the one version visible at %(at)s (override first, then latest), with the
    fact's access aggregate (`accesses`, `last_accessed_at`: NULL when never served) for the prior; `basis`: with
    what the answer's receipt is made of (receipts.BASIS_COLUMNS, CITED_COLUMNS)."""
    where = "f.tenant = %(tenant)s AND f.memory_id = ANY(%(mids)s)" + (
        " AND f.subject = %(subject)s" if with_subject else ""
    )
    visible = visible_sql(_columns(basis), sql.SQL(where), "at").as_string()
    return (
        f"SELECT v.*, a.accesses, a.last_accessed_at{_basis_columns(basis)} FROM ({visible}) v "
        "LEFT JOIN access_counts a ON a.tenant = v.tenant AND a.memory_id = v.memory_id ORDER BY v.memory_id"
    )


def _basis_columns(basis: bool) -> str:
    return ", " + BASIS_COLUMNS if basis else ""


def _columns(basis: bool) -> sql.Composable:
    """ROW_COLUMNS, and with `basis` what a receipt cites of each row (receipts.CITED_COLUMNS: columns of `f`)."""
    return sql.SQL(", ").join([ROW_COLUMNS, sql.SQL(CITED_COLUMNS)]) if basis else ROW_COLUMNS


# rendered once, by (subject given, receipt basis wanted): the exact path stays lean
_VERIFY_SQL = {(s, b): _verify_sql(s, b) for s in (False, True) for b in (False, True)}


def _rows_sql(with_subject: bool, basis: bool) -> str:
    """The rows of the versions %(vids)s, as _verify_sql reads them but with no access aggregate (it counts
    accesses up to now, recorded after known_at, and an answer as known then must not rank by them)."""
    where = "f.tenant = %(tenant)s AND f.version_id = ANY(%(vids)s)" + (
        " AND f.subject = %(subject)s" if with_subject else ""
    )
    inner = (
        sql.SQL(
            "SELECT {cols}, NULL::bigint AS accesses, NULL::timestamptz AS last_accessed_at FROM fact_versions f "
            "WHERE " + where
        )
        .format(cols=_columns(basis))
        .as_string()
    )
    return f"SELECT v.*{_basis_columns(basis)} FROM ({inner}) v ORDER BY v.memory_id"


_ROWS_SQL = {(s, b): _rows_sql(s, b) for s in (False, True) for b in (False, True)}


async def verify(
    pool: AsyncConnectionPool, q: RecallQuery, at: datetime, matches: list[Match], basis: Basis | None = None
) -> list[tuple[dict[str, Any], Match]]:
    """(row, match) for each candidate fact that holds at `at` and passes the filters; one per fact, in
    memory_id order. Several versions of one fact: the best-fused match speaks for it (as known at a time, of
    those that held then: _verify_as_known). `basis`: the same statement also reads what the answer's
    receipt is made of, into it (a receipt then costs recall no read of its own)."""
    if q.known_at is not None:
        return await _verify_as_known(pool, q, q.known_at, at, matches, basis)
    by_memory: dict[str, Match] = {}
    for m in matches:
        prev = by_memory.get(m.memory_id)
        if prev is None or m.fused > prev.fused:
            by_memory[m.memory_id] = m
    params = {"tenant": q.tenant, "mids": sorted(by_memory), "at": at, "subject": q.subject}
    if basis is not None:
        params |= basis.params()
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_VERIFY_SQL[bool(q.subject), basis is not None], params)
        rows = await cur.fetchall()
    if basis is not None:
        basis.take(rows)
    return [(row, by_memory[row["memory_id"]]) for row in rows if q.filters.accepts(row)]


async def _verify_as_known(
    pool: AsyncConnectionPool,
    q: RecallQuery,
    known_at: datetime,
    at: datetime,
    matches: list[Match],
    basis: Basis | None,
) -> list[tuple[dict[str, Any], Match]]:
    """verify as known at `known_at` (and below `q.below`): the fold of each candidate's fact as the ledger knew
    it then decides (queries.shown_as_known), as the current state decides as known now. A candidate speaks for
    its fact only if its version held at `at` then (to the index's millisecond), as the index proposes only versions
    that hold now (to the same): a version
    already replaced or ended by then that matches the question never answers with another's words. Of those,
    the best-fused speaks, and the fact answers with the version the fold shows then (an override in force
    first)."""
    async with pool.connection() as conn, one_snapshot(conn):
        mids = sorted({m.memory_id for m in matches})
        shown, held = await shown_as_known(conn, q.tenant, mids, at, known_at, q.below)
        speaking: dict[str, Match] = {}
        for m in matches:
            prev = speaking.get(m.memory_id)
            if m.version_id in held and m.memory_id in shown and (prev is None or m.fused > prev.fused):
                speaking[m.memory_id] = m
        if not speaking:
            return []
        params = {"tenant": q.tenant, "vids": sorted(shown[mid] for mid in speaking), "subject": q.subject}
        if basis is not None:
            params |= basis.params()
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_ROWS_SQL[bool(q.subject), basis is not None], params)
            rows = await cur.fetchall()
    if basis is not None:
        basis.take(rows)
    return [(row, speaking[row["memory_id"]]) for row in rows if q.filters.accepts(row)]
