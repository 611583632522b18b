"""A multi-node Elasticsearch cluster on this machine, for tests of the ledger against real shard replication.

N master-eligible data nodes from the stack's unpacked zip, each with its own configuration, data, logs and ports;
the cluster is named after its folder, so it never joins the stack's node or another cluster. `base_dir` must be
reachable by the service user (infra.procs.service_dir). Nodes can be killed and restarted one at a time (`kill`,
`start_node`). `security` (`EsSecurity`) turns on HTTPS, transport TLS and the `elastic` user's password, as a
managed cluster has them; `cluster.client_settings(settings)` is what a client needs.

    with EsCluster(settings, base_dir, [(h1, t1), (h2, t2), (h3, t3)]) as cluster:
        url = cluster.url  # "http://127.0.0.1:h1,http://127.0.0.1:h2,http://127.0.0.1:h3" (LEDGER_ES_URL)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from elasticsearch import Elasticsearch

from infra.elasticsearch import give_to, java_home, node_config, unpack
from infra.local_cluster import LocalCluster
from infra.procs import InfraError, owned_pid, run, spawn, wait_until
from producers.settings import Settings
from projections.search.client import es_client

__all__ = ["EsCluster", "EsNode", "EsSecurity"]

PART = "elasticsearch-cluster"
LAUNCHER = "elasticsearch"  # in bin/elasticsearch's command line and in the CLI launcher JVM's it execs


@dataclass(frozen=True)
class EsSecurity:
    """Security on: HTTPS and transport TLS with `cert` and `key` (PEM) signed by `ca`, the `elastic` user's
    `password`; `client_auth` `required`: HTTPS clients must show a certificate signed by `ca` (the cluster's own
    client shows `client_cert` and `client_key`)."""

    cert: Path
    key: Path
    ca: Path
    password: str
    client_auth: Literal["none", "optional", "required"] = "none"
    client_cert: Path | None = None
    client_key: Path | None = None

    def settings(self) -> list[str]:
        """The nodes' `xpack.security.*` lines (the files as copied into each configuration folder, `certs/`)."""
        lines = ["xpack.security.enabled: true"]
        for layer in ("http", "transport"):
            lines += [
                f"xpack.security.{layer}.ssl.enabled: true",
                f"xpack.security.{layer}.ssl.certificate: certs/{self.cert.name}",
                f"xpack.security.{layer}.ssl.key: certs/{self.key.name}",
                f"xpack.security.{layer}.ssl.certificate_authorities: [certs/{self.ca.name}]",
            ]
        return [
            *lines,
            f"xpack.security.http.ssl.client_authentication: {self.client_auth}",
            "xpack.security.transport.ssl.verification_mode: certificate",  # the nodes' certificate names no node
        ]


@dataclass(frozen=True)
class EsNode:
    """One master-eligible data node: its number, its HTTP and transport ports and its folder."""

    node_id: int
    http_port: int
    transport_port: int
    home: Path
    host: str = "127.0.0.1"
    scheme: str = "http"

    @property
    def name(self) -> str:
        return f"node-{self.node_id}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"

    @property
    def config_dir(self) -> Path:
        return self.home / "config"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def stdout_log(self) -> Path:
        return self.home / "stdout.log"

    @property
    def pid_file(self) -> Path:
        """The server JVM's pid, written by Elasticsearch itself (`-p`)."""
        return self.home / "es.pid"

    @property
    def launcher_pid_file(self) -> Path:
        """The pid of what `spawn` started: the CLI launcher, the server JVM's parent."""
        return self.home / "launcher.pid"

    @property
    def marker(self) -> str:
        """A JVM option only this node's server carries (its heap file adds it): `pid` never names another JVM."""
        return f"-Dledger.es.node={self.home}"


class EsCluster(LocalCluster[EsNode]):
    """`len(ports)` nodes on `host`; `ports` is one (HTTP port, transport port) pair per node."""

    def __init__(
        self,
        settings: Settings,
        base_dir: Path,
        ports: Sequence[tuple[int, int]],
        *,
        heap: str = "512m",
        security: EsSecurity | None = None,
    ) -> None:
        if len(ports) < 1:
            raise ValueError("a cluster needs at least one node")
        self.settings, self.base_dir, self.heap, self.part = settings, base_dir, heap, PART
        self.security = security
        self.cluster_name = f"ledger-{base_dir.name}"
        scheme = "https" if security else "http"
        self.nodes = [
            EsNode(i, http, tp, base_dir / f"node-{i}", scheme=scheme) for i, (http, tp) in enumerate(ports, start=1)
        ]

    # -- addresses ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (`LEDGER_ES_URL`)."""
        return ",".join(n.url for n in self.nodes)

    def by_name(self, name: str) -> EsNode:
        return next(n for n in self.nodes if n.name == name)

    def client_settings(self, settings: Settings, password: str | None = None) -> Settings:
        """`settings` on this cluster: its nodes and, with security, the `elastic` user with `password` (default:
        its own) in the URLs, the CA and the client certificate."""
        if self.security is None:
            return settings.model_copy(update={"es_url": self.url})
        sec = self.security
        login = f"elastic:{quote(sec.password if password is None else password, safe='')}@"
        update = {
            "es_url": ",".join(f"{n.scheme}://{login}{n.host}:{n.http_port}" for n in self.nodes),
            "es_ca_certs": sec.ca,
            "es_client_cert": sec.client_cert,
            "es_client_key": sec.client_key,
        }
        return settings.model_copy(update=update)

    def client(self, request_timeout: float = 10.0) -> Elasticsearch:
        """A client of every node (the product's own, `projections.search.client.es_client`)."""
        return es_client(self.client_settings(self.settings), request_timeout=request_timeout)

    # -- lifecycle ---------------------------------------------------------------------------------

    def launch_all(self) -> None:
        """Write every node's configuration (bootstrapping one cluster of them all) and start them."""
        home = unpack(self.settings)
        for n in self.nodes:
            self._configure(n, home, bootstrap=True)
        give_to(self.settings, self.base_dir)
        for n in self.nodes:
            self._spawn(n, home)

    def start_node(self, node_id: int, timeout: float = 120.0, *, wait: bool = True) -> None:
        """Start a stopped (or killed) node again on its own data; wait until the cluster lists it again
        (`wait=False`: return once it is started, and `wait_member` later)."""
        n = self.node(node_id)
        if self.alive(n):
            raise InfraError(PART, f"node {node_id} is still running")
        home = unpack(self.settings)
        self._configure(n, home, bootstrap=False)  # it knows its cluster now: bootstrapping again is refused
        give_to(self.settings, n.home)
        self._spawn(n, home)
        if wait:
            self.wait_member(node_id, timeout)

    def wait_member(self, node_id: int, timeout: float = 120.0) -> None:
        """Wait until the elected master lists the node (fails at once if its process exited)."""
        name = self.node(node_id).name
        self.wait_node(node_id, lambda: name in self.members(), "in the cluster", timeout)

    def addresses(self, node: EsNode) -> list[tuple[str, int]]:
        return [(node.host, node.http_port), (node.host, node.transport_port)]

    def log(self, node: EsNode) -> Path:
        return node.stdout_log

    def processes(self, node: EsNode) -> list[tuple[Path, int | None]]:
        """The server JVM (its command line carries the node's marker: never another node's), then its launcher."""
        return [
            (node.pid_file, owned_pid(node.pid_file, node.marker)),
            (node.launcher_pid_file, owned_pid(node.launcher_pid_file, LAUNCHER)),
        ]

    # -- health and shards -------------------------------------------------------------------------

    def health(self, **params: Any) -> dict[str, Any]:
        """`_cluster/health` through any node that answers."""
        with self.client() as es:
            return dict(es.cluster.health(**params))

    def healthy(self) -> bool:
        """Every node in the cluster and every shard copy assigned (green)."""
        h = self.health()
        return h["number_of_nodes"] == len(self.nodes) and h["status"] == "green"

    def members(self) -> set[str]:
        """Names of the nodes the elected master lists."""
        with self.client() as es:
            return {row["name"] for row in es.cat.nodes(format="json", h="name")}

    def master(self) -> str:
        """The elected master's name."""
        with self.client() as es:
            return es.cat.master(format="json")[0]["node"]

    def shards(self, index: str) -> list[dict[str, str]]:
        """Every copy of `index`'s shards: `shard`, `prirep` (p or r), `state`, `docs`, `node` (as _cat/shards)."""
        with self.client() as es:
            rows = es.cat.shards(index=index, format="json", h="shard,prirep,state,docs,node")
        return [dict(r) for r in rows]

    def wait_green(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until every shard copy of every index is assigned and started again; the health then."""
        seen: dict[str, Any] = {}

        def green() -> bool:
            seen.update(self.health())
            return self.healthy()

        try:
            wait_until(green, PART, timeout, what="green")
        except InfraError as exc:
            raise InfraError(PART, f"{exc.reason}; last health: {seen}") from None
        return seen

    # -- internals ---------------------------------------------------------------------------------

    def _configure(self, n: EsNode, home: Path, *, bootstrap: bool) -> None:
        """The zip's configuration folder copied for the node, with its own elasticsearch.yml and heap."""
        if not n.config_dir.exists():
            shutil.copytree(home / "config", n.config_dir, ignore=shutil.ignore_patterns("elasticsearch.yml", "*.pid"))
        seeds = ", ".join(f'"{m.host}:{m.transport_port}"' for m in self.nodes)
        discovery = [f"discovery.seed_hosts: [{seeds}]"]
        if bootstrap:
            discovery.append(f"cluster.initial_master_nodes: [{', '.join(m.name for m in self.nodes)}]")
        n.config_dir.joinpath("elasticsearch.yml").write_text(
            node_config(
                cluster=self.cluster_name,
                node=n.name,
                host=n.host,
                http_port=n.http_port,
                transport=str(n.transport_port),
                data=n.data,
                logs=n.logs,
                discovery=discovery,
                **({"security": self.security.settings()} if self.security else {}),
            )
        )
        if self.security:
            self._secure(n, home)
        options = n.config_dir / "jvm.options.d"
        options.mkdir(exist_ok=True)
        options.joinpath("heap.options").write_text(f"-Xms{self.heap}\n-Xmx{self.heap}\n{n.marker}\n")
        for d in (n.data, n.logs):
            d.mkdir(parents=True, exist_ok=True)

    def _secure(self, n: EsNode, home: Path) -> None:
        """The TLS files into the node's `certs/`, the `elastic` user's password into its keystore."""
        assert self.security is not None
        certs = n.config_dir / "certs"
        certs.mkdir(exist_ok=True)
        for path in (self.security.cert, self.security.key, self.security.ca):
            shutil.copyfile(path, certs / path.name)
        give_to(self.settings, n.config_dir)
        keystore = [str(home / "bin" / "elasticsearch-keystore"), "add", "--force", "--stdin", "bootstrap.password"]
        env = {**os.environ, **self._env(n)}
        run(keystore, PART, n.stdout_log, env=env, input=self.security.password, user=self.settings.es_user)

    def _env(self, n: EsNode) -> dict[str, str]:
        """What bin/elasticsearch and its tools need beside our environment: the JDK and the node's configuration."""
        return {"ES_JAVA_HOME": str(java_home(self.settings)), "ES_PATH_CONF": str(n.config_dir)}

    def _spawn(self, n: EsNode, home: Path) -> int:
        n.pid_file.unlink(missing_ok=True)
        env = self._env(n)
        cmd = [str(home / "bin" / "elasticsearch"), "-p", str(n.pid_file)]
        return spawn(cmd, n.stdout_log, n.launcher_pid_file, env, cwd=n.home, user=self.settings.es_user)
