"""The faust App of the projector: `make_app(settings)`.

Kept thin: raw values (the event contract decodes), in-memory store, no Tables, no
leader topic, no web server. PostgreSQL is the state, so the consumer position lives there too:
`PositionedConsumer` makes every seek "to the committed offset" go to the positions stored in
PostgreSQL instead (faust calls it after each rebalance), so what faust may have committed to
Kafka ahead of a PostgreSQL commit never matters.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Set

import faust
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

from producers.settings import Settings

__all__ = ["LedgerApp", "PositionedConsumer", "broker_url", "make_app"]

log = logging.getLogger(__name__)

PositionsHook = Callable[[Set[TP]], Awaitable[Mapping[TP, int]]]


class PositionedConsumer(AIOKafkaConsumer):
    """Seeks the ledger partitions to the PostgreSQL positions wherever faust would seek to the committed offsets."""

    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = dict(await super().seek_to_committed())
        hook: PositionsHook | None = getattr(self.app, "stored_positions", None)
        if hook is None:
            return committed
        stored = dict(await hook(self.assignment()))
        if stored:
            await self.seek_wait(stored)
            log.info("seeked to PostgreSQL positions %s", {tp.partition: o for tp, o in sorted(stored.items())})
            committed.update(stored)
        return committed


class LedgerApp(faust.App):
    """faust.App whose consumer seeks to positions from `stored_positions` (set by the agents module)."""

    stored_positions: PositionsHook | None = None

    def _new_transport(self):
        transport = super()._new_transport()
        transport.Consumer = PositionedConsumer
        return transport


def broker_url(bootstrap: str) -> str:
    return ";".join(f"kafka://{hp.strip()}" for hp in bootstrap.split(",") if hp.strip())


def make_app(settings: Settings) -> LedgerApp:
    """One App per consumer group; `stream_processors.agents.attach(app, settings)` adds the agent."""
    app = LedgerApp(
        settings.processor_group,
        broker=broker_url(settings.kafka_bootstrap),
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        autodiscover=False,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication,
        topic_disable_leader=True,  # no extra "<id>-__assignor-__leader" topic
        topic_allow_declare=False,  # the ledger topic is created by producers.topics, never by faust
        consumer_auto_offset_reset="earliest",  # only matters before the first PostgreSQL position
        broker_session_timeout=10,  # measured: ~5 s group join instead of ~30 s with the default 60 s
        broker_heartbeat_interval=3.3,
        broker_rebalance_timeout=10,
        web_enabled=False,
        web_bind="127.0.0.1",
        datadir=str(settings.data_dir / "faust" / settings.processor_group),
    )
    return app
