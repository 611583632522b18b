"""A tenant's cue vocabulary (entity ids, subjects, key aliases) read from PostgreSQL, cached briefly.

The cache keeps recall's exact path to one ES query and one PG query; a new alias or
entity becomes a cue within about `ttl` seconds, or `min_age` after a query that found nothing
(until then an id-shaped token still anchors the exact stage, and keyword/semantic find the rest).
A reload scans the tenant's versions (~0.5 s at 83k versions), hence the long ttl.
"""

from __future__ import annotations

import asyncio
import logging
import time

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from projections.search.cues import Vocabulary

__all__ = ["VocabularyCache", "load_vocabulary"]

log = logging.getLogger(__name__)

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


async def _rows(conn: AsyncConnection, tenant: str) -> tuple[list[str], list[str], list[tuple[str, list[str]]]]:
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
    return entities, subjects, key_aliases


async def load_vocabulary(conn: AsyncConnection, tenant: str) -> Vocabulary:
    """Build the vocabulary of one tenant from its fact versions (all of them: history is findable too)."""
    entities, subjects, key_aliases = await _rows(conn, tenant)
    return Vocabulary.build(entities=entities, subjects=subjects, key_aliases=key_aliases)


class VocabularyCache:
    """Per (schema, tenant) vocabulary, stale-while-revalidate.

    A fresh entry (younger than `ttl`) is served as is; an older one is still served while one
    background task reloads it, so no request waits for a reload; only a tenant's very first
    recall waits for its load (concurrent first requests share it).
    """

    def __init__(self, ttl: float = 30.0, max_tenants: int = 1024) -> None:
        self.ttl, self.max_tenants = ttl, max_tenants
        self._items: dict[tuple[str, str], tuple[float, Vocabulary]] = {}
        self._loading: dict[tuple[str, str], asyncio.Task[Vocabulary]] = {}

    def invalidate(self, schema: str | None = None, tenant: str | None = None) -> None:
        for k in list(self._items):
            if (schema is None or k[0] == schema) and (tenant is None or k[1] == tenant):
                del self._items[k]

    async def _load(self, pool: AsyncConnectionPool, key: tuple[str, str]) -> Vocabulary:
        async with pool.connection() as conn:
            entities, subjects, key_aliases = await _rows(conn, key[1])
        # building is CPU work proportional to the tenant's data: keep it off the event loop
        vocab = await asyncio.to_thread(
            lambda: Vocabulary.build(entities=entities, subjects=subjects, key_aliases=key_aliases)
        )
        if key not in self._items and len(self._items) >= self.max_tenants:
            self._items.pop(next(iter(self._items)))
        self._items[key] = (time.monotonic(), vocab)
        return vocab

    def _start(self, pool: AsyncConnectionPool, key: tuple[str, str]) -> asyncio.Task[Vocabulary]:
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(pool, key))
            task.add_done_callback(lambda t, k=key: self._done(k, t))
        return task

    def _done(self, key: tuple[str, str], task: asyncio.Task[Vocabulary]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning("vocabulary reload for %s failed: %s", key, task.exception())

    def nudge(self, pool: AsyncConnectionPool, schema: str, tenant: str, min_age: float = 5.0) -> None:
        """The copy may be missing something a query asked for: reload in the background if it is older than
        `min_age` seconds (so a burst of such queries costs at most one reload per `min_age`)."""
        hit = self._items.get((schema, tenant))
        if hit is not None and time.monotonic() - hit[0] >= min_age:
            self._start(pool, (schema, tenant))

    async def get(self, pool: AsyncConnectionPool, schema: str, tenant: str) -> Vocabulary:
        """The tenant's vocabulary; a connection is taken from `pool` only when it must be (re)loaded."""
        key = (schema, tenant)
        hit = self._items.get(key)
        if hit is None:
            return await asyncio.shield(self._start(pool, key))
        if time.monotonic() - hit[0] >= self.ttl:
            self._start(pool, key)  # refresh in the background, serve the stale copy now
        return hit[1]
