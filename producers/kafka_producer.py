"""How every Kafka client of the ledger connects (`kafka_connection`), and the one way it makes a KafkaProducer: the
SDK's, the dead-letter sink's and the access log's.

`kafka_connection(settings)` is the bootstrap servers and the security keywords (TLS, SASL) that every
KafkaProducer, KafkaConsumer and KafkaAdminClient is built with, so a managed cluster's credentials are given once,
in the settings (the worker's faust app takes the same: stream_processors.app.broker_credentials). With SASL
configured, `kafka_connection` also corrects the two places where kafka-python 3.0.12 loses a broker's refusal of a
login (below), so a wrong password fails at once with the broker's reason instead of a bootstrap timeout.

`durable`: acks from every in-sync replica and idempotence (a retried send is written once; at most 5 requests
in flight keeps the order), retried until `delivery_timeout_ms` rather than a count. Not durable: one replica's
ack and no idempotence (an observation a redelivery may repeat). `timeout_ms` bounds connecting, blocking and
delivery alike. Any other keyword is KafkaProducer's own and wins over these.
"""

from __future__ import annotations

import ssl
from typing import Any

import kafka.errors as Errors
from kafka import KafkaProducer
from kafka.net import transport as _transport
from kafka.net.connection import KafkaConnection

from producers.settings import Settings

__all__ = ["kafka_connection", "kafka_producer", "kafka_ssl_context"]


def _last_bytes_before_eof(cls: type) -> None:
    """kafka-python 3.0.12 drops the bytes it read together with the peer's close (`_sock_recv` returns them with
    the disconnect, and the read loop aborts before handing them on). A broker refusing a SASL login answers why
    and then closes: without this the client sees only "socket disconnected" and retries until its bootstrap
    timeout. Here the bytes are handed on first; the next read sees the close again (a closed socket stays
    readable), so nothing else changes."""
    original = cls.__dict__["_sock_recv"]
    if getattr(original, "_ledger_patched", False):
        return

    def _sock_recv(self: Any) -> tuple[bytes, Exception | None]:
        data, err = original(self)
        return (data, None) if data and err is not None else (data, err)

    _sock_recv._ledger_patched = True  # type: ignore[attr-defined]
    cls._sock_recv = _sock_recv  # type: ignore[attr-defined]


def _raise_refused_login() -> None:
    """kafka-python 3.0.12 means a refused SASL login to end a connection attempt (it then raises that error to the
    client instead of retrying: KafkaConnectionManager._connect), but `KafkaConnection.initialize` only records it
    on the connection, so a bootstrap retries a wrong password until its timeout and ends "Unable to bootstrap".
    Here `initialize` raises what refused the login, as `_connect` expects."""
    original = KafkaConnection.initialize
    if getattr(original, "_ledger_patched", False):
        return

    async def initialize(self: KafkaConnection, timeout_at: float | None = None) -> None:
        await original(self, timeout_at)
        failure = self.init_future.exception
        if isinstance(failure, (Errors.SaslAuthenticationFailedError, Errors.AuthorizationError)):
            raise failure

    initialize._ledger_patched = True  # type: ignore[attr-defined]
    KafkaConnection.initialize = initialize  # type: ignore[method-assign]


def _correct_sasl_refusals() -> None:
    """Both corrections, once, in a process that logs in with SASL (PLAINTEXT and TLS-only clients keep
    kafka-python exactly as it is)."""
    for cls in (_transport.KafkaTCPTransport, _transport.KafkaSSLTransport):
        _last_bytes_before_eof(cls)
    _raise_refused_login()


def kafka_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of SSL and SASL_SSL (None without TLS): the server's certificate and host name checked against
    `kafka_ssl_cafile` (the system's CAs when unset), and the client's certificate when one is configured."""
    if not settings.kafka_security_protocol.endswith("SSL"):
        return None
    cafile = str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile is not None else None
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.kafka_ssl_certfile is not None:
        keyfile = str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile is not None else None
        context.load_cert_chain(str(settings.kafka_ssl_certfile), keyfile)
    return context


def kafka_connection(settings: Settings) -> dict[str, Any]:
    """The keywords that connect a kafka-python client (KafkaProducer, KafkaConsumer, KafkaAdminClient) to the
    configured brokers: `bootstrap_servers` and the security settings. The password is in the clear here, as the
    client needs it: pass the mapping to a client, never to a log."""
    config: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "security_protocol": settings.kafka_security_protocol,
    }
    context = kafka_ssl_context(settings)
    if context is not None:
        config["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL_"):
        assert settings.kafka_sasl_password is not None  # KafkaSettings refuses SASL without it
        _correct_sasl_refusals()
        config |= {
            "sasl_mechanism": settings.kafka_sasl_mechanism,  # kafka-python takes SCRAM's user and password here too
            "sasl_plain_username": settings.kafka_sasl_username,
            "sasl_plain_password": settings.kafka_sasl_password.get_secret_value(),
        }
    return config


def kafka_producer(
    settings: Settings,
    *,
    client_id: str,
    durable: bool = True,
    linger_ms: int = 5,
    timeout_ms: int | None = None,
    **config: Any,
) -> KafkaProducer:
    """A KafkaProducer on `settings`' brokers (`kafka_connection`) with `client_id`."""
    chosen: dict[str, Any] = {**kafka_connection(settings), "client_id": client_id, "linger_ms": linger_ms}
    if durable:
        chosen |= {
            "acks": "all",
            "enable_idempotence": True,
            "retries": 2**31 - 1,  # bounded in time by delivery_timeout_ms, not by count
            "max_in_flight_requests_per_connection": 5,  # <= 5 keeps order under idempotence
        }
    else:
        chosen |= {"acks": 1, "enable_idempotence": False}
    if timeout_ms is not None:
        chosen |= {
            "bootstrap_timeout_ms": timeout_ms,
            "max_block_ms": timeout_ms,
            "request_timeout_ms": max(500, (timeout_ms - linger_ms) // 2),
            "delivery_timeout_ms": timeout_ms,
        }
    chosen |= config
    producer = KafkaProducer(**chosen)
    if "allow_auto_create_topics" in chosen:
        # kafka-python 3.0.12 does not pass allow_auto_create_topics on to its metadata
        # (net/manager.py builds ClusterMetadata without it): set it where it is read.
        metadata_config = getattr(getattr(producer, "_metadata", None), "config", None)
        if isinstance(metadata_config, dict):
            metadata_config["allow_auto_create_topics"] = chosen["allow_auto_create_topics"]
    return producer
