"""A tenant's cue vocabulary (entity ids, subjects, key aliases) read from PostgreSQL, cached briefly.

The cache keeps recall's exact path to one ES query and one PG query; a new alias or
entity becomes a cue within `ttl` seconds (until then keyword/semantic still find it).
"""

from __future__ import annotations

import asyncio
import time

from psycopg import AsyncConnection

from projections.search.cues import Vocabulary

__all__ = ["VocabularyCache", "load_vocabulary"]

_SQL = """
SELECT 'e', e, NULL::text[] FROM (SELECT DISTINCT unnest(entities) AS e FROM fact_versions WHERE tenant = %(t)s) x
UNION ALL
SELECT 's', subject, NULL::text[] FROM (SELECT DISTINCT subject FROM fact_versions WHERE tenant = %(t)s) y
UNION ALL
SELECT 'a', key, aliases FROM (
    SELECT key, array_agg(DISTINCT a) FILTER (WHERE a IS NOT NULL) AS aliases
    FROM fact_versions LEFT JOIN LATERAL unnest(aliases) a ON true
    WHERE tenant = %(t)s AND key IS NOT NULL GROUP BY key
) z
"""


async def load_vocabulary(conn: AsyncConnection, tenant: str) -> Vocabulary:
    """Build the vocabulary of one tenant from its fact versions (all of them: history is findable too)."""
    entities, subjects, key_aliases = [], [], []
    async with conn.cursor() as cur:
        await cur.execute(_SQL, {"t": tenant})
        for kind, name, aliases in await cur.fetchall():
            if kind == "e":
                entities.append(name)
            elif kind == "s":
                subjects.append(name)
            else:
                key_aliases.append((name, aliases or []))
    return Vocabulary.build(entities=entities, subjects=subjects, key_aliases=key_aliases)


class VocabularyCache:
    """Per (schema, tenant) vocabulary with a time-to-live; concurrent misses share one load."""

    def __init__(self, ttl: float = 5.0, max_tenants: int = 1024) -> None:
        self.ttl, self.max_tenants = ttl, max_tenants
        self._items: dict[tuple[str, str], tuple[float, Vocabulary]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def invalidate(self, schema: str | None = None, tenant: str | None = None) -> None:
        for k in list(self._items):
            if (schema is None or k[0] == schema) and (tenant is None or k[1] == tenant):
                del self._items[k]

    async def get(self, conn: AsyncConnection, schema: str, tenant: str) -> Vocabulary:
        key = (schema, tenant)
        hit = self._items.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._items.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            vocab = await load_vocabulary(conn, tenant)
            if len(self._items) >= self.max_tenants:
                self._items.pop(next(iter(self._items)))
            self._items[key] = (time.monotonic(), vocab)
            return vocab
