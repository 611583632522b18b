"""The one "drain forever" loop of the search projection's workers (`ledger indexer`, `ledger embedder`).

A full batch goes on at once; anything less waits for a NOTIFY sent by the transaction that gave it work, so new
work is picked up within moments of its commit. The poll interval only bounds the wait, as a fallback for a
notification lost while disconnected and for work no commit announces. Notifications name their schema, so others'
do not wake this worker. Errors back off up to `indexer_max_backoff_s` and never end the loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

import orjson
import psycopg
from elasticsearch import ApiError
from elasticsearch import TransportError as ESTransportError
from psycopg import sql

from producers.logs import bind_ids, new_id, unbind_ids
from producers.settings import Settings
from projections.postgres.connection import held, search_path
from projections.postgres.recorder import ERASURE_CHANNEL, OUTBOX_CHANNEL
from projections.search import metrics

__all__ = [
    "EMBED_CHANNEL",
    "INDEXED_CHANNEL",
    "ERASURE_CHANNEL",
    "OUTBOX_CHANNEL",
    "drain_forever",
    "lower_autogroup",
    "lower_priority",
    "notify",
    "wait_for_work",
]

INDEXED_CHANNEL = "memory_ledger_indexed"  # an indexer wrote documents in schema <payload> (waiting reads wake)
EMBED_CHANNEL = "memory_ledger_embed"  # an indexer queued versions for vectors in schema <payload> (embedders wake)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice` (0: leave it), at its start: the threads it starts later inherit it.

    With the kernel's autogroups (sched_autogroup_enabled, the default of many distributions) a nice value only
    ranks a process among those of its own session, and a service started in a session of its own (infra.procs)
    is alone there: so a session leader also lowers its session's autogroup, the weight the kernel sets against the
    worker's and the servers' sessions. A process sharing its session (a shell's job) lowers only itself."""
    if not nice:
        return
    os.nice(nice)
    if os.getsid(0) == os.getpid():
        lower_autogroup("self", nice)


def lower_autogroup(pid: int | str, nice: int) -> None:
    """Set the nice value of the autogroup of `pid`'s session ("self": ours). A process that changed its user
    cannot (its /proc files are root's then), so a launcher that switches users sets it from outside."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as autogroup:
            autogroup.write(str(nice))
    except OSError:  # no autogroups (not Linux, switched off) or refused: the nice value alone
        pass


def notify(conn: psycopg.Connection, channel: str) -> None:
    """In the caller's transaction: wake the workers LISTENing on `channel` for this schema when it commits."""
    conn.execute("SELECT pg_notify(%s, current_schema())", (channel,))


def _names(payload: str, schema: str) -> bool:
    """Whether a notification is about `schema`: its payload is the schema, or (erasures) a JSON object naming it."""
    if payload == schema:
        return True
    if not payload.startswith("{"):
        return False
    try:
        return orjson.loads(payload).get("schema") == schema
    except orjson.JSONDecodeError:
        return False


def wait_for_work(conn: psycopg.Connection, schema: str, seconds: float) -> bool:
    """Wait up to `seconds` for a notification about `schema` on the channels `conn` LISTENs to (those that arrived
    while `conn` was busy count at once); whether one came."""
    for n in conn.notifies(timeout=seconds):
        if _names(n.payload, schema):
            return True
    return False


def _connect(settings: Settings, channels: Sequence[str]) -> psycopg.Connection:
    """The loop's connection, LISTENing on `channels`. Its statements are never prepared: most of them read a queue
    (search_outbox, embed_queue) whose size swings from a few rows to a backlog of thousands between two batches, and
    a plan PostgreSQL cached while the queue was small (a sequential scan, comparing every row with every key of an
    `= ANY` array) stays in use as the queue grows. Planned at each call, with its values and the table's size now,
    a batch's statements cost a fraction of a millisecond more."""
    conn = psycopg.connect(settings.pg_dsn, autocommit=True, prepare_threshold=None, **held(settings))
    try:
        conn.execute(search_path(settings.pg_schema))
        for channel in channels:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except BaseException:
        conn.close()
        raise
    return conn


def _store(exc: BaseException) -> str:
    """Which store an error came from (the error counters' label)."""
    if isinstance(exc, (ESTransportError, ApiError)):  # a connection lost or refused, a timeout, a node's answer
        return "elasticsearch"
    return "postgres" if isinstance(exc, psycopg.Error) else "other"


def drain_forever(
    settings: Settings,
    once: Callable[[psycopg.Connection], bool],
    *,
    channels: Sequence[str],
    poll_seconds: float,
    log: logging.Logger,
    record_error: Callable[[str], None],
    stop: Callable[[], bool] | None = None,
) -> None:
    """Run `once(conn)` forever (until `stop()` returns true); it returns whether its batch was full (go on at once).

    `record_error(store)` counts a failed round by the store it came from (elasticsearch, postgres, other)."""
    conn: psycopg.Connection | None = None
    backoff = 0.5
    gauges_at = -settings.metrics_refresh_s  # the queue gauges are read after the first round
    batch_ids = bind_ids()
    while stop is None or not stop():
        unbind_ids(batch_ids)
        batch_ids = bind_ids(batch_id=new_id())  # on every line of this round (producers.logs)
        try:
            if conn is None or conn.closed:
                conn = _connect(settings, channels)
            full = once(conn)
            if time.monotonic() - gauges_at >= settings.metrics_refresh_s:
                metrics.refresh_queues(conn)
                gauges_at = time.monotonic()
            backoff = 0.5
            if not full:
                wait_for_work(conn, settings.pg_schema, poll_seconds)
        except Exception as exc:  # noqa: BLE001 - a long-running drainer backs off and retries, never dies
            store = _store(exc)
            record_error(store)
            log.warning(
                "%s: %s: %s; retrying in %.1fs",
                log.name.rsplit(".", 1)[-1],
                type(exc).__name__,
                str(exc)[:300],
                backoff,
                exc_info=store == "other",
            )
            if conn is not None and (isinstance(exc, psycopg.OperationalError) or conn.broken):
                conn.close()
                conn = None
            time.sleep(backoff)
            # capped low: once the store is back the queues should drain in seconds, not half a minute
            backoff = min(backoff * 2, settings.indexer_max_backoff_s)
