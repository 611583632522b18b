"""What only the fault suite needs: the tally it prints, server outages that always heal, lost/doubled checks.

- `TALLY`: the suite's figures (events injected, faults injected, lost, applied twice, DLQ, 5xx),
  printed and written to `.data/faults-summary.json` by `tests/faults/conftest.py`.
- `server_down(part, settings)`: stop a server through infra's own functions and ALWAYS start it
  again (try/finally), waiting until it is healthy, because nothing may run after a broken stack.
  It refuses to touch a stack other processes are using (see `assert_stack_not_shared`).
- `ledger_state(settings)`, `lost_and_doubled(...)`: what PostgreSQL holds of a topic against what
  the broker acknowledged, for lost / applied-twice checks; `invariants(settings, tenant)`.
- `workload(seed, n, tenant)`, `Publisher(settings, events, rate=...)`: a deterministic mix of events (updates,
  late history, overrides, retractions, confirmations, episodes, re-published duplicates) streamed through the
  SDK at a steady pace in a thread, remembering each event's first acknowledgement (what `lost_and_doubled` takes).
Everything else (processes, the pipeline, waiting, clean-up) is `tests.support`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

import infra.elasticsearch
import infra.kafka
import infra.postgres
from producers.contract import EventType, MemoryEvent
from producers.sdk import LedgerProducer, PublishError, PublishResult
from producers.settings import Settings
from projections.postgres.connection import connect_async
from tests.support import wait_for

# Every PostgreSQL connection this test process (and the workers it spawns) opens carries this
# application_name (libpq reads PGAPPNAME), so a connection without it belongs to someone else.
APP_NAME_PREFIX = "ledger-faults"
os.environ.setdefault("PGAPPNAME", f"{APP_NAME_PREFIX}-{os.getpid()}")

SERVERS: dict[str, ModuleType] = {
    "postgres": infra.postgres,
    "kafka": infra.kafka,
    "elasticsearch": infra.elasticsearch,
}
RESTART_TIMEOUT_S = {"postgres": 60.0, "kafka": 120.0, "elasticsearch": 180.0}


@dataclass
class Tally:
    """The suite's figures; tests add to them, the conftest prints and saves them."""

    events_injected: int = 0  # valid events published by the fault tests
    malformed_injected: int = 0  # invalid records published raw
    faults_injected: int = 0  # kill -9 of a worker, server stopped, broker restarted
    events_lost: int = 0  # published and valid, but not in the projection
    events_applied_twice: int = 0  # an event or version recorded more than once (or at a later duplicate's offset)
    dlq_count: int = 0  # dead letters seen on the DLQ topic
    dlq_wrong_reason: int = 0  # dead letters whose reason was not the expected one
    http_requests: int = 0  # requests made by the API checks (schemathesis, tenancy, health)
    http_5xx: int = 0  # unexpected server errors among them (health's deliberate 503 is not one)
    notes: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)

    def add(self, **deltas: int) -> None:
        for name, delta in deltas.items():
            setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TALLY = Tally()


# -- outages -------------------------------------------------------------------------------------


def foreign_pg_clients(settings: Settings) -> list[tuple[str, str]]:
    """(application_name, client_addr) of PostgreSQL client sessions not opened by this suite."""
    with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT coalesce(application_name, ''), coalesce(host(client_addr), 'local') FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "AND coalesce(application_name, '') NOT LIKE %s",
            (f"{APP_NAME_PREFIX}%",),
        ).fetchall()
    return [(a, c) for a, c in rows]


def assert_stack_not_shared(settings: Settings) -> None:
    """Refuse to stop servers that others are using (e.g. a developer's shared stack).

    In CI the fault suite runs last against the stack `infra up` started for that run, and every
    connection of the run comes from this process or its children (PGAPPNAME above). A client
    session from anywhere else means the stack is shared: fail loudly rather than break it.
    """
    others = foreign_pg_clients(settings)
    assert not others, (
        f"refusing to stop servers: {len(others)} PostgreSQL session(s) of other processes are connected "
        f"({others[:5]}); run the fault suite against a private stack (LEDGER_DATA_DIR and ports) or in CI"
    )


def server_healthy(part: str, settings: Settings) -> bool:
    try:
        return bool(SERVERS[part].healthy(settings))
    except Exception:  # noqa: BLE001 - a failed probe means "not healthy"
        return False


def ensure_server_up(part: str, settings: Settings) -> None:
    """Start the server if it is not running (idempotent: infra's start waits for health)."""
    if not server_healthy(part, settings):
        SERVERS[part].start(settings, timeout=RESTART_TIMEOUT_S[part])
    wait_for(lambda: server_healthy(part, settings), RESTART_TIMEOUT_S[part], 0.5, f"{part} healthy again")


@contextmanager
def server_down(part: str, settings: Settings) -> Iterator[None]:
    """Stop `part` (a server infra manages), yield, then start it again whatever happened."""
    module = SERVERS[part]
    assert module.pid(settings) is not None, f"{part} is not a server infra started here: cannot inject an outage"
    assert_stack_not_shared(settings)
    TALLY.add(faults_injected=1)
    t0 = time.monotonic()
    try:
        module.stop(settings)
        wait_for(lambda: not server_healthy(part, settings), 60, 0.2, f"{part} to be down")
        yield
    finally:
        ensure_server_up(part, settings)
        TALLY.timings_s[f"{part}_outage"] = round(time.monotonic() - t0, 1)


# -- what PostgreSQL holds ------------------------------------------------------------------------------


@dataclass
class LedgerState:
    events: dict[str, tuple[int, int]]  # event_id -> (partition, offset) as recorded
    versions: dict[str, int]  # the assertion's event_id -> version rows (1, as version_id is a key; counted anyway)
    dead_letters: int


def ledger_state(settings: Settings) -> LedgerState:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        schema = sql.Identifier(settings.pg_schema)
        events = {
            eid: (p, o)
            for eid, p, o in conn.execute(
                sql.SQL('SELECT event_id, "partition", "offset" FROM {}.events').format(schema)
            )
        }
        versions = dict(
            conn.execute(
                sql.SQL("SELECT event_id, count(*) FROM {}.fact_versions GROUP BY event_id").format(schema)
            ).fetchall()
        )
        dead = conn.execute(sql.SQL("SELECT count(*) FROM {}.dead_letters").format(schema)).fetchone()[0]
    return LedgerState(events, versions, dead)


def lost_and_doubled(
    state: LedgerState,
    first_seen: dict[str, tuple[int, int]],
    assertions: set[str],
    *,
    check_positions: bool = True,
) -> tuple[set[str], set[str], set[str]]:
    """Compare the projection with what the broker acknowledged: (lost, applied twice, unexpected).

    `first_seen`: event_id -> (partition, offset) of its FIRST acknowledged publish (later re-publishes
    of the same id are duplicates and must change nothing). Lost: an acknowledged event (or the version
    of an acknowledged assertion) missing. Applied twice: more than one version row, or (with
    `check_positions`) recorded at another position than its first publish, i.e. a duplicate was
    applied instead of the original. Unexpected: recorded but never acknowledged.
    """
    lost = {eid for eid in first_seen if eid not in state.events}
    lost |= {eid for eid in assertions if eid not in state.versions}
    doubled = {vid for vid, n in state.versions.items() if n > 1}
    if check_positions:
        doubled |= {eid for eid, pos in state.events.items() if eid in first_seen and pos != first_seen[eid]}
    unexpected = set(state.events) - set(first_seen)
    return lost, doubled, unexpected


def invariants(settings: Settings, tenant: str) -> dict[str, int]:
    """projections.postgres.queries.invariant_counts (the numbers /v1/stats reports) for one tenant."""
    import asyncio

    from projections.postgres.queries import invariant_counts

    async def go() -> dict[str, int]:
        async with await connect_async(settings.pg_dsn, settings.pg_schema, autocommit=True) as conn:
            return await invariant_counts(conn, tenant)

    return asyncio.run(go())


# -- a steady stream of events ---------------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = [("profile.city", "state"), ("project.port", "state"), ("pref.drink", "preference"), ("order.status", "event")]


def workload(seed: int, n: int, tenant: str) -> list[MemoryEvent]:
    """n events, deterministic for a seed; about 2% are re-publications of earlier events (same event_id)."""
    r = random.Random(seed)
    out: list[MemoryEvent] = []
    for i in range(n):
        observed = T0 + timedelta(seconds=i)
        subject = f"user:{r.randrange(400)}"
        key, kind = KEYS[r.randrange(len(KEYS))]
        roll = r.random()
        if out and roll < 0.02:
            out.append(out[r.randrange(len(out))])  # a duplicate delivery by the producer
            continue
        if roll < 0.06:
            etype = EventType.RETRACTED if roll < 0.04 else EventType.CONFIRMED
            out.append(MemoryEvent(type=etype, tenant=tenant, subject=subject, key=key, observed_at=observed))
            continue
        if roll < 0.09:
            out.append(
                MemoryEvent(
                    type=EventType.ASSERTED,
                    tenant=tenant,
                    subject=subject,
                    kind="episodic",
                    content=f"episode {i} of {subject}",
                    observed_at=observed,
                )
            )
            continue
        late = roll > 0.95  # arrives late: valid from some days before it was observed
        valid_from = observed - timedelta(days=r.randint(1, 30)) if late else observed
        valid_to = valid_from + timedelta(hours=r.randint(1, 48)) if kind == "preference" and r.random() < 0.2 else None
        out.append(
            MemoryEvent(
                type=EventType.ASSERTED,
                tenant=tenant,
                subject=subject,
                key=key,
                kind=kind,
                value=r.randrange(10_000),
                content=f"{subject} {key} is {i}",
                entities=[f"E{r.randrange(50)}"],
                source={"type": "explicit" if r.random() < 0.5 else "inferred", "service": "crash-test"},
                observed_at=observed,
                valid_from=valid_from,
                valid_to=valid_to,
            )
        )
    return out


class Publisher(threading.Thread):
    """Streams `events` through the SDK at `rate` events/s, `batch` at a time; remembers each event's first
    acknowledgement. `stop` (an Event) ends the stream early, between two batches: `sent` is how many went out."""

    def __init__(self, settings: Settings, events: list[MemoryEvent], *, rate: float, batch: int = 300) -> None:
        super().__init__(name="faults-publisher", daemon=True)
        self.settings, self.events, self.rate, self.batch = settings, events, rate, batch
        self.first_seen: dict[str, tuple[int, int]] = {}
        self.errors: list[PublishError] = []
        self.sent = 0
        self.stop = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            with LedgerProducer(self.settings, timeout_s=30) as producer:
                for start in range(0, len(self.events), self.batch):
                    if self.stop.is_set():
                        break
                    chunk = self.events[start : start + self.batch]
                    for event, outcome in zip(chunk, producer.send_many(chunk), strict=True):
                        if isinstance(outcome, PublishResult):
                            self.first_seen.setdefault(event.event_id, (outcome.partition, outcome.offset))
                        else:
                            self.errors.append(outcome)
                    self.sent = start + len(chunk)
                    ahead = self.sent / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        self.stop.wait(ahead)  # pacing the load, not waiting for a condition
        finally:
            self.done.set()
