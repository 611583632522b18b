"""Scale-out of the projector: three `ledger worker` processes share one ledger topic's six partitions; one is
SIGKILLed in the middle of a batch while events stream in, and the other two take its partitions over.

A publisher thread streams events through the SDK at a steady pace (tests.faults.support: updates, late history,
overrides, retractions, confirmations, episodes, re-published duplicates). Three workers join one consumer group
(faust) and each applies batches of its share. Then one of them is caught with its batch transaction open (rows
written, not committed: PostgreSQL's `pg_stat_activity` for the worker's own application_name), frozen, and killed
with SIGKILL; PostgreSQL must roll that transaction back. After the group's session timeout faust rebalances, and
the survivors apply the dead worker's partitions from the positions PostgreSQL stored. The stream stops once they
do. Then: every published event applied exactly once (events and versions against what the broker acknowledged,
the same check as test_worker_crash), the stored positions at the topic's end offsets, the invariants, and the
projection's checksum equal to a rebuild's from offset 0.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psycopg
import pytest

from producers.contract import EventType
from producers.settings import Settings
from producers.topics import ensure_topics
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.faults.support import (
    APP_NAME_PREFIX,
    TALLY,
    Publisher,
    invariants,
    ledger_state,
    lost_and_doubled,
    workload,
)
from tests.support import Worker, cleanup, end_offsets, positions, wait_caught_up, wait_for

WORKERS = 3
PUBLISH_RATE = 150  # events/s, in sends of BATCH: a steady trickle that three workers, or two, keep up with
BATCH = 30
MOST = 20_000  # the stream's ceiling; it stops as soon as the survivors have taken the partitions over
TENANT = "scaleout"
SEEKED = "seeked to PostgreSQL positions"  # stream_processors.app: logged after every rebalance
# the ledger agent's line per committed batch (stream_processors.agents), not the access agent's
BATCH_LINE = re.compile(r"(?<!access )batch: \d+ records.* positions \{([^}]*)\}")
# a transaction of this worker that has written (a transaction id is assigned on the first write): a batch
OPEN_BATCH = "SELECT backend_xid::text FROM pg_stat_activity WHERE application_name = %s AND backend_xid IS NOT NULL"
# the status of a 32-bit xid of the current epoch (pg_xact_status takes the 64-bit one)
XACT_STATUS = (
    "SELECT pg_xact_status((((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32)"
    " + %s::bigint)::text::xid8)"
)


def applied_partitions(log: str) -> set[int]:
    """The ledger partitions of the committed batches a worker's log shows."""
    return {int(p.split(":")[0]) for m in BATCH_LINE.finditer(log) for p in m.group(1).split(",") if p.strip()}


def since_last_rebalance(log: str) -> str:
    """What the worker logged under its current assignment ('' before its first)."""
    at = log.rfind(SEEKED)
    return log[at:] if at >= 0 else ""


@pytest.fixture
def scale_settings(base_settings: Settings):
    settings = base_settings.private(unique("scaleout"))
    try:
        yield settings
    finally:
        cleanup(settings)


def _kill_mid_batch(conn: psycopg.Connection, workers: dict[str, Worker], timeout: float) -> tuple[str, str]:
    """Catch a worker with its batch transaction open, freeze it (SIGSTOP: it can send no COMMIT), and SIGKILL it
    if the transaction is still in progress; else let it go on and try again. (its name, the transaction id)."""
    deadline = time.monotonic() + timeout
    while True:
        for name, worker in workers.items():
            row = conn.execute(OPEN_BATCH, (name,)).fetchone()
            if row is None or worker.proc is None:
                continue
            os.kill(worker.proc.pid, signal.SIGSTOP)
            time.sleep(0.3)  # a COMMIT already on its way is processed by now
            if conn.execute(XACT_STATUS, (row[0],)).fetchone()[0] == "in progress":
                worker.kill()
                return name, row[0]
            os.kill(worker.proc.pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "no worker was caught in the middle of a batch"
        time.sleep(0.005)


def test_three_workers_one_killed_mid_batch_the_others_take_over_exactly_once(scale_settings: Settings) -> None:
    settings = scale_settings
    t_start = time.monotonic()
    ensure_topics(settings)
    events = workload(seed=23, n=MOST, tenant=TENANT)
    publisher = Publisher(settings, events, rate=PUBLISH_RATE, batch=BATCH)
    publisher.start()
    workers: dict[str, Worker] = {}
    try:
        for i in range(1, WORKERS + 1):
            name = f"{APP_NAME_PREFIX}-{os.getpid()}-worker-{i}"  # each one's PostgreSQL sessions, by name
            worker = Worker(settings)
            worker.env["PGAPPNAME"] = name
            workers[name] = worker.start()

        def all_applying() -> bool:
            for worker in workers.values():
                worker.check()
            return all(applied_partitions(since_last_rebalance(w.log())) for w in workers.values())

        wait_for(all_applying, 120, 0.2, f"{WORKERS} workers each applying its share")
        joined_s = time.monotonic() - t_start
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            victim_name, xid = _kill_mid_batch(conn, workers, timeout=60)
            killed_at = time.monotonic()
            victim = workers.pop(victim_name)
            survivors = list(workers.values())
            marks = [len(w.log()) for w in survivors]
            assert not publisher.done.is_set(), "the stream ended before the kill"
            TALLY.add(faults_injected=1)
            # the batch it was writing never happened: PostgreSQL rolled it back when the connection died
            wait_for(
                lambda: conn.execute(XACT_STATUS, (xid,)).fetchone()[0] == "aborted",
                30,
                0.1,
                f"the killed worker's transaction {xid} to be rolled back",
            )
        orphaned = applied_partitions(since_last_rebalance(victim.log()))
        assert orphaned, victim.log()[-3000:]

        def taken_over() -> bool:
            for worker in survivors:
                worker.check()
            after = set().union(*(applied_partitions(w.log()[m:]) for w, m in zip(survivors, marks, strict=True)))
            return orphaned <= after

        wait_for(taken_over, 90, 0.2, f"the survivors to apply the killed worker's partitions {sorted(orphaned)}")
        takeover_s = time.monotonic() - killed_at
        publisher.stop.set()  # the stream ran through the kill and the takeover
        publisher.join(60)
        assert publisher.done.is_set() and not publisher.errors, publisher.errors[:3]
        wait_caught_up(settings, timeout=120, worker=survivors[0])
        for worker in survivors:
            worker.check()
    finally:
        publisher.stop.set()
        for worker in workers.values():
            worker.stop()
    TALLY.timings_s["worker_scaleout_takeover"] = round(takeover_s, 1)

    published = events[: publisher.sent]
    assertions = {e.event_id for e in published if e.type is EventType.ASSERTED}
    TALLY.add(events_injected=len(published))
    TALLY.notes.append(
        f"worker scale-out: {WORKERS} workers applying after {joined_s:.1f}s, one SIGKILLed mid-batch (xid {xid}, "
        f"partitions {sorted(orphaned)}), taken over in {takeover_s:.1f}s; {len(published)} events streamed"
    )
    state = ledger_state(settings)
    lost, doubled, unexpected = lost_and_doubled(state, publisher.first_seen, assertions)
    TALLY.add(events_lost=len(lost), events_applied_twice=len(doubled))
    assert not lost, f"{len(lost)} events lost, e.g. {sorted(lost)[:5]}"
    assert not doubled, f"{len(doubled)} events applied twice, e.g. {sorted(doubled)[:5]}"
    assert not unexpected, f"{len(unexpected)} events nobody published, e.g. {sorted(unexpected)[:5]}"
    assert len(state.events) == len({e.event_id for e in published}) and state.dead_letters == 0
    ends = end_offsets(settings)
    assert positions(settings) == dict(ends), "every record accounted for exactly up to the end"
    counts = invariants(settings, TENANT)
    assert counts["double_active"] == 0 and counts["chain_integrity_violations"] == 0, counts

    report = rebuild(settings, keep_old=False)
    assert report.live_checksum == report.rebuilt_checksum, "the projection differs from a replay of the ledger"
    assert report.records == sum(ends.values())
    TALLY.timings_s["worker_scaleout_total"] = round(time.monotonic() - t_start, 1)
