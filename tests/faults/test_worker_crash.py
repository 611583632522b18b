"""Worker crashes: kill -9 the projector at random moments while events stream in, five times over.

A publisher thread streams N_EVENTS events through the SDK at a pace a little below the projector's
drain rate (updates, late history, preference overrides, retractions, confirmations, episodes and
re-published duplicates over a few hundred subjects). Meanwhile the worker subprocess is started,
allowed to apply some batches, and SIGKILLed at a random moment, KILLS times; then a last worker
catches up. Nothing may be lost, nothing applied twice, no fact double-active, and the projection
must equal a clean rebuild from offset 0 (same checksum).
"""

from __future__ import annotations

import random
import time

import pytest

from producers.contract import EventType
from producers.settings import Settings
from stream_processors.rebuild import rebuild
from tests.conftest import unique
from tests.faults.support import TALLY, Publisher, invariants, ledger_state, lost_and_doubled, workload
from tests.support import Worker, cleanup, end_offsets, positions, wait_caught_up, wait_for

N_EVENTS = 20_000  # the figure: ~57 s of streaming at PUBLISH_RATE
KILLS = 5
PUBLISH_RATE = 350  # events/s: the stream lasts about as long as the five crash rounds, so every kill hits it
BATCH = 300
TENANT = "crash"


@pytest.fixture
def crash_settings(base_settings: Settings):
    settings = base_settings.private(unique("crash"))
    try:
        yield settings
    finally:
        cleanup(settings)


def _applied(settings: Settings) -> int:
    return sum(positions(settings).values())


def test_kill9_five_times_while_streaming_loses_nothing_and_doubles_nothing(crash_settings: Settings) -> None:
    settings = crash_settings
    rng = random.Random(7)
    events = workload(seed=11, n=N_EVENTS, tenant=TENANT)
    assertions = {e.event_id for e in events if e.type is EventType.ASSERTED}
    t_start = time.monotonic()
    publisher = Publisher(settings, events, rate=PUBLISH_RATE, batch=BATCH)
    publisher.start()
    kills: list[str] = []
    worker: Worker | None = None
    try:
        for round_no in range(1, KILLS + 1):
            worker = Worker(settings).start()
            before = _applied(settings)
            # it is working: at least one batch committed since it started
            wait_for(lambda w=worker, b=before: _applied(settings) > b or not w.alive(), 90, 0.1, "a batch applied")
            assert worker.alive(), f"worker died on its own:\n{worker.log()[-3000:]}"
            time.sleep(rng.uniform(0.2, 2.5))  # the random moment of the crash
            at = _applied(settings)
            worker.kill()
            TALLY.add(faults_injected=1)
            kills.append(f"kill {round_no}: {at} records applied, stream {'done' if publisher.done.is_set() else 'on'}")
        worker = Worker(settings).start()
        wait_for(publisher.done.is_set, 120, 0.2, "the publisher to finish")
        publisher.join(10)
        assert not publisher.errors, f"{len(publisher.errors)} publish errors, first: {publisher.errors[0]}"
        wait_caught_up(settings, timeout=120, worker=worker)
        TALLY.timings_s["crash_stream_and_catch_up"] = round(time.monotonic() - t_start, 1)
    finally:
        if worker is not None:
            worker.stop()

    TALLY.add(events_injected=len(events))
    TALLY.notes.append(f"worker crash: {N_EVENTS} events, {KILLS} kill -9; " + "; ".join(kills))
    state = ledger_state(settings)
    lost, doubled, unexpected = lost_and_doubled(state, publisher.first_seen, assertions)
    TALLY.add(events_lost=len(lost), events_applied_twice=len(doubled))
    assert not lost, f"{len(lost)} events lost, e.g. {sorted(lost)[:5]}"
    assert not doubled, f"{len(doubled)} events applied twice, e.g. {sorted(doubled)[:5]}"
    assert not unexpected, f"{len(unexpected)} events nobody published, e.g. {sorted(unexpected)[:5]}"
    assert len(state.events) == len({e.event_id for e in events}) and state.dead_letters == 0
    ends = end_offsets(settings)
    assert positions(settings) == {p: o for p, o in ends.items()}, "every record accounted for exactly up to the end"
    counts = invariants(settings, TENANT)
    assert counts["double_active"] == 0 and counts["chain_integrity_violations"] == 0, counts
    assert counts["explicit_confidence_violations"] == 0, counts

    t0 = time.monotonic()
    report = rebuild(settings, keep_old=False)
    TALLY.timings_s["crash_rebuild"] = round(time.monotonic() - t0, 1)
    assert report.live_checksum == report.rebuilt_checksum, "the crashed-and-restarted projection differs from a replay"
    assert report.records == sum(ends.values())


def test_the_comparison_catches_every_kind_of_error() -> None:
    """The checks above can fail: a missing event, a missing version, a duplicate applied, an unknown event."""
    from tests.faults.support import LedgerState

    acked = {"e1": (0, 1), "e2": (0, 2), "e3": (1, 7)}
    good = LedgerState(events=dict(acked), versions={"e1": 1, "e2": 1}, dead_letters=0)
    assert lost_and_doubled(good, acked, {"e1", "e2"}) == (set(), set(), set())
    bad = LedgerState(events={"e1": (0, 1), "e2": (0, 9), "x": (2, 0)}, versions={"e2": 2}, dead_letters=0)
    lost, doubled, unexpected = lost_and_doubled(bad, acked, {"e1", "e2"})
    assert (lost, doubled, unexpected) == ({"e1", "e3"}, {"e2"}, {"x"})
    assert lost_and_doubled(bad, acked, {"e1", "e2"}, check_positions=False)[1] == {"e2"}  # 2 rows still count
