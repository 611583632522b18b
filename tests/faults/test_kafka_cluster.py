"""A real cluster: three KRaft brokers, one killed with kill -9 during ingest and restarted; nothing lost or doubled.

The same code that runs on the stack's single broker runs here against a cluster of three
(`infra.kafka_cluster`, on free ports, data under `.data/kafka-cluster/`), only through settings:
`kafka_bootstrap` lists the three brokers and `topic_replication=3` makes `producers.topics` create
the ledger, DLQ and access topics replicated three times with `min.insync.replicas=2`. The real worker
(`python -m stream_processors`) projects into the shared PostgreSQL while a publisher thread sends
N_EVENTS distinct assertions through the SDK (acks=all, idempotent producer). Mid-stream the broker
that leads the most ledger partitions is SIGKILLed; once the controller has moved it out of every
ISR, and the stream has gone on with two brokers, it is started again on its own data.

Then: every event is in PostgreSQL exactly once (events and fact_versions), the log itself holds no
duplicate (the idempotent producer's retries to new leaders are not re-appended), the worker's stored
positions equal the end offsets, no dead letters, and the restarted broker is back in the ISR of
every partition of every topic.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import orjson
import pytest

from infra.kafka_cluster import KafkaCluster, PartitionState
from infra.private import free_ports
from producers.contract import MemoryEvent
from producers.sdk import LedgerProducer, PublishError, PublishResult
from producers.settings import Settings
from producers.topics import ensure_topics
from tests.conftest import unique
from tests.faults.support import TALLY, invariants, ledger_state, lost_and_doubled
from tests.support import Worker, asserted, cleanup, end_offsets, pg, positions, read_topic, wait_caught_up, wait_for

N_EVENTS = 6_000
PUBLISH_RATE = 250  # events/s: a ~24 s stream, so the kill, the failover and the restart all fall inside it
BATCH = 100
KILL_AFTER = N_EVENTS // 4  # acknowledged events before the kill
AFTER_FAILOVER = N_EVENTS // 10  # acknowledged with the broker down before it is restarted
TENANT = "cluster"
KEYS = ("profile.city", "project.port", "order.status")
BROKERS = 3
MIN_ISR = 2


def workload(n: int) -> list[MemoryEvent]:
    """n distinct assertions over 300 subjects and three keys: each a new version, most superseding one."""
    return [asserted(f"user:{i % 300}", KEYS[(i // 300) % len(KEYS)], i, i / 86_400, tenant=TENANT) for i in range(n)]


class Publisher(threading.Thread):
    """Sends the workload through the SDK at PUBLISH_RATE; an event the broker did not take is sent again (same
    event_id, as the SDK documents) until it is acknowledged. Remembers each event's first acknowledgement.

    After the first batch it waits for `resume` (the worker has joined and applied it), so the paced stream
    starts with the worker running, however long its group join takes."""

    def __init__(self, settings: Settings, events: list[MemoryEvent]) -> None:
        super().__init__(name="cluster-publisher", daemon=True)
        self.settings, self.events = settings, events
        self.first_seen: dict[str, tuple[int, int]] = {}
        self.failures: list[PublishError] = []  # every refusal seen (each was retried)
        self.unacked: list[MemoryEvent] = []  # still without an acknowledgement when the retries gave up
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.resume = threading.Event()

    @property
    def acked(self) -> int:
        return len(self.first_seen)

    def run(self) -> None:
        try:
            with LedgerProducer(self.settings, timeout_s=30) as producer:
                t0 = time.monotonic()
                for start in range(0, len(self.events), BATCH):
                    if start == BATCH:
                        if not self.resume.wait(180):
                            raise TimeoutError("nobody resumed the stream after its first batch")
                        t0 = time.monotonic() - start / PUBLISH_RATE
                    todo = self.events[start : start + BATCH]
                    for _attempt in range(5):
                        if not todo:
                            break
                        todo = self._send(producer, todo)
                    self.unacked.extend(todo)
                    ahead = (start + BATCH) / PUBLISH_RATE - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)  # pacing the load, not waiting for a condition
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which fails with it
            self.error = exc
        finally:
            self.done.set()

    def _send(self, producer: LedgerProducer, events: list[MemoryEvent]) -> list[MemoryEvent]:
        again = []
        for event, outcome in zip(events, producer.send_many(events), strict=True):
            if isinstance(outcome, PublishResult):
                self.first_seen.setdefault(event.event_id, (outcome.partition, outcome.offset))
            else:
                self.failures.append(outcome)
                again.append(event)
        return again


@pytest.fixture
def cluster(base_settings: Settings) -> Iterator[KafkaCluster]:
    """Three brokers on free ports; stopped and their folder removed whatever the test did."""
    ports = free_ports(2 * BROKERS)
    base = base_settings.data_dir / "kafka-cluster" / unique("c")
    kc = KafkaCluster(base_settings, base, list(zip(ports[0::2], ports[1::2], strict=True)), min_isr=MIN_ISR)
    t0 = time.monotonic()
    with kc.running(timeout=180):
        TALLY.timings_s["cluster_start"] = round(time.monotonic() - t0, 1)
        yield kc


@pytest.fixture
def cluster_settings(base_settings: Settings, cluster: KafkaCluster) -> Iterator[Settings]:
    """Private names, on the cluster, replicated three times (the rest: the shared PostgreSQL)."""
    settings = base_settings.private(unique("cluster"), kafka_bootstrap=cluster.bootstrap, topic_replication=BROKERS)
    try:
        yield settings
    finally:
        cleanup(settings)  # before the cluster's teardown (it deletes the topics on it)


def _applied(settings: Settings) -> int:
    return sum(positions(settings).values())


def test_broker_killed_and_restarted_during_ingest_loses_nothing_and_doubles_nothing(
    cluster: KafkaCluster, cluster_settings: Settings
) -> None:
    settings = cluster_settings
    topics = [settings.topic, settings.dlq_topic, settings.access_topic]
    t_start = time.monotonic()

    # the product's own topic creation, on settings alone: RF 3, min.insync.replicas 2
    ensure_topics(settings)
    # the broker asked may not have the just-created topics' metadata yet (it describes none of them until it has),
    # and a new partition's followers join its ISR a moment after its leader
    layout: list[PartitionState] = []

    def described() -> bool:
        layout[:] = cluster.partitions(topics)
        return len(layout) == 3 * settings.topic_partitions and all(len(p.isr) == BROKERS for p in layout)

    wait_for(described, 30, 0.2, "every partition of the new topics described with its replicas in sync")
    assert all(len(p.replicas) == BROKERS and len(p.isr) == BROKERS for p in layout), layout
    # the broker asked may not have replayed a just-created topic's config yet: it reports none until it has
    configs: dict[str, str | None] = {}

    def reported() -> bool:
        configs.update({t: cluster.topic_config(t, "min.insync.replicas") for t in topics})
        return None not in configs.values()

    wait_for(reported, 30, 0.2, "every topic's min.insync.replicas to be reported")
    assert configs == dict.fromkeys(topics, str(MIN_ISR))

    events = workload(N_EVENTS)
    publisher = Publisher(settings, events)
    worker = Worker(settings).start()
    try:
        publisher.start()
        wait_for(lambda: _applied(settings) > 0 or not worker.alive(), 120, 0.2, "the worker applying the first batch")
        worker.check()
        publisher.resume.set()
        wait_for(lambda: publisher.acked >= KILL_AFTER or publisher.done.is_set(), 120, 0.1, f"{KILL_AFTER} acks")
        assert not publisher.done.is_set(), "the stream ended before the kill: nothing was tested"

        leaders = Counter(p.leader for p in cluster.partitions([settings.topic]))
        victim = max(sorted(leaders), key=lambda b: leaders[b])  # the broker that leads the most ledger partitions
        acked_at_kill, applied_at_kill = publisher.acked, _applied(settings)
        t_kill = time.monotonic()
        cluster.kill(victim)
        TALLY.add(faults_injected=1)

        cluster.wait_out_of_isr(victim, [settings.topic], timeout=60)
        failover_s = round(time.monotonic() - t_kill, 1)
        acked_at_fence = publisher.acked
        wait_for(
            lambda: publisher.acked >= acked_at_fence + AFTER_FAILOVER or publisher.done.is_set(),
            90,
            0.1,
            "the stream to go on with two brokers",
        )
        acked_down = publisher.acked - acked_at_kill
        assert not publisher.done.is_set(), "the stream ended while the broker was down: the restart missed it"

        t_restart = time.monotonic()
        cluster.start_node(victim, timeout=120)
        restart_s = round(time.monotonic() - t_restart, 1)

        wait_for(publisher.done.is_set, 120, 0.2, "the publisher to finish")
        publisher.join(10)
        assert publisher.error is None, f"the publisher failed: {publisher.error!r}"
        assert not publisher.unacked, (
            f"{len(publisher.unacked)} events never acknowledged, first: {publisher.failures[-1]}"
        )
        wait_caught_up(settings, timeout=120, worker=worker)
        in_sync = cluster.wait_full_isr(None, timeout=120)
        rejoin_s = round(time.monotonic() - t_restart, 1)
        worker.check()
    finally:
        publisher.resume.set()  # a failed wait above must not leave the thread parked
        worker.stop()

    total_s = round(time.monotonic() - t_start, 1)
    TALLY.add(events_injected=N_EVENTS)
    TALLY.timings_s["cluster_failover"] = failover_s
    TALLY.timings_s["cluster_rejoin"] = rejoin_s
    TALLY.timings_s["cluster_run"] = total_s
    TALLY.notes.append(
        f"kafka cluster: {BROKERS} brokers RF {BROKERS} min ISR {MIN_ISR}, {N_EVENTS} events; broker {victim} "
        f"(leader of {leaders[victim]}/{settings.topic_partitions} ledger partitions) kill -9 after {acked_at_kill} "
        f"acks ({applied_at_kill} applied); out of every ISR after {failover_s}s; {acked_down} acks while down; "
        f"restarted in {restart_s}s, full ISR {rejoin_s}s after the restart; {len(publisher.failures)} publish "
        f"refusals retried"
    )

    # PostgreSQL: every event exactly once, one version each, nothing unexpected
    state = ledger_state(settings)
    lost, doubled, unexpected = lost_and_doubled(
        state, publisher.first_seen, {e.event_id for e in events}, check_positions=not publisher.failures
    )
    TALLY.add(events_lost=len(lost), events_applied_twice=len(doubled))
    assert not lost, f"{len(lost)} events lost, e.g. {sorted(lost)[:5]}"
    assert not doubled, f"{len(doubled)} events applied twice, e.g. {sorted(doubled)[:5]}"
    assert not unexpected, f"{len(unexpected)} events nobody published, e.g. {sorted(unexpected)[:5]}"
    with pg(settings) as conn:
        n_events, n_distinct = conn.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone()
        n_versions, n_version_events = conn.execute(
            "SELECT count(*), count(DISTINCT event_id) FROM fact_versions"
        ).fetchone()
    assert (n_events, n_distinct) == (N_EVENTS, N_EVENTS)
    assert (n_versions, n_version_events) == (N_EVENTS, N_EVENTS)
    counts = invariants(settings, TENANT)
    assert counts["double_active"] == 0 and counts["chain_integrity_violations"] == 0, counts

    # the log: every event on it, and (when no publish had to be retried by hand) each exactly once
    on_log = Counter(orjson.loads(r.value)["event_id"] for r in read_topic(settings))
    assert set(on_log) == {e.event_id for e in events}
    if not publisher.failures:
        assert sum(on_log.values()) == N_EVENTS, f"duplicates on the log: {[k for k, v in on_log.items() if v > 1][:5]}"

    # the worker's positions are the end offsets; no dead letters anywhere
    ends = end_offsets(settings)
    assert positions(settings) == ends, "every record accounted for exactly up to the end"
    dlq = sum(end_offsets(settings, settings.dlq_topic).values())
    TALLY.add(dlq_count=dlq + state.dead_letters)
    assert state.dead_letters == 0 and dlq == 0, (state.dead_letters, dlq)

    # the restarted broker is back in sync on every partition of every topic (each has all three brokers as replicas)
    assert {p.topic for p in in_sync} >= {*topics, "__consumer_offsets"}
    assert all(set(p.isr) == set(p.replicas) == set(range(1, BROKERS + 1)) for p in in_sync), in_sync
