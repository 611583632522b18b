"""What tests share, in one place; import from here (`from tests.support import pipeline, wait_for`).

Tests run against the real servers `python -m infra up` started, each on private names
(`Settings.private`, see tests/conftest.py). The product's own helpers do the work wherever one
exists (end offsets, stored positions, schema-bound connections, the settings of a child process);
this package only adds what a test needs around them.

- waiting: `wait_for(cond, timeout)`, polling instead of sleeping; `wait_drained(count, stall)`, a backlog to zero.
- processes: `Worker(settings)` (the projector, `python -m stream_processors`), `Indexer(settings)`
  (`ledger indexer`) and `Embedder(settings)` (`ledger embedder`) as child processes on the private settings.
- kafka: `publish`, `publish_raw`, `read_topic`, `dlq_envelopes`, `drop_topics`, `end_offsets`.
- stores: `pg`, `async_pool`, `positions`, `wait_caught_up`, `outbox_count`, `embed_queue_count`,
  `search_pending` (both, one snapshot), `private_store`, `cleanup`.
- writer: `RecorderWriter` (events straight through the PostgreSQL recorder, no Kafka) and `drain_all`
  (the indexer's drain and the embedder's pass until both queues are empty), for search and recall tests.
- events: factories `asserted`, `facts`, `marked`, `erased`, `episode`, `wire`, times `at(day)` after `T0`;
  `MALFORMED_CURSORS`: page cursors that name no place in the log;
  `changed(leaf)`: a JSON leaf with one thing changed (the tamper tests); `with_value_at(data, path, value)`: a
  copy with one value set.
- pipeline: `pipeline(settings, seed=..., indexer=..., app=...)`, the whole ledger for one module;
  `drain_search(settings, stall)`: every applied version searchable.
- docs (import it directly): the documents' bash and python blocks run as a reader runs them, and the rules a
  document follows (tests/test_docs_examples.py).
- browser (import it directly: it needs Playwright): `ApiServer` (uvicorn child on a free port), `chromium()`,
  `OfflinePage` (every request to another origin aborted); console_world / console_page: the audit console's
  world and page object (tests/test_console.py, tests/test_console_operations.py, `python -m
  tests.support.shoot_console` for docs/console/);
  erasure_world: the Erasures view's world, encryption on and subjects erased (tests/test_console_erasures.py).
- servers: the ledger's servers (the API, the MCP server) as a test's children on free ports.
- routes (import it directly): `app_routes(settings)`, every (method, path template) the app answers, for the
  tests whose cases must cover each route.
"""

from tests.support.events import (
    MALFORMED_CURSORS,
    T0,
    TENANT,
    asserted,
    at,
    changed,
    episode,
    erased,
    facts,
    marked,
    wire,
    with_value_at,
)
from tests.support.kafka import dlq_envelopes, drop_topics, end_offsets, publish, publish_raw, read_topic
from tests.support.pipeline import Pipeline, drain_search, pipeline
from tests.support.processes import Embedder, Indexer, Process, Worker
from tests.support.stores import (
    async_pool,
    cleanup,
    embed_queue_count,
    outbox_count,
    pg,
    positions,
    private_store,
    search_pending,
    wait_caught_up,
)
from tests.support.waiting import wait_for
from tests.support.writer import RecorderWriter, drain_all

__all__ = [
    "MALFORMED_CURSORS",
    "T0",
    "TENANT",
    "Embedder",
    "Indexer",
    "Pipeline",
    "Process",
    "RecorderWriter",
    "Worker",
    "asserted",
    "async_pool",
    "at",
    "changed",
    "cleanup",
    "dlq_envelopes",
    "drain_all",
    "drain_search",
    "drop_topics",
    "end_offsets",
    "erased",
    "facts",
    "marked",
    "embed_queue_count",
    "episode",
    "outbox_count",
    "search_pending",
    "pg",
    "pipeline",
    "positions",
    "private_store",
    "publish",
    "publish_raw",
    "read_topic",
    "wait_caught_up",
    "wait_for",
    "wire",
    "with_value_at",
]
