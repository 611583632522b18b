"""A tenant's cue vocabulary (entity ids, subjects, key aliases) read from PostgreSQL, kept up to date incrementally.

A full load scans the tenant's versions, so it happens once per process and tenant; after that the indexer appends
what it made searchable to `vocab_log`, and a recall reads only what is past its cached watermark, so a new entity
is a cue for the first recall after its document is indexed, with no TTL. Appends happen under the per-schema lock
of claims.finish, so sequence order is commit order. Erasure removes what the log only adds: the recorder's
`memory_ledger_erasure` notification drops the tenant's entry (`CommitListener`), and a reconnection drops all. The
same connection hears the commits of the projection and the indexers, which wake the reads waiting for a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import orjson
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from projections.postgres.connection import KEEPALIVES
from projections.postgres.queries import below_json, below_sql
from projections.search.cues import Vocabulary
from projections.search.drain import ERASURE_CHANNEL, INDEXED_CHANNEL, OUTBOX_CHANNEL

__all__ = [
    "ERASURE_CHANNEL",
    "NEWEST_SQL",
    "VOCAB_LOG_KEEP",
    "CommitListener",
    "VocabularyCache",
    "built_vocabulary",
    "load_vocabulary",
    "log_indexed",
    "vocabulary_rows",
]

log = logging.getLogger(__name__)

VOCAB_LOG_KEEP = 200_000  # rows of vocab_log the indexer keeps (an API process further behind reloads whole)

_MARKS = "SELECT (SELECT min(seq) FROM vocab_log), (SELECT max(seq) FROM vocab_log WHERE tenant = %s)"
# the tenant's newest sequence (0: none) as a select-list item of another statement (parameter `tenant`)
NEWEST_SQL = "(SELECT coalesce(max(seq), 0) FROM vocab_log WHERE tenant = %(tenant)s) AS vocab_newest"
_DELTA = """
SELECT f.entities, f.subject, f.key, f.aliases, f.scope
FROM vocab_log l JOIN fact_versions f ON f.version_id = l.version_id
WHERE l.tenant = %s AND l.seq > %s AND l.seq <= %s
"""


def log_indexed(conn: psycopg.Connection, indexed: list[tuple[str, str]]) -> None:
    """The indexer made these (tenant, version_id) searchable: log them for the API's vocabularies (its transaction)."""
    if not indexed:
        return
    conn.execute(
        "INSERT INTO vocab_log (tenant, version_id) SELECT * FROM unnest(%s::text[], %s::text[])",
        ([t for t, _ in indexed], [v for _, v in indexed]),
    )
    conn.execute("DELETE FROM vocab_log WHERE seq <= (SELECT max(seq) FROM vocab_log) - %s", (VOCAB_LOG_KEEP,))


def _vocabulary_sql(below: bool) -> str:
    """The tenant's entities, subjects, keys with their aliases and scopes; `below`: of the versions logged below
    the positions %(below)s only (a replay's: the vocabulary the ledger had then)."""
    of = f"tenant = %(t)s AND {below_sql('f')}" if below else "tenant = %(t)s"
    return f"""
SELECT 'e', e, NULL::text[] FROM (SELECT DISTINCT unnest(entities) AS e FROM fact_versions f WHERE {of}) x
UNION ALL
SELECT 's', subject, NULL::text[] FROM (SELECT DISTINCT subject FROM fact_versions f WHERE {of}) y
UNION ALL
SELECT 'a', key, aliases FROM (
    SELECT key, array_agg(DISTINCT a) FILTER (WHERE a IS NOT NULL) AS aliases
    FROM fact_versions f LEFT JOIN LATERAL unnest(f.aliases) a ON true
    WHERE {of} AND key IS NOT NULL GROUP BY key
) z
UNION ALL
SELECT 'c', scope, NULL::text[] FROM (SELECT DISTINCT scope FROM fact_versions f WHERE {of} AND scope <> '') w
"""


_SQL = {below: _vocabulary_sql(below) for below in (False, True)}


_Rows = tuple[list[str], list[str], list[tuple[str, list[str]]], list[str]]


async def vocabulary_rows(conn: AsyncConnection, tenant: str, below: Mapping[int, int] | None = None) -> _Rows:
    """(entities, subjects, (key, aliases), scopes other than the default) of the tenant's versions (logged below
    `below`, if given)."""
    entities, subjects, key_aliases, scopes = [], [], [], []
    async with conn.cursor() as cur:
        await cur.execute(_SQL[below is not None], {"t": tenant, "below": below_json(below)})
        for kind, name, aliases in await cur.fetchall():
            if kind == "e":
                entities.append(name)
            elif kind == "s":
                subjects.append(name)
            elif kind == "c":
                scopes.append(name)
            else:
                key_aliases.append((name, aliases or []))
    return entities, subjects, key_aliases, scopes


async def load_vocabulary(conn: AsyncConnection, tenant: str, below: Mapping[int, int] | None = None) -> Vocabulary:
    """Build the vocabulary of one tenant from its fact versions (all of them: history is findable too); `below`:
    from those logged below these positions only (a receipt's: its replay reads the question with what the ledger
    had then, which holds what the index had, and what it had not indexed yet)."""
    return await built_vocabulary(*await vocabulary_rows(conn, tenant, below))


async def built_vocabulary(
    entities: list[str], subjects: list[str], key_aliases: list[tuple[str, list[str]]], scopes: list[str]
) -> Vocabulary:
    """The vocabulary of these names: CPU work proportional to them (seconds for 100,000s), off the event loop."""
    return await asyncio.to_thread(
        lambda: Vocabulary.build(entities=entities, subjects=subjects, key_aliases=key_aliases, scopes=scopes)
    )


class CommitListener:
    """One LISTEN connection that calls `on_erasure(schema, tenant)` for each erasure notification, and sets the
    event `changed()` gave at each commit the projection or an indexer announces (`progress` channels), so a read
    waiting for a write looks again at once instead of at its next poll (api.consistency).

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
        progress: tuple[str, ...] = (OUTBOX_CHANNEL, INDEXED_CHANNEL),
        schema: str | None = None,
    ) -> None:
        self.dsn, self.on_erasure, self.on_connect, self.progress = dsn, on_erasure, on_connect, progress
        self.schema = schema  # whose progress wakes (its notifications' payload); None: every schema's
        self._changed = asyncio.Event()
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
            self._changed = asyncio.Event()  # an asyncio.Event belongs to the loop that first waited on it
            self._task = loop.create_task(self._run(), name="commit-listener")

    def changed(self) -> asyncio.Event:
        """The event the next progress notification sets: take it before looking, then wait on it."""
        return self._changed

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

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
        async with await AsyncConnection.connect(self.dsn, autocommit=True, **KEEPALIVES) as conn:
            for channel in (ERASURE_CHANNEL, *self.progress):
                await conn.execute(f"LISTEN {channel}")
            self.backend_pid = conn.info.backend_pid
            self.connections += 1
            self.on_connect()
            self._wake()  # what committed while it was down was not heard
            try:
                while True:
                    async for note in conn.notifies(timeout=self.heartbeat):
                        if note.channel == ERASURE_CHANNEL:
                            self._handle(note.payload)
                        elif self.schema is None or note.payload == self.schema:
                            self._wake()
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
                log.warning("commit listener down (%s: %s); reconnecting in %.1f s", type(exc).__name__, exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)


class VocabularyCache:
    """Per (schema, tenant) vocabulary with its watermark in `vocab_log` (see the module docstring).

    `get` asks PostgreSQL for the tenant's newest logged sequence on every call and brings the cached copy up to it
    first (a delta, or a full load the first time, after an erasure, or when the log no longer reaches the
    watermark); concurrent callers share one load, so no time-to-live is needed: what was indexed since the last
    `get` is read by the next one. `current` does the same with the sequence its caller read (NEWEST_SQL).
    """

    def __init__(self, max_tenants: int = 1024) -> None:
        self.max_tenants = max_tenants
        self._items: dict[tuple[str, str], tuple[int, Vocabulary]] = {}  # key -> (watermark, vocabulary)
        self._loading: dict[tuple[str, str], asyncio.Task[Vocabulary]] = {}
        self._generation: dict[tuple[str, str], int] = {}  # bumped by invalidate(): a load begun before is stale
        self.invalidations = 0
        self.full_loads = 0  # for tests and the bench: how often a tenant was read whole
        self.delta_loads = 0
        self.listener: CommitListener | None = None
        # called with the tenant (None: every tenant) whenever this cache forgets one: the erasure notifications
        # this cache's listener hears outdate them as well
        self.also_forget: list[Callable[[str | None], None]] = []
        self._logged: set[str] = set()  # schemas whose vocab_log was read: NEWEST_SQL runs there

    def invalidate(self, schema: str | None = None, tenant: str | None = None) -> None:
        """Forget the matching entries (None matches all), and the loads in flight for them: they may have
        read the rows before the erasure committed, so their result is not cached either. Then the process's other
        caches of the tenant (`also_forget`: its data keys) forget it too."""
        self.invalidations += 1
        for forget in self.also_forget:
            forget(tenant)

        def match(k: tuple[str, str]) -> bool:
            return (schema is None or k[0] == schema) and (tenant is None or k[1] == tenant)

        for k in [k for k in self._items if match(k)]:
            del self._items[k]
        for k in [k for k in self._loading if match(k)]:
            self._generation[k] = self._generation.get(k, 0) + 1
            del self._loading[k]

    def listen(self, dsn: str, schema: str | None = None) -> CommitListener:
        """Drop a tenant's entry as soon as an erasure of one of its subjects commits (one LISTEN connection
        per cache, started on the running loop; idempotent); its progress events follow `schema`'s commits."""
        if self.listener is None:
            self.listener = CommitListener(dsn, self.invalidate, on_connect=self.invalidate, schema=schema)
        self.listener.start()
        return self.listener

    async def aclose(self) -> None:
        if self.listener is not None:
            await self.listener.aclose()

    def watermark(self, schema: str, tenant: str) -> int | None:
        hit = self._items.get((schema, tenant))
        return None if hit is None else hit[0]

    def cached(self, schema: str, tenant: str) -> Vocabulary | None:
        """The cached vocabulary as it is, not checked against the log: for a caller that reads the tenant's newest
        sequence (NEWEST_SQL) with a statement it runs anyway, then hands it to `current`. None: nothing cached, or
        a schema without the log."""
        hit = self._items.get((schema, tenant))
        return hit[1] if hit is not None and schema in self._logged else None

    async def current(self, pool: AsyncConnectionPool, schema: str, tenant: str, newest: int | None) -> Vocabulary:
        """The cached vocabulary if its watermark is `newest`, the tenant's newest sequence as the caller read it
        (NEWEST_SQL) after its call began; otherwise, or when it read none (None), `get`'s answer."""
        hit = self._items.get((schema, tenant))
        if newest is not None and hit is not None and hit[0] == newest:
            return hit[1]
        # something was logged since (or another caller caught up past `newest`, or the sequence restarted): `get`
        # reads the log's marks now and tells which
        return await self.get(pool, schema, tenant)

    async def _refresh(
        self, pool: AsyncConnectionPool, key: tuple[str, str], newest: int, delta_from: int | None, generation: int
    ) -> Vocabulary:
        """Bring the entry to `newest`: the rows after `delta_from` merged into the cached copy, or a full load."""
        async with pool.connection() as conn:
            if delta_from is not None:
                cur = await conn.execute(_DELTA, (key[1], delta_from, newest))
                rows = await cur.fetchall()
                entities = [e for ents, *_ in rows for e in ents or ()]
                subjects = [s for _, s, _, _, _ in rows]
                key_aliases = [(k, a or []) for _, _, k, a, _ in rows if k is not None]
                scopes = list({c for *_, c in rows if c})
            else:
                entities, subjects, key_aliases, scopes = await vocabulary_rows(conn, key[1])
        built = await built_vocabulary(entities, subjects, key_aliases, scopes)
        if delta_from is not None:
            self.delta_loads += 1
            base = self._items.get(key)
            vocab = built if base is None else base[1].merged(built)
        else:
            self.full_loads += 1
            vocab = built
        if self._generation.get(key, 0) != generation:
            return vocab  # invalidated while loading (an erasure committed): serve this caller, cache nothing
        if key not in self._items and len(self._items) >= self.max_tenants:
            self._items.pop(next(iter(self._items)))
        self._items[key] = (newest, vocab)
        return vocab

    def _start(
        self, pool: AsyncConnectionPool, key: tuple[str, str], newest: int = 0, delta_from: int | None = None
    ) -> asyncio.Task[Vocabulary]:
        """The one load of `key` in flight, started if none is: up to `newest`, a delta after `delta_from` or whole.

        A finished load still listed (its done-callback not run yet: it finished in this turn of the loop) is not in
        flight: handing it back would let `get` loop on it without ever yielding to the loop, which runs that
        callback, so the process would spin there for good."""
        task = self._loading.get(key)
        if task is None or task.done():
            generation = self._generation.get(key, 0)  # an invalidation from here on voids the result
            task = asyncio.get_running_loop().create_task(self._refresh(pool, key, newest, delta_from, generation))
            self._loading[key] = task
            task.add_done_callback(lambda t, k=key: self._done(k, t))
        return task

    def _done(self, key: tuple[str, str], task: asyncio.Task[Vocabulary]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning("vocabulary load for %s failed: %s", key, task.exception())

    async def _marks(self, pool: AsyncConnectionPool, key: tuple[str, str]) -> tuple[int | None, int | None] | None:
        """(oldest sequence in the log, the tenant's newest), or None for a schema without the log yet."""
        async with pool.connection() as conn:
            try:
                cur = await conn.execute(_MARKS, (key[1],))
            except psycopg.errors.UndefinedTable:
                self._logged.discard(key[0])
                return None
            row = await cur.fetchone()
        self._logged.add(key[0])
        return (row[0], row[1]) if row is not None else (None, None)

    async def get(self, pool: AsyncConnectionPool, schema: str, tenant: str) -> Vocabulary:
        """The tenant's vocabulary, including every version indexed before this call began."""
        key = (schema, tenant)
        marks = await self._marks(pool, key)
        oldest, newest = marks if marks is not None else (None, 0)
        newest = newest or 0
        while True:
            hit = self._items.get(key)
            if hit is not None and (marks is None or hit[0] == newest):
                return hit[1]  # up to date (or an older schema without the log: loaded once, kept)
            reaches = hit is not None and hit[0] < newest and (oldest is None or oldest <= hit[0] + 1)
            task = self._start(pool, key, newest, hit[0] if reaches else None)  # type: ignore[index]
            vocab = await asyncio.shield(task)
            after = self._items.get(key)
            if after is None or after[0] >= newest:  # invalidated meanwhile (serve what was read), or caught up
                return vocab
            # a load begun for an older watermark: go again from where it got to
