"""A real Elasticsearch cluster: three nodes, one replica, the node holding the primary killed with kill -9 while
events flow and recalls are asked, and started again; recall keeps answering and the index converges.

The same code that runs on the stack's single node runs here against a cluster of three (`infra.es_cluster`, on
free ports, data under `.data/elasticsearch-cluster/`), only through settings: `es_url` lists the three nodes
(every client of ours then spreads its requests over them and sends one again to another node when a node is
unreachable) and `es_replicas=1` makes the indexer create the index with a replica of its shard. The shared
single node is never touched. The real worker, `ledger indexer` and `ledger embedder` run as subprocesses, the
app in-process; a publisher thread streams a mixed workload (updates, retractions, episodes, duplicates) and a
recall thread asks exact questions whose answers were indexed before the fault, all the while.

Mid-stream the node holding the index's primary shard is SIGKILLed: the master promotes the replica, writes go on
to it, and searches are answered by it. Once documents were indexed with the node down, it is started again on
its own data and recovers its copy. Then: no recall failed and none missed its answer; PostgreSQL holds every
event once; the index holds exactly PostgreSQL's versions (each version one document, none missing, none extra),
and the two copies of the shard hold the same number of documents, the cluster green.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from infra.es_cluster import EsCluster
from infra.private import free_ports
from infra.procs import service_dir
from producers.contract import EventType
from producers.settings import Settings
from projections.search.reindex import orphans
from tests.conftest import unique
from tests.faults.support import TALLY, Publisher, invariants, ledger_state, lost_and_doubled, workload
from tests.support import asserted, pg, pipeline, wait_for

NODES = 3
N_EVENTS = 2_400
PUBLISH_RATE = 80  # events/s: a ~30 s stream, so the kill, the failover and the restart fall inside it
KILL_AFTER = N_EVENTS // 4  # published before the kill
TENANT = "escluster"
KEY = "escluster-key"
HEADERS = {"X-API-Key": KEY}
ANCHORS = 10  # facts indexed before the fault; the recall thread asks for them throughout


def anchors() -> list:
    return [asserted(f"project:A{i}", "project.backend.port", 9000 + i, tenant=TENANT) for i in range(ANCHORS)]


class Recaller(threading.Thread):
    """Asks `POST /v1/recall` for the anchors' ports in turn until stopped; counts what answered, failed, missed."""

    def __init__(self, client: TestClient) -> None:
        super().__init__(name="es-cluster-recaller", daemon=True)
        self.client = client
        self.answered = 0
        self.failed: list[tuple[float, int, str]] = []  # (time, status, body) of every non-200
        self.missed: list[tuple[float, list]] = []  # 200 without the anchor's value first
        self.slowest_s = 0.0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                n = i % ANCHORS
                t0 = time.monotonic()
                r = self.client.post(
                    "/v1/recall", json={"tenant": TENANT, "query": f"A{n} backend port"}, headers=HEADERS
                )
                self.slowest_s = max(self.slowest_s, time.monotonic() - t0)
                if r.status_code != 200:
                    self.failed.append((t0, r.status_code, r.text[:300]))
                else:
                    hits = r.json()["hits"]
                    if not hits or (hits[0]["subject"], hits[0]["value"]) != (f"project:A{n}", 9000 + n):
                        self.missed.append((t0, hits[:1]))
                    self.answered += 1
                i += 1
                self.stop.wait(0.05)  # a steady trickle of questions, not a load test
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which fails with it
            self.error = exc


@pytest.fixture
def cluster(base_settings: Settings) -> Iterator[EsCluster]:
    """Three nodes on free ports, 512 MB heaps; stopped and their folder removed whatever the test did."""
    ports = free_ports(2 * NODES)
    parent = service_dir(base_settings.data_dir, "elasticsearch-cluster")  # the service user must reach it
    ec = EsCluster(base_settings, parent / unique("e"), list(zip(ports[0::2], ports[1::2], strict=True)))
    t0 = time.monotonic()
    with ec.running(timeout=240):
        TALLY.timings_s["es_cluster_start"] = round(time.monotonic() - t0, 1)
        yield ec


def _primary(cluster: EsCluster, index: str) -> str | None:
    """The node holding the started primary of the index's one shard (None while there is none)."""
    started = [s for s in cluster.shards(index) if s["prirep"] == "p" and s["state"] == "STARTED"]
    return started[0]["node"] if started else None


def _documents(cluster: EsCluster, index: str) -> int:
    with cluster.client() as es:
        return es.count(index=index)["count"]


@pytest.mark.timeout(1200)  # about 5 minutes alone on a slow 2-core host (the embedder works off the stream)
def test_node_killed_mid_ingest_and_mid_recall_recall_answers_and_the_index_converges(
    cluster: EsCluster, base_settings: Settings
) -> None:
    settings = base_settings.private(unique("escluster"), es_url=cluster.url, es_replicas=1, api_keys={KEY: [TENANT]})
    t_start = time.monotonic()
    events, seed = workload(29, N_EVENTS, TENANT), anchors()
    with pipeline(settings, seed=seed, app=True) as pipe:
        assert pipe.client is not None and pipe.indexer is not None
        index = settings.es_index
        # the indexer's own index creation, on settings alone: one shard, one replica, on two different nodes
        with cluster.client() as es:
            physical = next(iter(es.indices.get_alias(name=index)))
            assert es.indices.get_settings(index=physical)[physical]["settings"]["index"]["number_of_replicas"] == "1"
        cluster.wait_green(60)
        copies = cluster.shards(index)
        assert sorted(c["prirep"] for c in copies) == ["p", "r"] and len({c["node"] for c in copies}) == 2, copies

        publisher = Publisher(settings, events, rate=PUBLISH_RATE, batch=100)
        recaller = Recaller(pipe.client)
        try:
            recaller.start()
            wait_for(lambda: recaller.answered >= ANCHORS or recaller.error is not None, 60, 0.1, "first recalls")
            publisher.start()
            wait_for(lambda: publisher.sent >= KILL_AFTER or publisher.done.is_set(), 120, 0.1, f"{KILL_AFTER} sent")
            assert not publisher.done.is_set(), "the stream ended before the kill: nothing was tested"

            victim = cluster.by_name(_primary(cluster, index) or "")
            was_master = cluster.master() == victim.name
            docs_at_kill, sent_at_kill, recalls_at_kill = _documents(cluster, index), publisher.sent, recaller.answered
            t_kill = time.monotonic()
            cluster.kill(victim.node_id)
            TALLY.add(faults_injected=1)

            # the master saw the node leave and promoted the replica: the shard has a primary again elsewhere. Each
            # question may be answered by another node, and a node applies a committed cluster state a moment after
            # another: the new primary can be seen on one while the next still lists the victim
            def failed_over() -> bool:
                return (_primary(cluster, index) or victim.name) != victim.name and victim.name not in cluster.members()

            wait_for(failed_over, 60, 0.2, "the victim gone and a new primary")
            failover_s = round(time.monotonic() - t_kill, 1)
            # started again at once: until it has joined (its JVM's start-up, tens of seconds) the stream is indexed
            # and the recalls answered on two nodes; (documents, recalls answered) seen with it out, before and after
            t_restart = time.monotonic()
            cluster.start_node(victim.node_id, wait=False)
            down: list[tuple[int, int]] = []

            def written_while_down() -> bool:
                if victim.name in cluster.members():
                    return True  # joined already: whatever was seen is what there is
                seen = (_documents(cluster, index), recaller.answered)
                if victim.name not in cluster.members():
                    down.append(seen)
                return bool(down) and down[-1][0] > docs_at_kill + N_EVENTS // 20

            wait_for(written_while_down, 180, 0.5, "documents indexed with the node down")
            cluster.wait_member(victim.node_id, timeout=180)
            restart_s = round(time.monotonic() - t_restart, 1)
            docs_down, recalls_down = (down[-1][0] - docs_at_kill, down[-1][1] - recalls_at_kill) if down else (0, 0)
            pipe.indexer.check()

            wait_for(publisher.done.is_set, 120, 0.2, "the publisher to finish")
            publisher.join(10)
            pipe.settle(120)  # every applied version indexed (with its vectors) and searchable, however slowly embedded
            health = cluster.wait_green(120)  # the returned node's copy recovered
            rejoin_s = round(time.monotonic() - t_restart, 1)
        finally:
            recaller.stop.set()
            publisher.stop.set()
            recaller.join(30)
        assert recaller.error is None, f"the recall thread failed: {recaller.error!r}"
        pipe.indexer.check()
        indexer_retries = pipe.indexer.log().count("retrying in")  # the drain loop's back-off lines

        with cluster.client(30) as es:
            es.indices.refresh(index=index)
            with pg(settings) as conn:
                report = orphans(settings, conn, es)
                pg_versions = conn.execute("SELECT count(*) FROM fact_versions").fetchone()[0]
            es_count = es.count(index=index)["count"]
        copies = cluster.shards(index)
        state, counts = ledger_state(settings), invariants(settings, TENANT)  # before the pipeline drops the schema

    total_s = round(time.monotonic() - t_start, 1)
    TALLY.add(events_injected=N_EVENTS, http_requests=recaller.answered + len(recaller.failed))
    TALLY.add(http_5xx=sum(1 for _, status, _ in recaller.failed if status >= 500))
    TALLY.timings_s["es_cluster_failover"] = failover_s
    TALLY.timings_s["es_cluster_rejoin"] = rejoin_s
    TALLY.timings_s["es_cluster_run"] = total_s
    TALLY.notes.append(
        f"elasticsearch cluster: {NODES} nodes, 1 shard + 1 replica, {N_EVENTS} events; {victim.name} (primary"
        f"{', elected master' if was_master else ''}) kill -9 at {docs_at_kill} documents ({sent_at_kill} sent); "
        f"new primary after {failover_s}s; {docs_down} documents and {recalls_down} recalls with it down; "
        f"restarted in {restart_s}s, green {rejoin_s}s after the restart; recalls {recaller.answered} answered, "
        f"{len(recaller.failed)} failed, {len(recaller.missed)} missed, slowest {recaller.slowest_s:.2f}s; "
        f"indexer back-offs {indexer_retries}"
    )

    # recall answered throughout, from whichever copy was up, and always with the anchor's value
    assert not recaller.failed, f"{len(recaller.failed)} recalls failed, first: {recaller.failed[:3]}"
    assert not recaller.missed, f"{len(recaller.missed)} recalls missed their answer, first: {recaller.missed[:3]}"
    assert recalls_down > 0, "no recall was asked while the node was down: nothing was tested"
    assert docs_down > 0, "no document was written while the node was down: nothing was tested"

    # PostgreSQL: every acknowledged event exactly once
    assertions = {e.event_id for e in events if e.type is EventType.ASSERTED}
    lost, doubled, unexpected = lost_and_doubled(state, publisher.first_seen, assertions)
    TALLY.add(events_lost=len(lost), events_applied_twice=len(doubled))
    assert not publisher.errors, f"{len(publisher.errors)} publishes refused, first: {publisher.errors[0]}"
    assert set(publisher.first_seen) == {e.event_id for e in events}, "every event of the workload acknowledged"
    assert not lost, f"{len(lost)} events lost, e.g. {sorted(lost)[:5]}"
    assert not doubled, f"{len(doubled)} events applied twice, e.g. {sorted(doubled)[:5]}"
    assert unexpected == {e.event_id for e in seed}, "only the anchors were published by someone else"
    assert counts["double_active"] == 0 and counts["chain_integrity_violations"] == 0, counts

    # the index: exactly PostgreSQL's versions, each once, on both copies of the shard
    assert report["missing_in_es"] == 0 and report["missing_in_pg"] == 0, report
    assert report["outbox_pending"] == 0 and es_count == report["es_documents"] == report["pg_versions"], report
    assert pg_versions == es_count > N_EVENTS // 2, (pg_versions, es_count)
    assert health["status"] == "green" and health["number_of_nodes"] == NODES, health
    docs = Counter((c["prirep"], c["state"], int(c["docs"])) for c in copies)
    assert docs == Counter({("p", "STARTED", es_count): 1, ("r", "STARTED", es_count): 1}), copies
