"""A tenant's cue vocabulary (entity ids, subjects, key aliases) read from PostgreSQL, cached briefly.

The cache keeps recall's exact path to one ES query and one PG query; a new alias or
entity becomes a cue within about `ttl` seconds, or `min_age` after a query that found nothing
(until then an id-shaped token still anchors the exact stage, and keyword/semantic find the rest).
A reload scans the tenant's versions (~0.5 s at 83k versions), hence the long ttl.

Erasure cannot wait for the ttl: a cached vocabulary would keep naming the erased subject and its
key aliases in recall's `cues`. The recorder runs `pg_notify('memory_ledger_erasure', {schema,
tenant, subject})` in the erasure's transaction; `ErasureListener` keeps one LISTEN connection per
process and drops that (schema, tenant) entry when the notification arrives (milliseconds after the
commit), so the next recall reloads. Notifications sent while the connection was down are lost, so
every (re)connection drops the whole cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import orjson
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from projections.search.cues import Vocabulary

__all__ = ["ERASURE_CHANNEL", "ErasureListener", "VocabularyCache", "load_vocabulary"]

ERASURE_CHANNEL = "memory_ledger_erasure"  # the recorder's pg_notify channel: {schema, tenant, subject}

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


class ErasureListener:
    """One LISTEN connection that calls `on_erasure(schema, tenant)` for each erasure notification.

    Reconnects with exponential backoff (`min_backoff` .. `max_backoff` seconds) when the connection
    drops, and calls `on_connect()` after every successful LISTEN (what was sent meanwhile is lost).
    A quiet connection is probed every `heartbeat` seconds, so a dead one is noticed without traffic.
    """

    def __init__(
        self,
        dsn: str,
        on_erasure: Callable[[str | None, str | None], None],
        on_connect: Callable[[], None] = lambda: None,
        *,
        min_backoff: float = 0.1,
        max_backoff: float = 5.0,
        heartbeat: float = 30.0,
    ) -> None:
        self.dsn, self.on_erasure, self.on_connect = dsn, on_erasure, on_connect
        self.min_backoff, self.max_backoff, self.heartbeat = min_backoff, max_backoff, heartbeat
        self.notifications = 0  # received since start (for tests and the trace)
        self.connections = 0  # successful LISTENs since start
        self.backend_pid: int | None = None  # of the live LISTEN connection, None while down
        self._task: asyncio.Task[None] | None = None

    @property
    def listening(self) -> bool:
        return self.backend_pid is not None

    def start(self) -> None:
        """Start (or restart, on another event loop) the listening task; idempotent."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="erasure-listener")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _handle(self, payload: str) -> None:
        self.notifications += 1
        try:
            data = orjson.loads(payload)
            schema, tenant = data["schema"], data["tenant"]
            if not isinstance(schema, str) or not isinstance(tenant, str):
                raise TypeError("schema and tenant must be strings")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:  # unreadable: drop everything, to be safe
            log.warning("unreadable %s notification %r (%s): dropping every vocabulary", ERASURE_CHANNEL, payload, exc)
            schema = tenant = None
        self.on_erasure(schema, tenant)

    async def _listen_once(self) -> None:
        async with await AsyncConnection.connect(
            self.dsn, autocommit=True, keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3
        ) as conn:
            await conn.execute(f"LISTEN {ERASURE_CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self.connections += 1
            self.on_connect()
            try:
                while True:
                    async for note in conn.notifies(timeout=self.heartbeat):
                        self._handle(note.payload)
                    await conn.execute("SELECT 1")  # quiet for `heartbeat` s: is the connection still there?
            finally:
                self.backend_pid = None

    async def _run(self) -> None:
        backoff = self.min_backoff
        while True:
            started = time.monotonic()
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a dropped or refused connection: try again, more slowly each time
                if time.monotonic() - started > 10 * self.max_backoff:
                    backoff = self.min_backoff  # it had been up for a while: this is a new outage
                log.warning("erasure listener down (%s: %s); reconnecting in %.1f s", type(exc).__name__, exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)


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
        self._generation: dict[tuple[str, str], int] = {}  # bumped by invalidate(): a load begun before is stale
        self.invalidations = 0
        self.listener: ErasureListener | None = None

    def invalidate(self, schema: str | None = None, tenant: str | None = None) -> None:
        """Forget the matching entries (None matches all), and the loads in flight for them: they may have
        read the rows before the erasure committed, so their result is not cached either."""
        self.invalidations += 1

        def match(k: tuple[str, str]) -> bool:
            return (schema is None or k[0] == schema) and (tenant is None or k[1] == tenant)

        for k in [k for k in self._items if match(k)]:
            del self._items[k]
        for k in [k for k in self._loading if match(k)]:
            self._generation[k] = self._generation.get(k, 0) + 1
            del self._loading[k]

    def listen(self, dsn: str) -> ErasureListener:
        """Drop a tenant's entry as soon as an erasure of one of its subjects commits (one LISTEN connection
        per cache, started on the running loop; idempotent)."""
        if self.listener is None:
            self.listener = ErasureListener(dsn, self.invalidate, on_connect=self.invalidate)
        self.listener.start()
        return self.listener

    async def aclose(self) -> None:
        if self.listener is not None:
            await self.listener.aclose()

    async def _load(self, pool: AsyncConnectionPool, key: tuple[str, str], generation: int) -> Vocabulary:
        async with pool.connection() as conn:
            entities, subjects, key_aliases = await _rows(conn, key[1])
        # building is CPU work proportional to the tenant's data: keep it off the event loop
        vocab = await asyncio.to_thread(
            lambda: Vocabulary.build(entities=entities, subjects=subjects, key_aliases=key_aliases)
        )
        if self._generation.get(key, 0) != generation:
            return vocab  # invalidated while loading (an erasure committed): serve this caller, cache nothing
        if key not in self._items and len(self._items) >= self.max_tenants:
            self._items.pop(next(iter(self._items)))
        self._items[key] = (time.monotonic(), vocab)
        return vocab

    def _start(self, pool: AsyncConnectionPool, key: tuple[str, str]) -> asyncio.Task[Vocabulary]:
        task = self._loading.get(key)
        if task is None:
            generation = self._generation.get(key, 0)  # as of now: an invalidation from here on voids the result
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(pool, key, generation))
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
