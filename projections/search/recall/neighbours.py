"""Neighbouring turns as the context of an episode hit: what was said just before and just after it.

A turn's meaning often sits in the turns around it ("Yes, last Tuesday"). The event contract has no session id, so
a session is read from what every episode has: same tenant and `source.service`, observed within
`recall_context_window_s` of the hit; each turn as the ledger holds it at the recall's times. One query for all
hits, run only when a recall asks for `context_turns`: facts get none, and an unasked recall pays nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from projections import shapes
from projections.postgres.queries import below_json, episode_holds_sql
from projections.search.recall.trace import iso

__all__ = ["MAX_CONTEXT_TURNS", "NEIGHBOURS_SQL", "how", "neighbours"]

MAX_CONTEXT_TURNS = 5  # each side: the request's bound (api.requests.RecallBody.context_turns)

_COLS = "f.memory_id, f.version_id, f.subject, f.content, f.observed_at, f.source"


def _neighbours_sql(known: bool, below: bool = False) -> str:
    """Per hit (h), the n turns before and the n after, nearest first; `side` -1 before, +1 after; `known`: as the
    ledger knew them at %(known_at)s (`below`: and logged below %(below)s, a receipt's positions)."""
    same = (
        "f.tenant = %(tenant)s AND f.kind = 'episodic' AND f.version_id <> h.vid"
        " AND (f.source->>'service') IS NOT DISTINCT FROM h.svc AND "
        + episode_holds_sql("at", "known_at" if known else None, "below" if below else None)
    )
    return f"""
SELECT h.vid AS of, n.* FROM unnest(%(vids)s::text[], %(times)s::timestamptz[], %(svcs)s::text[]) AS h(vid, t, svc)
CROSS JOIN LATERAL (
  (SELECT -1 AS side, {_COLS} FROM fact_versions f
   WHERE {same} AND f.observed_at >= h.t - %(window)s AND (f.observed_at, f.version_id) < (h.t, h.vid)
   ORDER BY f.observed_at DESC, f.version_id DESC LIMIT %(n)s)
  UNION ALL
  (SELECT 1 AS side, {_COLS} FROM fact_versions f
   WHERE {same} AND f.observed_at <= h.t + %(window)s AND (f.observed_at, f.version_id) > (h.t, h.vid)
   ORDER BY f.observed_at, f.version_id LIMIT %(n)s)
) n
"""


# by (known_at given, below given: only with known_at)
NEIGHBOURS_SQL = {(k, b): _neighbours_sql(k, b) for k, b in ((False, False), (True, False), (True, True))}


def how(window_s: float) -> str:
    """The rule, as the explanation states it."""
    return (
        f"turns of the same tenant and source.service observed within {window_s:g} s of this one, nearest first "
        "on each side, any speaker, as they hold at as_of (as known at known_at, when given)"
    )


def _service(row: dict[str, Any]) -> str | None:
    src = row.get("source")
    svc = src.get("service") if isinstance(src, dict) else None
    return svc if isinstance(svc, str) else None


async def neighbours(
    pool: Any,
    tenant: str,
    at: datetime,
    rows: Sequence[dict[str, Any]],
    n: int,
    window_s: float,
    known_at: datetime | None = None,
    below: Mapping[int, int] | None = None,
) -> dict[str, list[shapes.ContextTurn]]:
    """version_id of each episodic row -> its neighbouring turns in time order, each with `offset` (-n..-1, 1..n)."""
    eps = [r for r in rows if r.get("kind") == "episodic"]
    if not eps or n < 1:
        return {}
    params = {
        "tenant": tenant,
        "at": at,
        "vids": [r["version_id"] for r in eps],
        "times": [r["observed_at"] for r in eps],
        "svcs": [_service(r) for r in eps],
        "window": timedelta(seconds=window_s),
        "n": min(n, MAX_CONTEXT_TURNS),
        "known_at": known_at,
        "below": below_json(below),
    }
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(NEIGHBOURS_SQL[known_at is not None, known_at is not None and below is not None], params)
        found = await cur.fetchall()
    by_hit: dict[str, dict[int, list[dict[str, Any]]]] = {r["version_id"]: {-1: [], 1: []} for r in eps}
    for r in found:
        by_hit[r["of"]][r["side"]].append(r)
    out: dict[str, list[shapes.ContextTurn]] = {}
    for vid, sides in by_hit.items():  # in time order (a UNION's row order is not promised)
        before = sorted(sides[-1], key=_when)
        after = sorted(sides[1], key=_when)
        out[vid] = [_turn(r, i - len(before)) for i, r in enumerate(before)]
        out[vid] += [_turn(r, i + 1) for i, r in enumerate(after)]
    return out


def _when(r: dict[str, Any]) -> tuple[datetime, str]:
    return r["observed_at"], r["version_id"]


def _turn(r: dict[str, Any], offset: int) -> shapes.ContextTurn:
    return {
        "offset": offset,
        "memory_id": r["memory_id"],
        "version_id": r["version_id"],
        "subject": r["subject"],
        "content": r["content"],
        "observed_at": iso(r["observed_at"]),
        "source": r["source"],
    }
