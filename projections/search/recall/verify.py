"""Verification: every candidate's fact is re-read in PostgreSQL, and only the version that holds there counts.

What the index says is only ever a candidate: a lagging index can delay a new value, never resurrect an old one.
A candidate whose fact has a newer version that holds at `at` is answered by that version
(`match.verified.replaced_by`); one whose fact does not hold at `at` (retracted, erased, out of its window), or
fails the caller's filters, is dropped. As known at `known_at`, the index also proposes versions ended since, so
a fact is found only through the version the ledger knew then, and only if it held then as known then: a version
it had already replaced by then matching the question never answers with its successor's text (recall as known
now is recall without `known_at`); the caller re-folds each hit as known then (api.reads).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from projections.postgres.queries import (
    OVERRIDE,
    below_json,
    below_sql,
    held_then_sql,
    visible_sql,
)
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


def _known_sql(with_subject: bool, basis: bool = False, below: bool = False) -> str:
    """As known at %(known_at)s: of each candidate's fact, the version the ledger knew then at %(at)s (the fold's
    pick: an override in force, else the latest version logged by then that began by %(at)s), whatever ended it
    since, if it held then as the ledger knew it (queries.held_then_sql). Only a candidate of that version speaks
    for the fact (verify); the caller re-folds the fact as known then (api.reads, queries.current_facts with
    known_at), which shows the version that held then or drops the hit. An
    episode or an override (one version that supersedes nothing) is kept only if it held then
    (queries.held_then_sql), so that an ended override does not stand for the long-term value, and the
    near-duplicate groups and context turns built on the hits are built on what held. No access aggregate: it
    counts accesses up to now, recorded after known_at, and an answer as known then must not rank by them.
    `below`: only the versions (and an episode's retractions) logged below %(below)s (a receipt's positions,
    queries.below_sql)."""
    where = (
        "f.tenant = %(tenant)s AND f.memory_id = ANY(%(mids)s) AND f.observed_at <= %(known_at)s "
        f"AND f.valid_from <= %(at)s AND (NOT (f.kind = 'episodic' OR {OVERRIDE}) OR "
        + held_then_sql("at", "known_at", "below" if below else None)
        + ")"
        + (" AND f.subject = %(subject)s" if with_subject else "")
        + (f" AND {below_sql('f')}" if below else "")
    )
    picked = (
        sql.SQL(
            "SELECT DISTINCT ON (f.memory_id) {cols}, NULL::bigint AS accesses, NULL::timestamptz AS last_accessed_at "
            "FROM fact_versions f WHERE " + where + " ORDER BY f.memory_id, " + OVERRIDE + " DESC, f.valid_from DESC, "
            "f.observed_at DESC, f.version_id DESC"
        )
        .format(cols=_columns(basis))
        .as_string()
    )
    # a pick that no longer held then (ended in its own window, or retracted) shows its fact as nothing: dropped
    # here, not left to the caller's re-fold, so a stage that found only such facts found nothing (as a read
    # then did) and the next stage is asked
    holds = held_then_sql("at", "known_at", "below" if below else None)
    return f"SELECT f.* FROM ({picked}) f WHERE {holds} ORDER BY f.memory_id"


def _known_basis_sql(with_subject: bool, below: bool) -> str:
    """_known_sql with what the answer's receipt is made of (receipts.BASIS_COLUMNS, CITED_COLUMNS)."""
    return f"SELECT v.*{_basis_columns(True)} FROM ({_known_sql(with_subject, True, below)}) v ORDER BY v.memory_id"


# by (subject given, receipt basis wanted, below positions given)
_KNOWN_SQL = {
    (s, b, w): _known_basis_sql(s, w) if b else _known_sql(s, False, w)
    for s in (False, True)
    for b in (False, True)
    for w in (False, True)
}


async def verify(
    pool: AsyncConnectionPool, q: RecallQuery, at: datetime, matches: list[Match], basis: Basis | None = None
) -> list[tuple[dict[str, Any], Match]]:
    """(row, match) for each candidate fact that holds at `at` and passes the filters; one per fact, in
    memory_id order. Several versions of one fact: the best-fused match speaks for it, and as known at a time the
    match of the version the ledger knew then, or none. `basis`: the same statement also reads what the answer's
    receipt is made of, into it (a receipt then costs recall no read of its own)."""
    by_memory: dict[str, Match] = {}
    by_version = {m.version_id: m for m in matches}
    for m in matches:
        prev = by_memory.get(m.memory_id)
        if prev is None or m.fused > prev.fused:
            by_memory[m.memory_id] = m
    params = {"tenant": q.tenant, "mids": sorted(by_memory), "at": at, "subject": q.subject, "known_at": q.known_at}
    if q.known_at is None:
        query = _VERIFY_SQL[bool(q.subject), basis is not None]
    else:
        query = _KNOWN_SQL[bool(q.subject), basis is not None, q.below is not None]
        params["below"] = below_json(q.below)
    if basis is not None:
        params |= basis.params()
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        rows = await cur.fetchall()
    if basis is not None:
        basis.take(rows)
    if q.known_at is not None:  # a version replaced by then does not speak for the one the ledger knew
        rows = [row for row in rows if row["version_id"] in by_version]
        by_memory = {row["memory_id"]: by_version[row["version_id"]] for row in rows}
    return [(row, by_memory[row["memory_id"]]) for row in rows if q.filters.accepts(row)]
