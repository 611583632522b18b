"""`pipeline(settings)`: the whole ledger on private names, as a deployment runs it, for one test module.

SDK -> Kafka topic -> projector worker (subprocess) -> PostgreSQL schema -> `ledger indexer` and
`ledger embedder` (subprocesses) -> Elasticsearch index -> optionally the app (`create_app` + TestClient).
The processes are the real commands on the test's private settings (never a thread or an in-process
loop), so what is tested is what runs; `indexer=True` runs the embedder beside the indexer.

    with pipeline(base_settings.private(unique("pj")), seed=[asserted("warmup", "k", 0)]) as pipe:
        pipe.publish([...]); pipe.settle(); pipe.client.get(...)

`seed` is published before the processes start (they then see it as one batch); entering waits
until everything published is applied (and indexed, with an indexer). On exit the app, the indexer
and whatever `pipe.worker` is then (a test may replace it) are stopped and `cleanup(settings)` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
from fastapi.testclient import TestClient

from producers.contract import MemoryEvent
from producers.settings import Settings
from producers.topics import ensure_topics
from projections.search.client import es_client
from tests.support.kafka import publish
from tests.support.processes import Embedder, Indexer, Worker
from tests.support.stores import cleanup, pg, search_pending, wait_caught_up
from tests.support.waiting import wait_drained

__all__ = ["Pipeline", "drain_search", "pipeline"]


@dataclass
class Pipeline:
    settings: Settings
    worker: Worker | None = None
    indexer: Indexer | None = None
    embedder: Embedder | None = None
    client: TestClient | None = None

    def publish(self, events: Iterable[MemoryEvent | dict]) -> list:
        """Through the SDK; the PublishResults."""
        return publish(self.settings, events)

    def caught_up(self, timeout: float = 60.0) -> dict[int, int]:
        """The worker's stored positions reached the topic's end offsets (fails at once if it died)."""
        return wait_caught_up(self.settings, timeout=timeout, worker=self.worker)

    def settle(self, timeout: float = 90.0) -> None:
        """Everything published so far is applied and, with an indexer, indexed (with vectors) and searchable;
        `timeout` bounds the worker's catching up, and the search backlog's time without shrinking (drain_search)."""
        self.caught_up(timeout)
        if self.indexer is None:
            return

        def alive() -> None:
            for process in (self.indexer, self.embedder):
                if process is not None:
                    process.check()

        drain_search(self.settings, timeout, alive)


def drain_search(settings: Settings, stall: float, check: Callable[[], object] = lambda: None) -> None:
    """Every applied version is in the search index with its vectors, and searchable (the index refreshed).

    The search outbox and the embed queue are both empty (in one snapshot); fails once their sum has not shrunk for
    `stall` seconds (waiting.wait_drained: the embedders work off a backlog at the host's pace). `check()` runs at
    every poll and may raise at once (an indexer or embedder the caller runs has died)."""
    with pg(settings) as conn:

        def pending() -> int | None:
            check()
            try:
                return search_pending(conn)
            except psycopg.errors.UndefinedTable:
                return None  # the worker has not created the schema yet

        wait_drained(pending, stall, 0.2, "the search outbox and the embed queue")
    es = es_client(settings, request_timeout=30)  # every node of a cluster's
    try:
        es.indices.refresh(index=settings.es_index, ignore_unavailable=True)  # none before the first document
    finally:
        es.close()


@contextmanager
def pipeline(
    settings: Settings,
    *,
    seed: Iterable[MemoryEvent | dict] = (),
    worker: bool = True,
    indexer: bool = True,
    app: bool = False,
    timeout: float = 90.0,
) -> Iterator[Pipeline]:
    """Topics, `seed`, the worker and the indexer (each optional), the app if asked; settled, then torn down."""
    pipe = Pipeline(settings)
    with ExitStack() as stack:
        stack.callback(cleanup, settings)
        ensure_topics(settings)
        seed = list(seed)
        if seed:
            publish(settings, seed)
        if worker:
            pipe.worker = Worker(settings).start()
            stack.callback(lambda: pipe.worker.stop() if pipe.worker is not None else None)
        if indexer:
            pipe.indexer = stack.enter_context(Indexer(settings))
            pipe.embedder = stack.enter_context(Embedder(settings))
        if app:
            from api.main import create_app

            pipe.client = stack.enter_context(TestClient(create_app(settings)))
        if worker:
            pipe.settle(timeout)
        yield pipe
