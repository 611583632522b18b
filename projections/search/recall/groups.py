"""One hit per group of near-duplicate episodes (the groups: projections.search.duplicates).

After the hits are ordered, the episodes among them are looked up in `episode_links` (one query): a hit whose
group already has a better hit is folded into it, and the hit kept lists every other episode of its group
(those retrieved and those not) in its explanation, `match.duplicates`, so nothing said is hidden, only not
repeated. Only the episodes that hold at the recall's valid time, as the ledger knew them at its `known_at` when
given (queries.episode_holds_sql), are listed: a copy said later, or logged later, is not there yet. Facts
(states, preferences, events) are never grouped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from projections.postgres.queries import below_json, episode_holds_sql
from projections.search.recall.scoring import Scored

__all__ = ["GROUPS_SQL", "GROUP_SLACK", "collapse"]

GROUP_SLACK = 20  # hits past top_k looked at, so folded copies leave room for the next distinct ones


def _groups_sql(known: bool, below: bool = False) -> str:
    """The links of every group a hit belongs to (as a member, or as the group's first episode), each with whether
    the member and the group's first episode hold at %(at)s (as known at %(known_at)s if `known`; `below`: and
    logged below %(below)s, a receipt's positions)."""
    holds = episode_holds_sql("at", "known_at" if known else None, "below" if below else None)
    return f"""
WITH g AS (
  SELECT coalesce((SELECT l.group_id FROM episode_links l WHERE l.version_id = v), v) AS group_id
  FROM unnest(%(vids)s::text[]) AS v),
l AS (SELECT version_id, group_id FROM episode_links WHERE tenant = %(tenant)s AND group_id IN (SELECT group_id FROM g))
SELECT l.version_id, l.group_id,
  EXISTS (SELECT 1 FROM fact_versions f WHERE f.version_id = l.version_id AND {holds}),
  EXISTS (SELECT 1 FROM fact_versions f WHERE f.version_id = l.group_id AND {holds})
FROM l
"""


# by (known_at given, below given: only with known_at)
GROUPS_SQL = {(k, b): _groups_sql(k, b) for k, b in ((False, False), (True, False), (True, True))}


async def collapse(
    pool: Any,
    tenant: str,
    hits: Sequence[Scored],
    at: datetime,
    known_at: datetime | None = None,
    below: Mapping[int, int] | None = None,
) -> list[Scored]:
    """`hits` (best first) with each near-duplicate group's best hit only, carrying the group's other episodes that
    hold at `at` (as known at `known_at`)."""
    episodes = [h.row["version_id"] for h in hits if h.row.get("kind") == "episodic"]
    if not episodes:
        return list(hits)
    params = {"vids": episodes, "tenant": tenant, "at": at, "known_at": known_at, "below": below_json(below)}
    known = known_at is not None
    async with pool.connection() as conn:
        links = await (await conn.execute(GROUPS_SQL[known, known and below is not None], params)).fetchall()
    if not links:
        return list(hits)
    group_of = {v: g for v, g, _, _ in links}
    members: dict[str, set[str]] = defaultdict(set)
    for v, g, v_holds, g_holds in links:
        members[g] |= {x for x, ok in ((v, v_holds), (g, g_holds)) if ok}
    out: list[Scored] = []
    kept: set[str] = set()
    for h in hits:
        vid = h.row["version_id"]
        group = group_of.get(vid, vid)
        if h.row.get("kind") != "episodic" or group not in members:
            out.append(h)
            continue
        if group in kept:
            continue  # a copy of a better hit: listed in that hit's explanation
        kept.add(group)
        out.append(replace(h, duplicates=tuple(sorted(members[group] - {vid}))))
    return out
