"""The faust App of the projector: `make_app(settings)`.

Kept thin: raw values (the event contract decodes), in-memory store, no Tables, no
leader topic, no web server. PostgreSQL is the state, so the consumer position lives there too:
`PositionedConsumer` makes every seek "to the committed offset" go to the positions stored in
PostgreSQL instead (faust calls it after each rebalance), so what faust may have committed to
Kafka ahead of a PostgreSQL commit never matters. Its drain loop hands each fetched batch over under one race
against a rebalance instead of one per record (`PositionedConsumer._drain_messages`). The agents take natural
batches (`take_ready`): what arrived while the batch before was applied, never held back to fill.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Set
from typing import Any

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP, EventT, Message, StreamT

from producers.kafka_producer import kafka_connection
from producers.settings import Settings

__all__ = ["LedgerApp", "PositionedConsumer", "RawSchema", "broker_credentials", "broker_url", "make_app", "take_ready"]

log = logging.getLogger(__name__)

PositionsHook = Callable[[Set[TP]], Awaitable[Mapping[TP, int]]]


YIELD_EVERY = 100  # records handed over between two yields to the event loop (faust's own number)


class RawSchema(faust.Schema):
    """A topic's records as the log holds them: the agents read `event.message` and their projection judges the
    bytes (its `decoder`), so faust's codecs (the "raw" serializer's registry lookups, per key and value) are
    skipped."""

    def compile(self, app: Any, *, default_propagate: bool = False, **_: Any) -> Any:
        create_event = app.create_event

        async def decode(message: Message, *, propagate: bool = default_propagate) -> Any:
            return create_event(message.key, message.value, message.headers, message)

        return decode


class PositionedConsumer(AIOKafkaConsumer):
    """Seeks the ledger partitions to the PostgreSQL positions wherever faust would seek to the committed offsets."""

    async def _drain_messages(self, fetcher: Any) -> None:
        """faust's drain loop (`Consumer._drain_messages`, faust-streaming 0.15), one race per fetched batch.

        faust races the hand-over of every record against the flow being suspended (a rebalance), the consumer
        stopping and a crash: four tasks made and cancelled per record, more CPU than the record's own
        projection. Here the same race covers the hand-over of the rest of a fetched batch: when the flow is
        suspended, the record being handed over and the batch's rest are dropped, as faust drops them (its
        `getmany` stops yielding once the flow is not active), so each partition still gets a run of records
        without holes from each seek, and the stored positions never skip a record. The fetch itself is waited
        for outside the race, as faust does.
        """
        callback = self.callback
        stopping = self._stopped.is_set
        fetcher_stopping = fetcher._stopped.is_set
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for

        async def hand_over(first: tuple[TP, Message], rest: AsyncIterator[tuple[TP, Message]]) -> None:
            n = 0
            item: tuple[TP, Message] | None = first
            while item is not None:
                tp, message = item
                n += 1
                if n > YIELD_EVERY:
                    await asyncio.sleep(0)
                    n = 0
                offset = message.offset
                r_offset = read_offset.get(tp)
                if r_offset is None or offset >= r_offset:
                    if offset - (r_offset or 0) > 1 and r_offset and acks_enabled_for(message.topic):
                        await self._add_gap(tp, r_offset + 1, offset)  # a hole in the offsets: acked as read
                    if self._commit_every is not None and self._n_acked >= self._commit_every:
                        self._n_acked = 0
                        await self.commit()
                    await callback(message)
                    read_offset[tp] = offset
                item = await anext(rest, None)

        try:
            while not (stopping() or fetcher_stopping()):
                self.diag.set_flag(CONSUMER_FETCHING)
                batch = self.getmany(timeout=1.0)
                await self.sleep(0)  # getmany may return at once, again and again: let the loop run
                if not self.should_stop:
                    first = await anext(batch, None)
                    if first is not None:
                        await self.wait_first(hand_over(first, batch), self.suspend_flow.wait())
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

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


SETTLE_TURNS = 2  # loop turns in a row without a new record that end a batch's gathering (take_ready)
IDLE_CHECK_S = 1.0  # an idle take_ready looks again this often, as the drain loop's fetch does (getmany)


async def take_ready(stream: StreamT, max_: int) -> AsyncGenerator[list[EventT], None]:
    """faust's `Stream.take_events` (faust-streaming 0.15) with natural batching: a batch is what has arrived by
    the time the one before it is applied, never held back to fill.

    faust's `take_events` yields when `max_` records are buffered or `within` seconds have passed, so at a low rate
    every record waited for the window (half of it on average) before PostgreSQL saw it. Here a batch is cut as
    soon as the records already fetched are buffered: the first record wakes the loop, which lets the consumer
    hand over the rest of its fetch (until `SETTLE_TURNS` loop turns add nothing) and yields. Under a backlog the
    buffer fills to `max_` as before (the records wait in faust's queue while a batch is applied); at a low rate a
    record waits for one batch at most, not for a window. Acks as faust's: each record once its batch was consumed.
    """
    events: list[EventT] = []
    arrived, full, consumed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    consuming: asyncio.Future[None] | None = None

    async def add_to_buffer(value: Any) -> Any:
        nonlocal consuming
        try:
            if consuming is not None:  # a batch is being applied: nothing joins it
                try:
                    await consuming
                finally:
                    consuming = None
            event = stream.current_event
            if event is None:
                raise RuntimeError("take_ready found current_event None")
            events.append(event)
            arrived.set()
            if len(events) >= max_:
                full.set()
                consumed.clear()
                await stream.wait(consumed)  # a batch holds `max_` records at most
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - as faust's take: the stream crashes, the agent with it
            log.exception("adding to the batch failed: %r", exc)
            await stream.crash(exc)
        return value

    acks_before = stream.enable_acks
    stream.enable_acks = False  # acked here, once a batch is consumed
    stream.add_processor(add_to_buffer)
    stream._enable_passive(aiter(stream.channel))
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(arrived, timeout=IDLE_CHECK_S)
            if not events:
                continue
            quiet, size = 0, len(events)
            while quiet < SETTLE_TURNS and not full.is_set() and not stream.should_stop:
                await asyncio.sleep(0)
                quiet, size = (quiet + 1, size) if len(events) == size else (0, len(events))
            consuming = asyncio.get_running_loop().create_future()
            try:
                yield list(events)
            finally:
                done = list(events)
                events.clear()
                arrived.clear()
                for event in done:
                    await stream.ack(event)
                if not consuming.done():
                    consuming.set_result(None)
                full.clear()
                consumed.set()
    finally:
        stream.enable_acks = acks_before
        stream._processors.remove(add_to_buffer)


class LedgerApp(faust.App):
    """faust.App whose consumer seeks to positions from `stored_positions` (set by the agents module)."""

    stored_positions: PositionsHook | None = None

    def _new_transport(self):
        transport = super()._new_transport()
        transport.Consumer = PositionedConsumer
        return transport


def broker_url(bootstrap: str) -> str:
    return ";".join(f"kafka://{hp.strip()}" for hp in bootstrap.split(",") if hp.strip())


def broker_credentials(settings: Settings) -> faust.types.auth.CredentialsT | None:
    """faust's form of `kafka_connection(settings)`: the same TLS context and SASL user (None: plaintext)."""
    config = kafka_connection(settings)
    context = config.get("ssl_context")
    if "sasl_mechanism" in config:  # faust picks SASL_SSL when given a context, SASL_PLAINTEXT without
        return faust.SASLCredentials(
            username=config["sasl_plain_username"],
            password=config["sasl_plain_password"],
            mechanism=config["sasl_mechanism"],
            ssl_context=context,
        )
    return faust.SSLCredentials(context) if context is not None else None


def make_app(settings: Settings) -> LedgerApp:
    """One App per consumer group; `stream_processors.agents.attach(app, settings)` adds the agent."""
    app = LedgerApp(
        settings.processor_group,
        broker=broker_url(settings.kafka_bootstrap),
        broker_credentials=broker_credentials(settings),
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        autodiscover=False,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication,
        topic_disable_leader=True,  # no extra "<id>-__assignor-__leader" topic
        topic_allow_declare=False,  # the ledger topic is created by producers.topics, never by faust
        consumer_auto_offset_reset="earliest",  # only matters before the first PostgreSQL position
        broker_session_timeout=10,  # a group join in seconds, not the half minute the default 60 s gives
        broker_heartbeat_interval=3.3,
        broker_rebalance_timeout=10,
        web_enabled=False,
        web_bind="127.0.0.1",
        datadir=str(settings.data_dir / "faust" / settings.processor_group),
    )
    return app
