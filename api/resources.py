"""What the API holds open across requests, opened and closed in one place.

    async with Resources.open(settings) as res:
        res.pool, res.es, res.producer, res.recall, res.access, res.offload, res.kafka_probe, res.door_check,
        res.publishes

Only the FastAPI lifespan (api.main) opens them, and routes reach them through api.deps, so no route creates or
caches a resource. Nothing here knows FastAPI: another front end (the MCP server) opens its own or shares the app's.
Stores are connected lazily, so a server that is down fails requests promptly instead of the start-up.
A new resource is one attribute: created in `open`, released in reverse order, and aliased in api.deps if needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from elasticsearch import AsyncElasticsearch
from psycopg_pool import AsyncConnectionPool

from api.access import AccessRecorder
from api.offload import Offload
from producers.keys.provider import CachedKeys, sealing_keys_for
from producers.keys.store import unsealed_warning
from producers.sdk import LedgerProducer
from producers.settings import Settings
from producers.topics import EndOffsetReader
from projections.postgres.connection import configure_pool
from projections.search.client import async_es_client
from projections.search.recall import RecallEngine

GIL_SWITCH_INTERVAL_S = 0.0005  # see Resources.open: the longest the event loop waits for a busy thread

__all__ = ["Backoff", "Position", "ProbeCache", "Publishes", "Resources"]

log = logging.getLogger(__name__)


class ProbeCache:
    """A blocking yes/no check's last answer, reused for `ttl` seconds, with at most one check in flight.

    The Kafka probe builds a kafka-python admin client, which is slowest under CPU load, exactly when an operator
    asks /v1/health. A 1 s old answer is still news: an outage shows within a second. The check runs in a thread.
    """

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._answer: tuple[float, bool] | None = None
        self._task: asyncio.Future[bool] | None = None

    async def ok(self, check: Callable[[], bool]) -> tuple[bool, float]:
        """(the answer, its age in seconds); `check` runs only when no fresh answer or running check exists."""
        now = time.monotonic()
        if self._answer is not None and now - self._answer[0] < self.ttl:
            return self._answer[1], now - self._answer[0]
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(asyncio.to_thread(check))
        ok = await asyncio.shield(self._task)
        self._answer = (time.monotonic(), ok)
        return ok, 0.0


@dataclass
class Backoff:
    """A store that failed a moment ago is not asked again before `until` (time.monotonic())."""

    until: float = 0.0

    def active(self) -> bool:
        return time.monotonic() < self.until

    def trip(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds


Position = tuple[int, int]  # (partition, offset) of a published record


class Publishes:
    """This process's publishes by (tenant, event_id, fingerprint): the same event asked again while it is in flight
    waits for it instead of publishing it again, and asked again once published is answered its position (its
    record is in the ledger: acks=all), until the worker refuses it. Remembered until `remember` later ones are
    done; one that failed, or that the worker refused, is forgotten, so the next ask publishes it."""

    def __init__(self, remember: int = 10_000) -> None:
        self._remember = remember
        self._futures: OrderedDict[tuple[str, str, str], asyncio.Future[Position | None]] = OrderedDict()

    def get(self, key: tuple[str, str, str]) -> asyncio.Future[Position | None] | None:
        return self._futures.get(key)

    def start(self, key: tuple[str, str, str]) -> None:
        self._futures[key] = asyncio.get_running_loop().create_future()

    def forget(self, key: tuple[str, str, str], refused: Iterable[Position]) -> None:
        """Forget the publish of `key` if its record is among the `refused` (dead letters): the next ask publishes
        it again. A letter of the id elsewhere (a record of other content, one refused before) changes nothing."""
        future = self._futures.get(key)
        if future is not None and future.done() and future.result() in set(refused):
            del self._futures[key]

    def finish(self, key: tuple[str, str, str], position: Position | None) -> None:
        future = self._futures.get(key)
        if future is None:
            return
        if not future.done():
            future.set_result(position)
        if position is None:
            del self._futures[key]
            return
        self._futures.move_to_end(key)
        while len(self._futures) > self._remember and next(iter(self._futures.values())).done():
            self._futures.popitem(last=False)


@dataclass(eq=False)
class Resources:
    """The API's stores and long-lived helpers (see the module docstring); build it with `Resources.open`."""

    settings: Settings
    pool: AsyncConnectionPool
    es: AsyncElasticsearch
    producer: LedgerProducer
    recall: RecallEngine
    access: AccessRecorder  # what recall and context served, recorded off the request path (api.access)
    offsets: EndOffsetReader  # the ledger topic's end offsets for /v1/stats, one consumer kept open
    offload: Offload  # child processes for a large request's CPU work (api.offload): a large publish's judging
    keys: CachedKeys | None = None  # data keys from the key store (POST /v1/keys, sealing); None: no KEK here
    embedder_warmup: asyncio.Task | None = None
    rerank_warmup: asyncio.Task | None = None  # the cross-encoder (recall.rerank), loaded the same way
    kafka_probe: ProbeCache = field(default_factory=ProbeCache)
    door_check: Backoff = field(default_factory=Backoff)
    publishes: Publishes = field(default_factory=Publishes)  # api.writes.publish_events: one publish per event
    pool_check: asyncio.Task | None = None  # `postgres_failed`'s check of the idle connections, one at a time

    def postgres_failed(self) -> None:
        """A request met a PostgreSQL connection that failed: the pool's idle connections are checked in the
        background and those the server ended replaced, so after a server restart a request fails, not one per
        idle connection (a check on every checkout would cost every read a round trip)."""
        if self.pool_check is None or self.pool_check.done():
            self.pool_check = asyncio.get_running_loop().create_task(self._check_pool())

    async def _check_pool(self) -> None:
        try:
            await self.pool.check()
        except Exception as exc:  # noqa: BLE001 - the server may still be away: the next failure checks again
            log.info("the pool's connections were not checked: %s: %s", type(exc).__name__, exc)

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings, *, warm_embedder: bool = True) -> AsyncIterator[Resources]:
        """Open everything (no store is contacted yet, so a store that is down does not stop start-up); close
        it all on exit, whatever failed. `warm_embedder=False` leaves the model to the first semantic query."""
        # a worker thread running CPU work (a 1000-event publish judged, a rerank's tokenizing) holds the GIL for
        # the interpreter's switch interval each time the event loop asks for it back (5 ms by default): a read
        # of another tenant that needs the loop a dozen times then waits a dozen intervals
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        async with contextlib.AsyncExitStack() as stack:
            pool = AsyncConnectionPool(
                settings.pg_dsn,
                min_size=1,
                max_size=settings.pg_pool_size,
                configure=configure_pool(settings.pg_schema, generic_plans=True),  # its reads are keyed lookups
                open=False,
                timeout=settings.pg_pool_timeout_s,  # a dead server is a prompt 503, not a 30 s wait
                kwargs={"autocommit": True, "connect_timeout": settings.pg_connect_timeout_s},
            )
            await pool.open(wait=False)
            stack.push_async_callback(pool.close)
            es = async_es_client(settings, request_timeout=settings.es_request_timeout_s)
            stack.push_async_callback(es.close)
            keys = api_key_source(settings)  # None without a KEK; a wrong KEK fails here, at start
            producer = LedgerProducer(  # connects on first publish; seals with `keys` when encryption is on
                settings,
                timeout_s=settings.api_kafka_timeout_s,
                keys=keys if settings.encryption != "off" else None,
                resolutions=True,  # the door judged each event (api.judging); the dead-letter workflow's name letters
            )
            stack.callback(producer.close)
            if keys is not None and settings.encryption == "off":
                stack.callback(keys.close)
            recall = RecallEngine(settings, es, pool)
            stack.push_async_callback(recall.aclose)  # its LISTEN connection (erasure notifications)
            if keys is not None:  # a subject's key retired or destroyed by any process: not sealed with here again
                recall.vocab.also_forget.append(keys.forget_tenant)
                recall.commits()
            access = AccessRecorder(settings).start()  # its flush thread; closing it flushes what is queued
            stack.callback(access.close)
            offsets = EndOffsetReader(settings, timeout_s=settings.api_kafka_timeout_s)  # connects on first read
            stack.callback(offsets.close)
            offload = Offload(("api.judging",))  # its children start with the first large request
            stack.callback(offload.close)
            res = cls(
                settings=settings,
                pool=pool,
                es=es,
                producer=producer,
                recall=recall,
                access=access,
                offsets=offsets,
                offload=offload,
                keys=keys,
            )
            if warm_embedder:
                res.embedder_warmup = asyncio.get_running_loop().create_task(recall.embedder(), name="embedder-warmup")
                res.embedder_warmup.add_done_callback(_report_warmup)
                stack.push_async_callback(_cancel, res.embedder_warmup)
                if settings.rerank_enabled:  # a query before it is loaded is served without rerank
                    warm = recall.reranker.model()
                    res.rerank_warmup = asyncio.get_running_loop().create_task(warm, name="rerank-warmup")
                    res.rerank_warmup.add_done_callback(_report_warmup)
                    stack.push_async_callback(_cancel, res.rerank_warmup)
            yield res


def api_key_source(settings: Settings) -> CachedKeys | None:
    """The key store with this process's KEK (never the API's own key endpoint); None when no KEK is configured.

    The KEK is checked against the store at start; a store that does not answer yet is checked on first use.
    Encryption off outside development is said at start, as a WARNING (`unsealed_warning`).
    """
    warning = unsealed_warning(settings)
    if warning:
        log.warning(warning)
    if settings.kek is None and settings.kek_file is None and settings.encryption == "off":
        return None
    return sealing_keys_for(settings.model_copy(update={"key_endpoint": None}))


def _report_warmup(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:  # retrieved: the first semantic query retries
        log.warning("model not loaded in the background (%s): %r", task.get_name(), task.exception())


async def _cancel(task: asyncio.Task) -> None:
    """Stop waiting for a task at shutdown (a model load in its thread finishes on its own, unobserved)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
