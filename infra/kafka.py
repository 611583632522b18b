"""Apache Kafka 4.x in KRaft mode (one broker+controller), from the Maven Central jars."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from infra.maven import copy_dependencies, fetch_artifact
from infra.procs import (
    InfraError,
    already_up,
    healthy_or_stopped,
    owned_pid,
    port_open,
    run,
    spawn,
    stop_owned,
)
from producers.settings import Settings
from producers.topics import probe

PART = "kafka"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
# the command-line clients (org.apache.kafka.tools.ConsoleProducer, ...: docs/other-languages.md), without their
# dependencies: the broker's jars are the rest of their classpath (kafka-tools' own tree adds ~40 MB of Connect,
# Jetty and Jersey that the console clients never load)
TOOLS_ARTIFACT = "org.apache.kafka:kafka-tools:{version}"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>memory-ledger</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{version}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>2.0.17</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>2.25.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>2.25.3</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def _paths(s: Settings) -> dict[str, Path]:
    base = s.data_dir / "kafka"
    return {
        "libs": s.cache_dir / f"kafka-{s.kafka_version}" / "libs",
        "work": s.cache_dir / f"kafka-{s.kafka_version}" / "resolve",
        "config": base / "server.properties",
        "log4j": base / "log4j2.properties",
        "data": base / "data",
        "log": s.log_dir / "kafka.log",
        "server_log": s.log_dir / "kafka-server.log",
        "pid": s.run_dir / "kafka.pid",
    }


def _java(s: Settings) -> str:
    if s.java_home:
        return str(s.java_home / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise InfraError(PART, "no `java` on PATH (Kafka 4 needs Java 17+); set LEDGER_JAVA_HOME")
    return java


def install(s: Settings) -> None:
    """Resolve the broker jars once into the download cache, and the command-line clients' jar beside them."""
    p = _paths(s)
    marker = p["libs"] / ".complete"
    if not marker.exists():
        if p["libs"].exists():
            shutil.rmtree(p["libs"])
        copy_dependencies(_POM.format(version=s.kafka_version), p["work"], p["libs"], PART, p["log"])
        marker.write_text("ok\n")
    _install_tools(s)


def _install_tools(s: Settings) -> None:
    """Add the kafka-tools jar beside the broker's (also into a cache resolved before it was needed); additive only."""
    p = _paths(s)
    jar = p["libs"] / f"kafka-tools-{s.kafka_version}.jar"
    if jar.exists():
        return
    source = fetch_artifact(TOOLS_ARTIFACT.format(version=s.kafka_version), PART, p["log"])
    partial = jar.with_suffix(".jar.part")  # not *.jar: a half-copied file never lands on a classpath
    shutil.copyfile(source, partial)
    partial.rename(jar)


def tools_classpath(s: Settings) -> str:
    """The `java -cp` value for Kafka's command-line clients (ConsoleProducer, ...), installing what is missing."""
    install(s)
    return str(_paths(s)["libs"] / "*")


def server_properties(
    *,
    node_id: int,
    voters: str,
    host: str,
    port: int,
    controller_port: int,
    data_dir: Path,
    partitions: int,
    replication: int = 1,
    min_isr: int = 1,
    listener: str = "PLAINTEXT",
    extra: Sequence[str] = (),
) -> str:
    """server.properties of one KRaft node (broker and controller in one process).

    The defaults are the single-broker stack's; `infra.kafka_cluster` passes a node id, the voters of
    the quorum, the internal topics' replication and `extra` lines for each node of a cluster. `listener`: the
    security protocol of the clients' (and the brokers') listener, e.g. SASL_PLAINTEXT with its SASL lines in `extra`;
    the controllers always talk PLAINTEXT among themselves, on loopback.
    """
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners={listener}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            f"advertised.listeners={listener}://{host}:{port}",
            "controller.listener.names=CONTROLLER",
            f"inter.broker.listener.name={listener}",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{listener}:{listener}",
            f"log.dirs={data_dir}",
            f"num.partitions={partitions}",
            f"offsets.topic.replication.factor={replication}",
            "offsets.topic.num.partitions=6",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min_isr}",
            f"share.coordinator.state.topic.replication.factor={replication}",
            f"share.coordinator.state.topic.min.isr={min_isr}",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.retention.hours=-1",
            "message.max.bytes=10485760",
            *extra,
            "",
        ]
    )


def log4j_properties(log: Path) -> str:
    """The broker's log4j2 configuration: everything to one file."""
    return _LOG4J2.format(log=log)


def _write_config(s: Settings) -> None:
    p = _paths(s)
    host, port = s.kafka_host_port
    p["config"].parent.mkdir(parents=True, exist_ok=True)
    p["config"].write_text(
        server_properties(
            node_id=1,
            voters=f"1@{host}:{s.kafka_controller_port}",
            host=host,
            port=port,
            controller_port=s.kafka_controller_port,
            data_dir=p["data"],
            partitions=s.topic_partitions,
        )
    )
    p["log4j"].write_text(log4j_properties(p["server_log"]))


def java_command(s: Settings, main: str, *args: str, heap: str = "256m", log4j: Path | None = None) -> list[str]:
    """`java ... main args` on the broker's classpath; `log4j`: another node's configuration (default: ours)."""
    p = _paths(s)
    return [
        _java(s),
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j or p['log4j']}",
        "-cp",
        str(p["libs"] / "*"),
        main,
        *args,
    ]


def _format_storage(s: Settings) -> None:
    p = _paths(s)
    if (p["data"] / "meta.properties").exists():
        return
    p["data"].mkdir(parents=True, exist_ok=True)
    cluster_id = uuid.uuid4().hex[:22]
    run(java_command(s, STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(p["config"])), PART, p["log"])


def pid(s: Settings) -> int | None:
    return owned_pid(_paths(s)["pid"], MAIN_CLASS)


def healthy(s: Settings) -> bool:
    """The broker answers a metadata request."""
    host, port = s.kafka_host_port
    return port_open(host, port) and probe(s)


def start(s: Settings, timeout: float = 120.0) -> None:
    p = _paths(s)
    if already_up(PART, lambda: pid(s), lambda: healthy(s), s.kafka_host_port, timeout, p["server_log"]):
        return
    install(s)
    _write_config(s)
    _format_storage(s)
    spawn(java_command(s, MAIN_CLASS, str(p["config"]), heap=s.kafka_heap), p["log"], p["pid"])
    healthy_or_stopped(lambda: healthy(s), PART, timeout, p["server_log"], lambda: pid(s) is not None, lambda: stop(s))


def stop(s: Settings) -> bool:
    return stop_owned(_paths(s)["pid"], MAIN_CLASS)


def describe(s: Settings) -> dict[str, str]:
    p = _paths(s)
    return {"address": s.kafka_bootstrap, "log": str(p["server_log"]), "data": str(p["data"])}
