"""The one way the ledger makes a KafkaProducer: the SDK's, the dead-letter sink's and the access log's.

`durable`: acks from every in-sync replica and idempotence (a retried send is written once; at most 5 requests
in flight keeps the order), retried until `delivery_timeout_ms` rather than a count. Not durable: one replica's
ack and no idempotence (an observation a redelivery may repeat). `timeout_ms` bounds connecting, blocking and
delivery alike. Any other keyword is KafkaProducer's own and wins over these.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer

__all__ = ["kafka_producer"]


def kafka_producer(
    *,
    bootstrap_servers: str,
    client_id: str,
    durable: bool = True,
    linger_ms: int = 5,
    timeout_ms: int | None = None,
    **config: Any,
) -> KafkaProducer:
    settings: dict[str, Any] = {"bootstrap_servers": bootstrap_servers, "client_id": client_id, "linger_ms": linger_ms}
    if durable:
        settings |= {
            "acks": "all",
            "enable_idempotence": True,
            "retries": 2**31 - 1,  # bounded in time by delivery_timeout_ms, not by count
            "max_in_flight_requests_per_connection": 5,  # <= 5 keeps order under idempotence
        }
    else:
        settings |= {"acks": 1, "enable_idempotence": False}
    if timeout_ms is not None:
        settings |= {
            "bootstrap_timeout_ms": timeout_ms,
            "max_block_ms": timeout_ms,
            "request_timeout_ms": max(500, (timeout_ms - linger_ms) // 2),
            "delivery_timeout_ms": timeout_ms,
        }
    settings |= config
    producer = KafkaProducer(**settings)
    if "allow_auto_create_topics" in settings:
        # kafka-python 3.0.12 does not pass allow_auto_create_topics on to its metadata
        # (net/manager.py builds ClusterMetadata without it): set it where it is read.
        metadata_config = getattr(getattr(producer, "_metadata", None), "config", None)
        if isinstance(metadata_config, dict):
            metadata_config["allow_auto_create_topics"] = settings["allow_auto_create_topics"]
    return producer
