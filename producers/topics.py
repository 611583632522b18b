"""The ledger's Kafka topics: create them idempotently (`ledger topics`), read their end offsets, probe a broker.

The ledger is the only source of truth, so its topic keeps every record forever
(`retention.ms=-1`, `retention.bytes=-1`) and must exist with the configured
partition count *before* anything is written: producers never rely on the
broker auto-creating it with default settings. Running this twice is harmless;
an existing topic is reported and left untouched (changing the partition count
of a live ledger would re-route keys and break per-subject order).

`end_offsets(settings)` is what "caught up" is measured against (the API's lag, a rebuild's
target, the benchmark's and the tests' waits); `probe(settings)` is the health check of the brokers. Every client
here connects with `kafka_connection(settings)`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from producers.contract import MAX_EVENT_BYTES
from producers.kafka_producer import kafka_connection
from producers.settings import Settings

__all__ = ["TopicStatus", "end_offsets", "ensure_topics", "probe", "topic_configs"]

log = logging.getLogger(__name__)

# Room for a maximal event (contract.MAX_EVENT_BYTES) plus key, headers and batch overhead,
# and equal to the producer's default max_request_size so a batch never outgrows the topic.
MAX_MESSAGE_BYTES = 1024 * 1024
assert MAX_MESSAGE_BYTES > MAX_EVENT_BYTES


@dataclass(frozen=True)
class TopicStatus:
    name: str
    created: bool  # False: it already existed and was left as it is
    partitions: int


def topic_configs(replication: int) -> dict[str, str]:
    """Unlimited retention, delete policy (never compaction: every event matters), bounded records, the broker's
    clock on every record."""
    return {
        "cleanup.policy": "delete",
        # a record's timestamp is the ledger's time, not a producer's: the default observed_at and the reference of
        # the clock-skew window, and what orders an erasure against its subject's records in other partitions
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
        # with acks=all, a write is durable on this many replicas; 1 on a single-broker setup
        "min.insync.replicas": str(min(2, max(1, replication - 1))),
    }


def ensure_topics(settings: Settings, *, timeout_s: float = 30.0) -> list[TopicStatus]:
    """Create `settings.topic`, `settings.dlq_topic` and `settings.access_topic` (recall's accesses)
    unless they exist; wait until all have leaders. The access topic has the ledger's configuration: it is the
    source of the access projection, which a rebuild replays from offset 0."""
    timeout_ms = int(timeout_s * 1000)
    names = [settings.topic, settings.dlq_topic, settings.access_topic]
    spec = {
        name: {
            "num_partitions": settings.topic_partitions,
            "replication_factor": settings.topic_replication,
            "configs": topic_configs(settings.topic_replication),
        }
        for name in names
    }
    admin = KafkaAdminClient(
        **kafka_connection(settings),
        client_id="memory-ledger-topics",
        bootstrap_timeout_ms=timeout_ms,
        request_timeout_ms=timeout_ms,
    )
    try:
        response = admin.create_topics(spec, timeout_ms=timeout_ms, raise_errors=False)
        created: set[str] = set()
        for topic in response["topics"]:
            error = Errors.for_code(topic["error_code"])
            if error is Errors.NoError:
                created.add(topic["name"])
            elif error is not Errors.TopicAlreadyExistsError:
                raise error(f"creating topic {topic['name']!r}: {topic.get('error_message') or error.__name__}")
        admin.wait_for_topics(names, timeout_ms=timeout_ms)
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(names)}
        if settings.topic not in created:
            _warn_producer_clock(admin, settings.kafka_bootstrap, settings.topic)
    finally:
        admin.close()
    out = [TopicStatus(name, name in created, described[name]) for name in names]
    for status in out:
        if not status.created and status.partitions != settings.topic_partitions:
            log.warning(
                "topic %s exists with %d partitions (settings ask for %d); left unchanged",
                status.name,
                status.partitions,
                settings.topic_partitions,
            )
    return out


_WARNED: set[tuple[str, str]] = set()  # (bootstrap, topic): said once a process (every client start ensures topics)


def _warn_producer_clock(admin: KafkaAdminClient, bootstrap: str, topic: str) -> None:
    """Say so, once, when an existing ledger topic stamps records with the producer's clock; it is left as it is (a
    topic a ledger was copied into keeps its source's times on purpose)."""
    if (bootstrap, topic) in _WARNED:
        return
    try:  # `all`: the value in force, also when it is the broker's default and not the topic's own
        asked = ConfigResource(ConfigResourceType.TOPIC, topic, ["message.timestamp.type"])
        kind = admin.describe_configs([asked], config_filter="all")["topic"][topic]["message.timestamp.type"]["value"]
    except Exception as exc:  # noqa: BLE001 - a report, not a condition of starting (asked again next time)
        log.info("could not read the configuration of topic %s: %s", topic, exc)
        return
    _WARNED.add((bootstrap, topic))
    if kind != "LogAppendTime":
        log.warning(
            "warning: topic %s stamps records with the producer's clock (%s) and is left as it is; for the "
            "broker's: kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s "
            "--add-config message.timestamp.type=LogAppendTime (docs/deploy.md)",
            topic,
            kind,
            bootstrap,
            topic,
        )


class EndOffsetReader:
    """`end_offsets` with one KafkaConsumer kept open between calls (for the API's /v1/stats).

    A new consumer per call costs a bootstrap and a metadata round trip, far more than a reused one.
    KafkaConsumer is not thread-safe, so calls are serialised by a lock; after a failure the
    consumer is closed and the next call starts a fresh one (a broker that came back is found again).
    """

    def __init__(self, settings: Settings, timeout_s: float) -> None:
        self.settings, self.timeout_s = settings, timeout_s
        self._lock = threading.Lock()
        self._consumer: KafkaConsumer | None = None

    def read(self, topic: str | None = None) -> dict[int, int]:
        with self._lock:
            if self._consumer is None:
                timeout_ms = max(1000, int(self.timeout_s * 1000))
                self._consumer = KafkaConsumer(
                    **kafka_connection(self.settings),
                    group_id=None,
                    enable_auto_commit=False,
                    bootstrap_timeout_ms=timeout_ms,
                    request_timeout_ms=timeout_ms,
                )
            try:
                return end_offsets(self.settings, topic, consumer=self._consumer)
            except BaseException:
                self._drop()
                raise

    def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(timeout_ms=1000)
            except Exception:  # noqa: BLE001 - closing a consumer that already failed: the failure was raised
                log.debug("closing a failed end-offset consumer", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._drop()


def end_offsets(
    settings: Settings,
    topic: str | None = None,
    *,
    timeout_s: float | None = None,
    consumer: KafkaConsumer | None = None,
) -> dict[int, int]:
    """partition -> the offset the next record of `topic` (default: the ledger topic) will get.

    `timeout_s` bounds every broker wait (None: kafka-python's defaults). A caller that reads the
    offsets repeatedly passes its own `consumer` (no group), which is reused and left open.
    """
    topic = topic or settings.topic
    own = consumer is None
    if consumer is None:
        bounds = {}
        if timeout_s is not None:
            timeout_ms = max(1000, int(timeout_s * 1000))
            bounds = {"bootstrap_timeout_ms": timeout_ms, "request_timeout_ms": timeout_ms}
        consumer = KafkaConsumer(**kafka_connection(settings), group_id=None, enable_auto_commit=False, **bounds)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()} if tps else {}
    finally:
        if own:
            consumer.close()


def probe(settings: Settings, timeout: float = 5.0) -> bool:
    """Does a broker of `settings.kafka_bootstrap` answer a metadata request within `timeout` seconds (connected as
    every client is: a broker that refuses the credentials does not answer)?

    The admin client runs in a daemon thread: kafka-python can block without limit on a
    broker that is half up, and a health probe must never hang its caller.
    """
    result: list[bool] = []

    def ask() -> None:
        try:
            wait_ms = max(1000, int(timeout * 1000))  # the thread ends within about twice its caller's wait
            admin = KafkaAdminClient(
                **kafka_connection(settings), request_timeout_ms=wait_ms, bootstrap_timeout_ms=wait_ms
            )
        except Exception as exc:  # noqa: BLE001  # any failure to reach one (a setting too) is the answer no
            log.debug("kafka probe: %s: %s", type(exc).__name__, exc)
            return
        try:
            admin.list_topics()
            result.append(True)
        except Exception as exc:  # noqa: BLE001  # as above: also after the caller stopped waiting, never a crash
            log.debug("kafka probe: %s: %s", type(exc).__name__, exc)
        finally:
            admin.close()

    thread = threading.Thread(target=ask, name="kafka-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result)
