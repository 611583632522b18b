"""Access tracking in recall: the order of candidates a stage scores exactly alike.

The index lists tied candidates in its own storage order (Lucene's segments), which would decide their fused ranks;
a run of ties is put in order of the facts' access signal, then version id, so equal states give equal rankings.
The signal is read (one small query) only when a list holds a tie; as known at an earlier time ties go by version id.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from projections.search.recall.model import Candidate
from projections.search.recall.scoring import access_signal

if TYPE_CHECKING:
    from projections.search.recall.stages import Stage

__all__ = ["access_signals", "order_ties", "tied_memory_ids"]

Found = Sequence[tuple["Stage[Any]", list[Candidate]]]


def _runs(cands: list[Candidate]) -> list[tuple[int, int]]:
    """[start, end) of each run of two or more adjacent candidates with the same (non-None) score."""
    runs, i = [], 0
    while i < len(cands):
        j = i + 1
        while j < len(cands) and cands[i].score is not None and cands[j].score == cands[i].score:
            j += 1
        if j - i > 1:
            runs.append((i, j))
        i = j
    return runs


def tied_memory_ids(found: Found) -> list[str]:
    """The memory ids of candidates that tie with a neighbour in some stage's list (sorted; empty: no tie)."""
    ids = {c.memory_id for _, cands in found for a, b in _runs(cands) for c in cands[a:b]}
    return sorted(ids)


def order_ties(found: Found, signals: dict[str, float]) -> list[tuple[Stage[Any], list[Candidate]]]:
    """Each stage's list with every run of ties in order of `signals` (memory_id -> access signal), highest
    first; among equal signals (a fact never served: 0) by version id, not the index's storage order."""
    out = []
    for stage, cands in found:
        cands = list(cands)
        for a, b in _runs(cands):
            cands[a:b] = sorted(cands[a:b], key=lambda c: (-signals.get(c.memory_id, 0.0), c.version_id))
        out.append((stage, cands))
    return out


async def access_signals(
    pool: AsyncConnectionPool, tenant: str, memory_ids: list[str], at: datetime
) -> dict[str, float]:
    """memory_id -> scoring.access_signal at `at`, for the facts of `memory_ids` that were ever served."""
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT memory_id, accesses, last_accessed_at FROM access_counts WHERE tenant = %s AND memory_id = ANY(%s)",
            (tenant, memory_ids),
        )
        rows = await cur.fetchall()
    return {r["memory_id"]: access_signal(r, at) for r in rows}
