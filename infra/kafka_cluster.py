"""A multi-broker KRaft Kafka cluster on this machine, for tests of the ledger against real replication.

N combined broker/controller nodes from the stack's jars and server.properties; every port and folder is a
parameter, so a cluster never touches the stack's broker or another cluster. Nodes can be killed and restarted one
at a time (`kill`, `start_node`). `sasl_users` and `tls` make the clients' listener ask for credentials and TLS,
as a managed Kafka does; `cluster.client_settings(settings, user)` is what a client needs to reach it.

    with KafkaCluster(settings, base_dir, [(p1, c1), (p2, c2), (p3, c3)]) as cluster:
        bootstrap = cluster.bootstrap  # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import kafka.errors as Errors
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from pydantic import SecretStr

from infra.kafka import MAIN_CLASS, STORAGE_TOOL, install, java_command, log4j_properties, server_properties
from infra.local_cluster import LocalCluster
from infra.procs import InfraError, owned_pid, run, spawn, wait_until
from producers.kafka_producer import kafka_connection
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


class KafkaCluster(LocalCluster[Node]):
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
        sasl_users: Mapping[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        if len(ports) < 1:
            raise ValueError("a cluster needs at least one node")
        for user, password in (sasl_users or {}).items():  # they are written into a JAAS line between quotes
            if not user.isidentifier() or any(c in password for c in '"\\;\n\r') or not password:
                raise ValueError(f'SASL user {user!r}: a name of letters, digits and _, a password without " \\ ;')
        self.sasl_users = dict(sasl_users or {})
        self.tls = tls  # (key and certificate chain, CA certificate), PEM
        self.settings, self.base_dir, self.host, self.heap = settings, base_dir, host, heap
        self.part = PART
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

    @property
    def listener(self) -> str:
        """The security protocol of the clients' listener (its name too)."""
        return ("SASL_" if self.sasl_users else "") + ("SSL" if self.tls else "PLAINTEXT")

    def client_settings(
        self, settings: Settings, user: str | None = None, password: str | None = None, bootstrap: str | None = None
    ) -> Settings:
        """`settings` on this cluster: its bootstrap (or `bootstrap`) and, with SASL, `user` (default: the first) with
        `password` (default: the user's own; another one is refused by the brokers)."""
        update: dict[str, object] = {
            "kafka_bootstrap": bootstrap or self.bootstrap,
            "kafka_security_protocol": self.listener,
            "kafka_ssl_cafile": self.tls[1] if self.tls else None,
        }
        if self.sasl_users:
            user = user or next(iter(self.sasl_users))
            secret = password if password is not None else self.sasl_users[user]
            update |= {
                "kafka_sasl_mechanism": "PLAIN",
                "kafka_sasl_username": user,
                "kafka_sasl_password": SecretStr(secret),
            }
        return settings.model_copy(update=update)

    # -- lifecycle ---------------------------------------------------------------------------------

    def launch_all(self) -> None:
        """Write every node's configuration, format its storage (one cluster id) and start them."""
        install(self.settings)
        cluster_id = uuid.uuid4().hex[:22]
        for n in self.nodes:
            self._write_config(n)
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # three JVMs at once: formatting is JVM start-up
            list(pool.map(lambda n: self._format(n, cluster_id), self.nodes))
        for n in self.nodes:
            self._spawn(n)

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped (or killed) node again on its own data; wait until the cluster lists it."""
        n = self.node(node_id)
        if self.pid(node_id) is not None:
            raise InfraError(PART, f"node {node_id} is still running")
        self._spawn(n)
        alone = self.client_settings(self.settings, bootstrap=f"{self.host}:{n.port}")
        self.wait_node(node_id, lambda: probe(alone, timeout=5.0), "answering", timeout)

    def addresses(self, node: Node) -> list[tuple[str, int]]:
        return [(self.host, node.port), (self.host, node.controller_port)]

    def log(self, node: Node) -> Path:
        return node.server_log

    def processes(self, node: Node) -> list[tuple[Path, int | None]]:
        """The node's one process (its command line names its own configuration: never another broker)."""
        return [(node.pid_file, owned_pid(node.pid_file, str(node.config)))]

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
            **kafka_connection(self.client_settings(self.settings)),
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
                listener=self.listener,
                extra=[
                    *self._security_properties(),
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
        if self.sasl_users:
            n.config.chmod(0o600)  # it holds the users' passwords
        n.log4j.write_text(log4j_properties(n.server_log))

    def _security_properties(self) -> list[str]:
        """TLS on the clients' listener (the brokers, clients of each other, check its certificate against the CA), and
        the PLAIN mechanism with its users in the broker's JAAS line; the first user is the one the brokers log in as
        to each other."""
        lines = []
        if self.tls:
            keystore, ca = self.tls
            lines += [
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={keystore}",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={ca}",
            ]
        if self.sasl_users:
            (own, own_password), *_ = self.sasl_users.items()
            users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            login = "org.apache.kafka.common.security.plain.PlainLoginModule required"
            jaas = f'{login} username="{own}" password="{own_password}" {users};'
            lines += [
                "sasl.enabled.mechanisms=PLAIN",
                "sasl.mechanism.inter.broker.protocol=PLAIN",
                f"listener.name.{self.listener.lower()}.plain.sasl.jaas.config={jaas}",
            ]
        return lines

    def _format(self, n: Node, cluster_id: str) -> None:
        n.data.mkdir(parents=True, exist_ok=True)
        cmd = java_command(self.settings, STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(n.config), log4j=n.log4j)
        run(cmd, PART, n.stdout_log)

    def _spawn(self, n: Node) -> int:
        cmd = java_command(self.settings, MAIN_CLASS, str(n.config), heap=self.heap, log4j=n.log4j)
        return spawn(cmd, n.stdout_log, n.pid_file)
