"""One hit per group of near-duplicate episodes (issue 15; the groups: projections.search.duplicates).

After the hits are ordered, the episodes among them are looked up in `episode_links` (one query): a hit whose
group already has a better hit is folded into it, and the hit kept lists every other episode of its group
(those retrieved and those not) in its explanation, `match.duplicates`, so nothing said is hidden, only not
repeated. Facts (states, preferences, events) are never grouped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from projections.search.recall.scoring import Scored

__all__ = ["GROUPS_SQL", "GROUP_SLACK", "collapse"]

GROUP_SLACK = 20  # hits past top_k looked at, so folded copies leave room for the next distinct ones

# the links of every group a hit belongs to (as a member, or as the group's first episode)
GROUPS_SQL = """
WITH g AS (
  SELECT coalesce((SELECT l.group_id FROM episode_links l WHERE l.version_id = v), v) AS group_id
  FROM unnest(%s::text[]) AS v)
SELECT version_id, group_id FROM episode_links WHERE tenant = %s AND group_id IN (SELECT group_id FROM g)
"""


async def collapse(pool: Any, tenant: str, hits: Sequence[Scored]) -> list[Scored]:
    """`hits` (best first) with each near-duplicate group's best hit only, carrying the group's other episodes."""
    episodes = [h.row["version_id"] for h in hits if h.row.get("kind") == "episodic"]
    if not episodes:
        return list(hits)
    async with pool.connection() as conn:
        links = await (await conn.execute(GROUPS_SQL, (episodes, tenant))).fetchall()
    if not links:
        return list(hits)
    group_of = {v: g for v, g in links}
    members: dict[str, set[str]] = defaultdict(set)
    for v, g in links:
        members[g] |= {v, g}
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
