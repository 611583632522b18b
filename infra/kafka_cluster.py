"""A multi-broker KRaft Kafka cluster on this machine, for tests of the ledger against real replication.

The stack's default stays one broker (`infra.kafka`); this module runs N nodes from the same jars
(`infra.kafka.install`) and the same server.properties (`infra.kafka.server_properties`), each node
broker and controller in one process (combined mode, N voters), the internal topics replicated N
times with `min.insync.replicas` as given. Every port and folder is a parameter: nothing here uses
the stack's data folder (the caller picks free ports), and the pid files and logs live under `base_dir`
(`<node>/server.log` the broker's log, `<node>/stdout.log` its console), so a cluster never touches
another one. Nodes can be killed with SIGKILL and started again one at a time (`kill`, `start_node`).

    with KafkaCluster(settings, base_dir, [(p1, c1), (p2, c2), (p3, c3)]) as cluster:
        bootstrap = cluster.bootstrap  # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import kafka.errors as Errors
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from infra.kafka import MAIN_CLASS, STORAGE_TOOL, install, java_command, log4j_properties, server_properties
from infra.procs import InfraError, owned_pid, port_open, run, spawn, stop_pid, wait_until
from producers.retry import retry
from producers.settings import Settings
from producers.topics import probe

__all__ = ["KafkaCluster", "Node", "PartitionState"]

PART = "kafka-cluster"
PROBE_TOPIC = "__ledger_cluster_probe"
T = TypeVar("T")


@dataclass(frozen=True)
class Node:
    """One broker+controller: its id, its two ports and its folder."""

    node_id: int
    port: int
    controller_port: int
    home: Path

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def log4j(self) -> Path:
        return self.home / "log4j2.properties"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"

    @property
    def stdout_log(self) -> Path:
        return self.home / "stdout.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"


@dataclass(frozen=True)
class PartitionState:
    """What the cluster's metadata says of one partition."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class KafkaCluster:
    """`len(ports)` KRaft nodes on `host`; `ports` is one (broker port, controller port) pair per node."""

    def __init__(
        self,
        settings: Settings,
        base_dir: Path,
        ports: Sequence[tuple[int, int]],
        *,
        host: str = "127.0.0.1",
        heap: str = "256m",
        min_isr: int = 2,
        session_timeout_ms: int = 6000,
    ) -> None:
        if len(ports) < 1:
            raise ValueError("a cluster needs at least one node")
        self.settings, self.base_dir, self.host, self.heap = settings, base_dir, host, heap
        self.replication = len(ports)
        self.min_isr = min(min_isr, self.replication)
        # the controller fences a broker whose heartbeats stop for this long (default 9 s): then the
        # partitions it led elect new leaders and it leaves their ISRs
        self.session_timeout_ms = session_timeout_ms
        self.nodes = [Node(i, port, cport, base_dir / f"node-{i}") for i, (port, cport) in enumerate(ports, start=1)]

    # -- addresses ---------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The Kafka bootstrap servers of every node (`LEDGER_KAFKA_BOOTSTRAP`)."""
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> KafkaCluster:
        """Write every node's configuration, format its storage (one cluster id), start all, wait for health."""
        for n in self.nodes:
            for port in (n.port, n.controller_port):
                if port_open(self.host, port):
                    raise InfraError(PART, f"port {port} (node {n.node_id}) is already taken")
        install(self.settings)
        cluster_id = uuid.uuid4().hex[:22]
        for n in self.nodes:
            self._write_config(n)
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # three JVMs at once: formatting is JVM start-up
            list(pool.map(lambda n: self._format(n, cluster_id), self.nodes))
        for n in self.nodes:
            self._spawn(n)
        try:
            wait_until(self.healthy, PART, timeout, self.nodes[0].server_log, self._all_alive)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped (or killed) node again on its own data; wait until the cluster lists it."""
        n = self.node(node_id)
        if self.pid(node_id) is not None:
            raise InfraError(PART, f"node {node_id} is still running")
        self._spawn(n)
        wait_until(
            lambda: probe(f"{self.host}:{n.port}", timeout=5.0),
            PART,
            timeout,
            n.server_log,
            lambda: self.pid(node_id) is not None,
            what=f"answering (node {node_id})",
        )

    def kill(self, node_id: int) -> int:
        """SIGKILL one node, like a crash (no shutdown code runs); returns the pid killed."""
        pid = self.pid(node_id)
        if pid is None:
            raise InfraError(PART, f"node {node_id} is not running")
        stop_pid(pid, signal.SIGKILL, timeout=30)
        self.node(node_id).pid_file.unlink(missing_ok=True)
        return pid

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node still running (SIGTERM, SIGKILL after `timeout`), all at once."""
        running = [(n, self.pid(n.node_id)) for n in self.nodes]
        for _, pid in running:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGTERM)  # a pid this cluster started (`pid` checks the command line)
                except ProcessLookupError:
                    pass
        for n, pid in running:
            if pid is not None:
                stop_pid(pid, signal.SIGTERM, timeout)
            n.pid_file.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the cluster's folder (data, configurations, logs); only once it is stopped."""
        if any(self.pid(n.node_id) is not None for n in self.nodes):
            raise InfraError(PART, "remove() of a running cluster")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.remove()

    def pid(self, node_id: int) -> int | None:
        """The node's pid while it runs (its command line names its own configuration: never another broker)."""
        n = self.node(node_id)
        return owned_pid(n.pid_file, str(n.config))

    # -- health and metadata -----------------------------------------------------------------------

    def registered(self) -> set[int]:
        """Ids of the brokers the cluster's metadata lists (registered and not fenced)."""
        return self._ask(lambda admin: {b["broker_id"] for b in admin.describe_cluster()["brokers"]})

    def wait_out_of_isr(self, node_id: int, topics: Sequence[str], timeout: float = 60.0) -> list[PartitionState]:
        """Wait until `node_id` is in no ISR of `topics` (after a crash: the controller fenced it); the states."""
        seen: list[PartitionState] = []

        def gone() -> bool:
            seen[:] = self.partitions(topics)
            return bool(seen) and all(node_id not in p.isr for p in seen)

        wait_until(gone, PART, timeout, what=f"without node {node_id} in any ISR")
        return seen

    def healthy(self) -> bool:
        """Every node registered, and a topic replicated on all of them can be created with a full ISR."""
        if self.registered() != {n.node_id for n in self.nodes}:
            return False
        with self._admin() as admin:
            if PROBE_TOPIC not in admin.list_topics():
                admin.create_topics(
                    {
                        PROBE_TOPIC: {
                            "num_partitions": 1,
                            "replication_factor": self.replication,
                            "configs": {"min.insync.replicas": str(self.min_isr)},
                        }
                    },
                    timeout_ms=10_000,
                    raise_errors=False,
                )
                admin.wait_for_topics([PROBE_TOPIC], timeout_ms=10_000)
        return all(len(p.isr) == self.replication for p in self.partitions([PROBE_TOPIC]))

    def partitions(self, topics: Sequence[str] | None = None) -> list[PartitionState]:
        """Leader, replicas and ISR of every partition of `topics` (None: all topics, internal ones too)."""
        described = self._ask(lambda admin: admin.describe_topics(list(topics) if topics is not None else None))
        return sorted(
            (
                PartitionState(
                    t["name"],
                    p["partition_index"],
                    p["leader_id"],
                    tuple(p["replica_nodes"]),
                    tuple(p["isr_nodes"]),
                )
                for t in described
                for p in t["partitions"]
            ),
            key=lambda s: (s.topic, s.partition),
        )

    def topic_config(self, topic: str, name: str) -> str | None:
        """One configuration value of a topic as the brokers report it (e.g. `min.insync.replicas`)."""
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {name: None})
        described = self._ask(lambda admin: admin.describe_configs([resource], config_filter="all"))
        entry = described.get("topic", {}).get(topic, {}).get(name)
        return None if entry is None else entry["value"]

    def wait_full_isr(self, topics: Sequence[str] | None = None, timeout: float = 120.0) -> list[PartitionState]:
        """Wait until every partition of `topics` has all its replicas in sync; returns the states seen."""
        seen: list[PartitionState] = []

        def full() -> bool:
            seen[:] = self.partitions(topics)
            return bool(seen) and all(set(p.isr) == set(p.replicas) for p in seen)

        try:
            wait_until(full, PART, timeout, what="in sync on every partition")
        except InfraError as exc:
            lagging = [p for p in seen if set(p.isr) != set(p.replicas)]
            raise InfraError(PART, f"{exc.reason}; out of sync: {lagging[:10]}") from None
        return seen

    # -- internals ---------------------------------------------------------------------------------

    def _ask(self, call: Callable[[KafkaAdminClient], T], attempts: int = 5) -> T:
        """One admin call, retried on a connection error: the metadata still lists a crashed node until it is
        fenced (and, measured with Kafka 4.1.1, after that too), and kafka-python may send the request to it."""

        def once() -> T:
            with self._admin() as admin:
                return call(admin)

        lost = (Errors.KafkaConnectionError, Errors.BrokerNotAvailableError, Errors.KafkaTimeoutError)
        return retry(once, attempts=attempts, retry_on=lost, step_s=0.2)

    def _admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id="memory-ledger-cluster",
            bootstrap_timeout_ms=5000,
            request_timeout_ms=5000,
        )

    def _write_config(self, n: Node) -> None:
        n.home.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{m.node_id}@{self.host}:{m.controller_port}" for m in self.nodes)
        n.config.write_text(
            server_properties(
                node_id=n.node_id,
                voters=voters,
                host=self.host,
                port=n.port,
                controller_port=n.controller_port,
                data_dir=n.data,
                partitions=self.settings.topic_partitions,
                replication=self.replication,
                min_isr=self.min_isr,
                extra=[
                    f"default.replication.factor={self.replication}",
                    f"min.insync.replicas={self.min_isr}",
                    f"broker.session.timeout.ms={self.session_timeout_ms}",
                    f"broker.heartbeat.interval.ms={max(500, self.session_timeout_ms // 4)}",
                    # small heaps: the log cleaner's dedupe buffer is 128 MB by default
                    "log.cleaner.dedupe.buffer.size=16777216",
                    "num.io.threads=4",
                    "num.network.threads=2",
                ],
            )
        )
        n.log4j.write_text(log4j_properties(n.server_log))

    def _format(self, n: Node, cluster_id: str) -> None:
        n.data.mkdir(parents=True, exist_ok=True)
        cmd = java_command(self.settings, STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(n.config), log4j=n.log4j)
        run(cmd, PART, n.stdout_log)

    def _spawn(self, n: Node) -> int:
        cmd = java_command(self.settings, MAIN_CLASS, str(n.config), heap=self.heap, log4j=n.log4j)
        return spawn(cmd, n.stdout_log, n.pid_file)

    def _all_alive(self) -> bool:
        return all(self.pid(n.node_id) is not None for n in self.nodes)
