"""The broker configuration infra writes: the single broker's unchanged, a cluster node's replicated (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.kafka import server_properties
from infra.kafka_cluster import KafkaCluster
from producers.settings import Settings

pytestmark = pytest.mark.unit


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_the_single_broker_defaults_replicate_nothing() -> None:
    props = _props(
        server_properties(
            node_id=1,
            voters="1@127.0.0.1:9093",
            host="127.0.0.1",
            port=9092,
            controller_port=9093,
            data_dir=Path("/d"),
            partitions=6,
        )
    )
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert "min.insync.replicas" not in props and "default.replication.factor" not in props


def test_each_cluster_node_names_every_voter_and_replicates_three_times(tmp_path: Path) -> None:
    ports = [(20001, 20002), (20003, 20004), (20005, 20006)]
    cluster = KafkaCluster(Settings(development=True, data_dir=tmp_path), tmp_path / "c", ports, min_isr=2)
    assert cluster.bootstrap == "127.0.0.1:20001,127.0.0.1:20003,127.0.0.1:20005"
    for node in cluster.nodes:
        cluster._write_config(node)
        props = _props(node.config.read_text())
        assert props["node.id"] == str(node.node_id)
        assert props["controller.quorum.voters"] == "1@127.0.0.1:20002,2@127.0.0.1:20004,3@127.0.0.1:20006"
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
        assert props["log.dirs"] == str(node.data)
        assert props["offsets.topic.replication.factor"] == props["default.replication.factor"] == "3"
        assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
        assert str(node.server_log) in node.log4j.read_text()
    assert len({n.home for n in cluster.nodes}) == 3 and all(n.home.parent == tmp_path / "c" for n in cluster.nodes)
