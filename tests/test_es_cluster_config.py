"""The Elasticsearch configuration infra writes and the settings of a cluster (no server): the single node's
unchanged, each cluster node's its own, the node list of LEDGER_ES_URL reaching every client, replicas in new
indices only when asked; and how a local cluster (Kafka's and Elasticsearch's) starts, kills, stops and removes its
nodes, on stand-in processes."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import pytest

from infra.elasticsearch import node_config
from infra.es_cluster import EsCluster
from infra.kafka_cluster import KafkaCluster
from infra.procs import InfraError, pid_alive, spawn
from producers.settings import Settings
from projections.search.client import async_es_client, es_client, nodes
from projections.search.mapping import index_body

pytestmark = pytest.mark.unit


def _yml(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines() if line)


def test_the_single_node_stays_a_single_node() -> None:
    yml = _yml(
        node_config(
            cluster="memory-ledger",
            node="ledger-node-1",
            host="127.0.0.1",
            http_port=9200,
            transport="9300-9400",
            data=Path("/d"),
            logs=Path("/l"),
            discovery=["discovery.type: single-node"],
        )
    )
    assert yml["discovery.type"] == "single-node" and yml["http.port"] == "9200" and yml["path.data"] == "/d"
    assert "discovery.seed_hosts" not in yml and "cluster.initial_master_nodes" not in yml


def test_each_cluster_node_has_its_own_ports_folders_and_heap_and_seeds_every_node(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "config" / "jvm.options.d").mkdir(parents=True)
    (home / "config" / "jvm.options").write_text("-XX:+UseG1GC\n")
    (home / "config" / "elasticsearch.yml").write_text("discovery.type: single-node\n")  # the single node's
    ports = [(21001, 21002), (21003, 21004), (21005, 21006)]
    cluster = EsCluster(Settings(development=True, data_dir=tmp_path), tmp_path / "c", ports, heap="512m")
    assert cluster.url == "http://127.0.0.1:21001,http://127.0.0.1:21003,http://127.0.0.1:21005"
    for node in cluster.nodes:
        cluster._configure(node, home, bootstrap=True)
        yml = _yml(node.config_dir.joinpath("elasticsearch.yml").read_text())
        assert yml["cluster.name"] == "ledger-c" and yml["node.name"] == node.name
        assert (yml["http.port"], yml["transport.port"]) == (str(node.http_port), str(node.transport_port))
        assert yml["discovery.seed_hosts"] == '["127.0.0.1:21002", "127.0.0.1:21004", "127.0.0.1:21006"]'
        assert yml["cluster.initial_master_nodes"] == "[node-1, node-2, node-3]"
        assert "discovery.type" not in yml
        assert (yml["path.data"], yml["path.logs"]) == (str(node.data), str(node.logs))
        heap = node.config_dir.joinpath("jvm.options.d", "heap.options").read_text().split()
        assert heap == ["-Xms512m", "-Xmx512m", f"-Dledger.es.node={node.home}"]
        assert node.config_dir.joinpath("jvm.options").read_text() == "-XX:+UseG1GC\n"  # the zip's, copied
    # started again, a node joins the cluster it knows: bootstrapping it again would be refused
    cluster._configure(cluster.node(2), home, bootstrap=False)
    assert "cluster.initial_master_nodes" not in _yml(
        cluster.node(2).config_dir.joinpath("elasticsearch.yml").read_text()
    )
    assert (home / "config" / "elasticsearch.yml").read_text() == "discovery.type: single-node\n"  # untouched
    assert len({n.home for n in cluster.nodes}) == 3 and all(n.home.parent == tmp_path / "c" for n in cluster.nodes)


def test_a_list_of_nodes_reaches_every_client() -> None:
    s = Settings(development=True, es_url=" http://10.0.0.1:9200, http://10.0.0.2:9201 ,")
    assert s.es_urls == ["http://10.0.0.1:9200", "http://10.0.0.2:9201"]
    assert s.es_host_port == ("10.0.0.1", 9200)
    assert Settings(development=True).es_urls == ["http://127.0.0.1:9200"]
    assert nodes(s.es_url) == nodes(s.es_urls) == s.es_urls
    with es_client(s.es_url, request_timeout=1) as es:
        assert sorted(n.base_url for n in es.transport.node_pool.all()) == s.es_urls

    async def api_client_nodes() -> list[str]:  # the API's client
        async with async_es_client(s.es_url, request_timeout=1) as aes:
            return sorted(n.base_url for n in aes.transport.node_pool.all())

    assert asyncio.run(api_client_nodes()) == s.es_urls


def test_new_indices_have_replicas_only_when_the_settings_ask() -> None:
    assert Settings(development=True).es_replicas == 0
    assert index_body(4)["settings"]["number_of_replicas"] == 0
    assert index_body(4, replicas=Settings(development=True, es_replicas=1).es_replicas)["settings"] == {
        **index_body(4)["settings"],
        "number_of_replicas": 1,
    }
    with pytest.raises(ValueError, match="es_replicas"):
        Settings(development=True, es_replicas=-1)


def _stand_in(pid_file: Path, *marks: str) -> int:
    """A process that carries `marks` on its command line as a node's would, its pid in `pid_file` (no server)."""
    return spawn([sys.executable, "-c", "import time; time.sleep(120)", *marks], pid_file.with_suffix(".log"), pid_file)


@pytest.mark.parametrize("kind", ["kafka", "elasticsearch"])
def test_a_cluster_kills_one_node_stops_the_rest_and_removes_its_folder(tmp_path: Path, kind: str) -> None:
    settings, base = Settings(development=True, data_dir=tmp_path), tmp_path / "c"
    ports = [(22001, 22002), (22003, 22004), (22005, 22006)]
    cluster: KafkaCluster | EsCluster
    if kind == "kafka":
        cluster = KafkaCluster(settings, base, ports)
        for n in cluster.nodes:
            n.home.mkdir(parents=True)
            _stand_in(n.pid_file, str(n.config))
    else:
        cluster = EsCluster(settings, base, ports)
        for n in cluster.nodes:
            n.home.mkdir(parents=True)
            _stand_in(n.pid_file, n.marker)
            _stand_in(n.launcher_pid_file, "bin/elasticsearch")
    pids = {n_id: [pid for _, pid in cluster.processes(cluster.node(n_id))] for n_id in (1, 2, 3)}
    assert all(None not in p for p in pids.values()), pids

    assert cluster.kill(2) == pids[2][0]
    assert not any(pid_alive(p) for p in pids[2]) and cluster.pid(2) is None  # its launcher went with it
    assert all(not f.exists() for f, _ in cluster.processes(cluster.node(2)))
    with pytest.raises(InfraError, match="not running"):
        cluster.kill(2)
    with pytest.raises(InfraError, match="running cluster"):
        cluster.remove()
    assert base.exists()
    cluster.stop(timeout=5)
    assert not any(pid_alive(p) for ps in pids.values() for p in ps)
    cluster.remove()
    assert not base.exists()


def _stand_in_cluster(
    kind: str, settings: Settings, base: Path, ports: list[tuple[int, int]]
) -> KafkaCluster | EsCluster:
    """A cluster of `kind` whose nodes are stand-ins (node 2's exits at once) and never healthy."""

    class StandIns(KafkaCluster if kind == "kafka" else EsCluster):
        def launch_all(self) -> None:
            for n in self.nodes:
                n.home.mkdir(parents=True)
                mark = str(n.config) if kind == "kafka" else n.marker
                code = "pass" if n.node_id == 2 else "import time; time.sleep(120)"
                spawn([sys.executable, "-c", code, mark], n.stdout_log, n.pid_file)

        def healthy(self) -> bool:
            return False

    return StandIns(settings, base, ports)


@pytest.mark.parametrize("kind", ["kafka", "elasticsearch"])
def test_a_cluster_starts_on_free_ports_only_and_fails_at_once_when_a_node_exits(tmp_path: Path, kind: str) -> None:
    settings, base = Settings(development=True, data_dir=tmp_path), tmp_path / "c"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = [(23001, 23002), (23003, port), (23005, 23006)]
        cluster = _stand_in_cluster(kind, settings, base, ports)
        with pytest.raises(InfraError, match=f"port {port} \\(node 2\\) is already taken"):
            cluster.start(timeout=60)
        assert not base.exists(), "nothing is installed or started on a taken port"

    cluster = _stand_in_cluster(kind, settings, base, [(23001, 23002), (23003, 23004), (23005, 23006)])
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="exited before it became healthy"):
        cluster.start(timeout=60)
    assert time.monotonic() - t0 < 10, "a node that exited is seen at once, not at the timeout"
    assert not any(cluster.alive(n) for n in cluster.nodes), "the nodes still running are stopped"
    with pytest.raises(InfraError, match="exited before it became answering \\(node 2\\)"):
        cluster.wait_node(2, lambda: False, "answering", timeout=60)  # a node started again that exits
    assert time.monotonic() - t0 < 20
    cluster.remove()
