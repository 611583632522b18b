"""The Python SDK every service uses to write to the ledger (kafka-python underneath).

Usage::

    from producers.settings import get_publisher_settings
    from producers.sdk import LedgerProducer, PublishError

    with LedgerProducer(get_publisher_settings()) as ledger:
        r = ledger.assert_fact(
            "acme", "project:P1", "project.port", 8080, "Project P1's backend listens on port 8080",
            entities=["P1"], aliases=["backend port"], source={"type": "explicit", "ref": "msg-17"},
        )
        print(r.event_id, r.partition, r.offset, r.token)  # token: pass as `after` to a read to see this write

A publisher's settings (`get_publisher_settings`) refuse only the development secrets it uses: outside development,
with encryption on and no key endpoint, the development PostgreSQL password (the key store's); never the API's keys.

Guarantees: acks=all, an idempotent producer, Kafka key `tenant|subject` (a subject's events stay in order). The
event_id is the idempotency key: to retry a publish of unknown outcome, publish the same event again, with the same
event_id (an event given without one gets a new random id at each publish, so its retry would be a second event:
give it one, or retry with the `event_id` the result or the `PublishError` names). Whoever may write to the topic
may write any tenant: the API's keys bind tenants at its doors, not here.

Everything the worker would refuse is refused here first, before any of a batch is sent (`contract.InvalidEvent`:
the contract, the size, clock skew, an event_id this process re-used for other content); a broker failure raises
`PublishError`, or is one outcome per event from `send_many`. Without database access the SDK cannot claim ids as
the API's doors do: a publisher learns an event's fate from `LedgerClient.event_status`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import kafka.errors as Errors
from kafka import KafkaProducer
from kafka.partitioner.default import DefaultPartitioner, murmur2
from pydantic import TypeAdapter, ValidationError

from producers.consistency import token_of
from producers.contract import (
    EventType,
    InvalidEvent,
    MemoryEvent,
    check_skew,
    door_refusal,
    encode_wire,
    from_dict_encoded,
    kafka_key,
    wire_fingerprint,
)
from producers.kafka_producer import kafka_producer
from producers.keys.envelope import encode_sealed, sealable
from producers.keys.provider import SealingKeys, sealing_keys_for
from producers.settings import BrokerSeconds, Settings
from producers.topics import MAX_MESSAGE_BYTES, ensure_topics

__all__ = [  # InvalidEvent: re-exported
    "EventIdConflict",
    "EventLike",
    "InvalidEvent",
    "LedgerProducer",
    "PublishError",
    "PublishResult",
    "Published",
]

log = logging.getLogger(__name__)

EventLike = MemoryEvent | Mapping[str, Any]
# What the SDK keeps of a valid event until its outcome: (event_id, tenant, subject, record value, fingerprint, the
# event itself only while sealing needs it). Strings and bytes: the garbage collector stops tracking such a tuple,
# where a batch held as models (each a dozen objects) was traversed by every collection until its acks came back.
_Ready = tuple[str, str, str, bytes, str, MemoryEvent | None]


@dataclass(frozen=True, slots=True)  # slots: one object per result, not two (a batch returns thousands)
class PublishResult:
    """Where the broker stored an event: (partition, offset) is its position on the ledger."""

    event_id: str
    partition: int
    offset: int

    @property
    def token(self) -> str:
        """Its consistency token (producers.consistency): a read given it as `after` answers once it has this event."""
        token = token_of([(self.partition, self.offset)])
        assert token is not None
        return token


class Published(list[PublishResult]):
    """What `publish_many` returns: the results in input order, and `.token`, the consistency token of them all."""

    @property
    def token(self) -> str | None:
        return token_of((r.partition, r.offset) for r in self)


def _broker_wait(timeout_s: Any) -> float:
    """`timeout_s` as LEDGER_PRODUCER_TIMEOUT_S is read (seconds, above 0, at most 300), else ValueError naming it:
    a wait of no time, of text or past kafka-python's limit failed later, as a broker "not reachable" or a TypeError
    after the record was handed over."""
    try:
        return TypeAdapter(BrokerSeconds).validate_python(timeout_s, strict=True)
    except ValidationError as exc:
        raise ValueError(f"timeout_s: {exc.errors()[0]['msg']} (seconds to wait for the broker)") from None


class PublishError(Exception):
    """The event was not published: the broker did not take it, or no data key came for it.
    `code`: unavailable | timeout | refused | closed. `refused`: by the broker or by the key endpoint; `store`: the
    one that failed (the broker, or where a sealed event's data key comes from: the key store's database or the
    API)."""

    def __init__(
        self, event_id: str | None, reason: str, code: str = "refused", *, store: str = "kafka", sent: bool = True
    ) -> None:
        self.event_id, self.reason, self.code, self.store = event_id, reason, code, store
        # False: the record never left this process (its id is free for other content again, unless a record of it
        # left before)
        self.sent = sent
        self.outcomes: list[PublishResult | PublishError] | None = None  # set by publish_many
        super().__init__(f"event {event_id} not published ({code}): {reason}")

    def as_dict(self) -> dict[str, Any]:
        return {"code": f"publish_{self.code}", "field": None, "message": self.reason}


def _key_store(exc: BaseException) -> str:
    """The store a data key could not come from: PostgreSQL (the key store's database), the API's key endpoint, or
    the key store itself (its key-encryption key)."""
    import psycopg

    from producers.keys.provider import KeyServiceError

    return "postgres" if isinstance(exc, psycopg.Error) else exc.store if isinstance(exc, KeyServiceError) else "keys"


def _without_key(event_id: str, reason: str, exc: BaseException) -> PublishError:
    """The error of an event not sent for want of a data key: `refused` when the key endpoint said no (a retry
    changes nothing: the key or tenant to fix), otherwise `unavailable`, naming the store that failed."""
    code = "refused" if getattr(exc, "refused", False) else "unavailable"
    return PublishError(event_id, f"{reason}: {_reason(exc)}", code, store=_key_store(exc), sent=False)


class EventIdConflict(InvalidEvent):
    """The (tenant, event_id) was already published with different content: an id names one event.

    A retry must resend the same event; new content needs a new event_id. Nothing of the batch is sent.
    """

    def __init__(self, tenant: str, event_id: str, known: str, given: str, *, in_batch: bool = False) -> None:
        self.tenant, self.event_id, self.known_fingerprint, self.fingerprint = tenant, event_id, known, given
        where = "is given twice in this batch" if in_batch else "was already sent from this process"
        message = (
            f"event_id {event_id!r} {where} in tenant {tenant!r} with different content "
            f"(fingerprint {known} there, {given} here); resend the same event to retry, or use a new event_id"
        )
        super().__init__("event_id_conflict", message, "event_id")


def _encoded(event: EventLike, max_future_skew: timedelta | None = None) -> tuple[MemoryEvent, dict[str, Any], bytes]:
    """The event validated by the contract, not observed further in the future than `max_future_skew`, its wire and
    its record value (`too_large` refused, as the worker would)."""
    if not isinstance(event, MemoryEvent):
        # a dict as it is: validating reads it and never changes it
        data = event if type(event) is dict or not isinstance(event, Mapping) else dict(event)
        return from_dict_encoded(data, max_future_skew=max_future_skew)
    if max_future_skew is not None:
        check_skew(event, max_future_skew)  # the contract's rule, for an already-built event
    wire = event.to_wire()
    return event, wire, encode_wire(wire)


class _KeyPartitioner(DefaultPartitioner):
    """kafka-python's default partitioner (murmur2 of the key, as the Java client and every other producer of the
    topic: one subject stays in one partition whoever writes it), with each key's hash remembered. A service writes
    the same subjects again and again, and murmur2 in pure Python (the partitions sorted and listed twice per call)
    is a large share of kafka-python's time per record."""

    def __init__(self, remember: int = 65_536) -> None:
        self._hash = functools.lru_cache(maxsize=remember)(murmur2)

    def partition(self, topic, key, serialized_key, value, serialized_value, cluster):  # type: ignore[no-untyped-def]
        partitions = cluster.partitions_for_topic(topic) if serialized_key is not None else None
        if not partitions:  # no key, or a topic not known yet: the default's own answer (or its error)
            return super().partition(topic, key, serialized_key, value, serialized_value, cluster)
        return sorted(partitions)[(self._hash(serialized_key) & 0x7FFFFFFF) % len(partitions)]


def _code(exc: BaseException) -> str:
    if isinstance(exc, Errors.KafkaTimeoutError):
        return "timeout"
    if isinstance(exc, Errors.KafkaConnectionError):
        return "unavailable"
    if isinstance(exc, Errors.IllegalStateError):
        return "closed"
    return "refused"


def _reason(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


class _SubjectLocks:
    """Locks by (tenant, subject), striped: a bounded set, each subject always on the same one. `held` takes the
    stripes of several subjects in one order, so two callers never wait on each other crosswise."""

    STRIPES = 256

    def __init__(self) -> None:
        self._locks = [threading.Lock() for _ in range(self.STRIPES)]

    @contextlib.contextmanager
    def held(self, subjects: Iterable[tuple[str, str]]) -> Iterator[None]:
        stripes = sorted({hash(subject) % self.STRIPES for subject in subjects})
        with contextlib.ExitStack() as stack:
            for i in stripes:
                stack.enter_context(self._locks[i])
            yield


class LedgerProducer:
    """A thread-safe producer for the ledger topic; connects on first use.

    `timeout_s` (default `settings.producer_timeout_s`) bounds every wait: connecting, fetching
    metadata and delivery (retries included), so a broker that is down gives a PublishError after
    about that long, never a hang.
    `remember_ids` bounds the (tenant, event_id) -> fingerprint memory that detects a re-used id
    (oldest forgotten first). It refuses what the API's door refuses beyond the contract (`door_refusal`): `.` or
    `..` as an id, and an event naming a dead letter unless `resolutions` (the dead-letter workflow's producer,
    which checked the letter). `kafka_overrides` are passed to KafkaProducer as they are (e.g. `linger_ms`,
    `client_id`).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        timeout_s: float | None = None,
        create_topics: bool = True,
        remember_ids: int = 100_000,
        keys: SealingKeys | None = None,
        resolutions: bool = False,
        **kafka_overrides: Any,
    ) -> None:
        self.settings = settings
        self._resolutions = resolutions  # the dead-letter workflow's producer: events may name a dead letter
        self.topic = settings.topic
        self.timeout_s = settings.producer_timeout_s if timeout_s is None else _broker_wait(timeout_s)
        self.max_future_skew = timedelta(seconds=settings.max_future_skew_s)
        self._create_topics = create_topics
        self._overrides = kafka_overrides
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._remember = max(0, remember_ids)
        self._sent: OrderedDict[tuple[str, str], str] = OrderedDict()  # (tenant, event_id) -> fingerprint
        self._left: set[tuple[str, str]] = set()  # of those, the ids a record of which left this process
        self._sending: Counter[tuple[str, str]] = Counter()  # the ids of batches still being sent, how many each
        self._ids_lock = threading.Lock()
        self._subject_locks = _SubjectLocks()
        # with encryption on, every event but an erasure is sealed with its subject's data key; the key
        # source is checked here, so a missing or wrong KEK fails at start, not per event
        if keys is None and settings.encryption != "off":
            keys = sealing_keys_for(settings)
        self.keys = keys

    # -- lifecycle -------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        """kafka_producer's arguments: durable, bounded by this producer's timeout, and what a publisher adds."""
        return {
            "client_id": "memory-ledger-producer",
            "timeout_ms": max(1000, int(self.timeout_s * 1000)),
            "linger_ms": int(self._overrides.get("linger_ms", 5)),
            "batch_size": 256 * 1024,  # a partition's share of a 2,000-event send_many in one batch: fewer requests
            "max_request_size": MAX_MESSAGE_BYTES,
            "partitioner": _KeyPartitioner(),
            "allow_auto_create_topics": False,  # the ledger topic is created by ensure_topics, never by accident
            **{k: v for k, v in self._overrides.items() if k != "linger_ms"},
        }

    def _connected(self, event_id: str | None) -> KafkaProducer:
        """The KafkaProducer, created (and the topics ensured) on first use."""
        if self._producer is not None:
            return self._producer
        with self._lock:
            if self._closed:
                raise PublishError(event_id, "the producer is closed", "closed", sent=False)
            if self._producer is None:
                try:
                    if self._create_topics:
                        ensure_topics(self.settings, timeout_s=self.timeout_s)
                    self._producer = kafka_producer(self.settings, **self._config())
                except Exception as exc:  # noqa: BLE001 - any failure to connect is reported as unavailable
                    reason = f"no usable broker at {self.settings.kafka_bootstrap}: {_reason(exc)}"
                    raise PublishError(event_id, reason, "unavailable", sent=False) from exc
            return self._producer

    def connect(self) -> LedgerProducer:
        """Connect now instead of on the first publish (raises PublishError if the broker is unreachable)."""
        self._connected(None)
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Deliver what is buffered (bounded by timeout_s, judged as the constructor's before anything is closed:
        a wait that is no time would leave the buffer undelivered), then release the connection (and the key
        source)."""
        wait = self.timeout_s if timeout_s is None else _broker_wait(timeout_s)
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout=wait)
        if self.keys is not None:
            self.keys.close()

    def __enter__(self) -> LedgerProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- validation ------------------------------------------------------------------------
    def check(self, event: EventLike) -> MemoryEvent:
        """The event as it would be sent, or InvalidEvent for what the worker would refuse (nothing remembered)."""
        valid, _raw, fingerprint = self._prepare(event)
        known = self.known_fingerprint(valid.tenant, valid.event_id)
        if known is not None and known != fingerprint:
            raise EventIdConflict(valid.tenant, valid.event_id, known, fingerprint)
        return valid

    def known_fingerprint(self, tenant: str, event_id: str) -> str | None:
        """The fingerprint this producer last sent under (tenant, event_id), if it still remembers one."""
        with self._ids_lock:
            return self._sent.get((tenant, event_id))

    def _prepare(self, event: EventLike) -> tuple[MemoryEvent, bytes, str]:
        """The event validated once, its record value and its fingerprint, both from one `to_wire()`: building the
        wire costs half as much as validating, so it is built once."""
        valid, wire, value = _encoded(event, self.max_future_skew)
        refusal = door_refusal(valid, resolutions=self._resolutions)
        if refusal is not None:  # what the API's and MCP's doors refuse, refused here too
            raise refusal
        return valid, value, wire_fingerprint(wire)

    def _ready(self, event: EventLike) -> _Ready:
        valid, value, fingerprint = self._prepare(event)
        return valid.event_id, valid.tenant, valid.subject, value, fingerprint, valid if self.keys is not None else None

    def _claim_ids(self, prepared: list[_Ready | InvalidEvent], report: bool) -> None:
        """Refuse ids re-used for different content (here or earlier), then remember the batch's: atomically."""
        with self._ids_lock:
            batch: dict[tuple[str, str], str] = {}
            for i, item in enumerate(prepared):
                if isinstance(item, InvalidEvent):
                    continue
                event_id, tenant, _subject, _value, fingerprint, _event = item
                key = (tenant, event_id)
                known = batch.get(key) or self._sent.get(key)
                if known is not None and known != fingerprint:
                    conflict = EventIdConflict(tenant, event_id, known, fingerprint, in_batch=key in batch).at(i)
                    if not report:
                        raise conflict
                    prepared[i] = conflict
                    continue
                batch[key] = fingerprint
            if not self._remember:
                return
            self._sending.update(batch.keys())
            for key, fingerprint in batch.items():
                self._sent[key] = fingerprint
                self._sent.move_to_end(key)
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        """Keep the last `remember_ids` ids (under the ids lock)."""
        while len(self._sent) > self._remember:
            self._left.discard(self._sent.popitem(last=False)[0])

    # -- publishing ------------------------------------------------------------------------
    def send_many(
        self, events: Iterable[EventLike], *, report_invalid: bool = False
    ) -> list[PublishResult | PublishError | InvalidEvent]:
        """Validate all, send all, flush, then one outcome per event, in input order.

        Raises InvalidEvent (nothing sent; its `index` is the event's place) if any event is invalid, unless
        `report_invalid`: then each invalid event comes back as its InvalidEvent and the others are sent. Broker
        failures come back as PublishError values in the list, not raised. The same event twice is sent once, and
        both are answered alike (its one position), as the HTTP door answers them.
        """
        prepared: list[_Ready | InvalidEvent] = []
        for n, e in enumerate(events):
            try:
                prepared.append(self._ready(e))
            except InvalidEvent as exc:
                if not report_invalid:
                    raise exc.at(n) from None
                prepared.append(exc.at(n))
        self._claim_ids(prepared, report_invalid)  # the same id with other content is an InvalidEvent by now
        first: dict[tuple[str, str], int] = {}
        repeats: dict[int, int] = {}  # index -> the index of the same event earlier in the batch
        for i, item in enumerate(prepared):
            if not isinstance(item, InvalidEvent):
                repeats[i] = first.setdefault((item[1], item[0]), i)
        unique = [i for i in range(len(prepared)) if repeats.get(i, i) == i]
        if len(unique) == len(prepared):
            return self._send_prepared(prepared, report_invalid)
        sent = dict(zip(unique, self._send_prepared([prepared[i] for i in unique], report_invalid), strict=True))
        return [sent[repeats.get(i, i)] for i in range(len(prepared))]

    def _send_prepared(
        self, prepared: list[_Ready | InvalidEvent], report_invalid: bool
    ) -> list[PublishResult | PublishError | InvalidEvent]:
        """send_many's sending: seal (with encryption), hand to the producer, wait; one outcome per item."""
        claimed = list(prepared)  # sealing may turn an item into its InvalidEvent: its id was claimed all the same
        refused: dict[int, PublishError] = {}
        # With encryption, a subject's events are sealed and handed to the producer (which keeps that order in the
        # partition) under the subject's lock, as an erasure's retirement and hand-over are: an event sealed with
        # the key an erasure of this process retires is in the log before that erasure, and one after it is sealed
        # with the next key, never the destroyed one (its record then refused as `key_destroyed`).
        subjects = {(item[1], item[2]) for item in prepared if not isinstance(item, InvalidEvent)}
        with self._subject_locks.held(subjects if self.keys is not None else ()):
            if self.keys is not None:
                self._seal(prepared, refused, report_invalid)
            to_send = [
                item for i, item in enumerate(prepared) if not isinstance(item, InvalidEvent) and i not in refused
            ]
            pending = self._append(to_send) if to_send else []
        sent = iter(self._await([item[0] for item in to_send], pending)) if to_send else iter(())
        outcomes = [
            item if isinstance(item, InvalidEvent) else refused[i] if i in refused else next(sent)
            for i, item in enumerate(prepared)
        ]
        self._settle_ids(claimed, outcomes)
        return outcomes

    def _settle_ids(
        self, prepared: list[_Ready | InvalidEvent], outcomes: list[PublishResult | PublishError | InvalidEvent]
    ) -> None:
        """What each send did to its id. A record that left this process holds the id for good. A record that never
        left releases the id, so that a retry with corrected content is no conflict, unless a record of that id left
        before or a copy of it is still being sent (by another thread: its record may yet leave)."""
        if not self._remember:
            return
        with self._ids_lock:
            for item, out in zip(prepared, outcomes, strict=True):
                if isinstance(item, InvalidEvent):  # refused before its id was claimed
                    continue
                event_id, tenant, _subject, _value, fingerprint, _event = item
                key = (tenant, event_id)
                self._sending[key] -= 1
                if self._sending[key] <= 0:
                    del self._sending[key]
                if isinstance(out, InvalidEvent):  # refused while sealed: its id stays claimed, as it always did
                    continue
                if not isinstance(out, PublishError) or out.sent:
                    self._left.add(key)
                elif key not in self._left and key not in self._sending and self._sent.get(key) == fingerprint:
                    del self._sent[key]

    def _seal(
        self,
        prepared: list[_Ready | InvalidEvent],
        refused: dict[int, PublishError],
        report_invalid: bool,
    ) -> None:
        """Replace each clear record by its sealed one; without a data key, nothing of it is sent (unavailable)."""
        assert self.keys is not None
        events = {i: item[5] for i, item in enumerate(prepared) if not isinstance(item, InvalidEvent)}
        # In log order: the events before an erasure are sealed with the key it retires (and its worker destroys),
        # the events after it with the new key the retirement makes the next ask hand out. Keys asked for after the
        # retirement would seal the subject's erased past with a key that survives it; asked for before it, they
        # would seal its new events with a key the erasure destroys, and the worker could not open them.
        todo: dict[int, MemoryEvent] = {}
        for i, event in events.items():
            if event is None:
                continue
            if sealable(event):
                todo[i] = event
                continue
            # the erased subject's key is asked for too: a subject without one gets one that this erasure retires,
            # so its worker destroys that key and not the one the subject's next event is sealed with
            self._seal_with_keys(prepared, todo, refused, report_invalid, also=(event.tenant, event.subject))
            todo = {}
            try:
                self.keys.retire(event.tenant, event.subject, event.event_id)
            except Exception as exc:  # noqa: BLE001 - the key service failed: this erasure is reported, not sent
                # Sent anyway, it would have the worker destroy the live key that other processes may still seal
                # the subject's next events with (their records then opened by nobody); refused, the caller retries
                # once the key store answers, as for any event that needs a data key.
                log.warning("erasure %s refused: the subject's key was not retired (%s)", event.event_id, _reason(exc))
                refused[i] = _without_key(event.event_id, "the subject's data key was not retired", exc)
        self._seal_with_keys(prepared, todo, refused, report_invalid)

    def _seal_with_keys(
        self,
        prepared: list[_Ready | InvalidEvent],
        todo: dict[int, MemoryEvent],
        refused: dict[int, PublishError],
        report_invalid: bool,
        also: tuple[str, str] | None = None,
    ) -> None:
        """Seal the events `todo` (index in `prepared` -> event) with their subjects' keys as the key source hands
        them out now (one ask per tenant, for the subject `also` too); without a data key, nothing of them is sent.
        Tenant by tenant, so that a key endpoint refusing one tenant (a key bound to others) refuses only its
        events."""
        assert self.keys is not None
        by_tenant: dict[str, set[tuple[str, str]]] = {}
        for pair in [(event.tenant, event.subject) for event in todo.values()] + ([also] if also else []):
            by_tenant.setdefault(pair[0], set()).add(pair)
        keys: dict[tuple[str, str], Any] = {}
        for tenant, pairs in by_tenant.items():
            try:
                keys |= self.keys.sealing_keys(pairs)
            except Exception as exc:  # noqa: BLE001 - the key service failed: reported per event, nothing sent clear
                for i, event in todo.items():
                    if event.tenant == tenant:
                        refused[i] = _without_key(event.event_id, "no data key", exc)
        for i, event in todo.items():
            if i in refused:
                continue
            event_id, tenant, subject, clear, fingerprint, _event = prepared[i]  # type: ignore[misc]
            try:
                sealed = encode_sealed(event, keys[(tenant, subject)], clear=clear)
                prepared[i] = (event_id, tenant, subject, sealed, fingerprint, event)
            except InvalidEvent as exc:
                if not report_invalid:
                    raise
                prepared[i] = exc

    def _append(self, prepared: list[_Ready]) -> list[Any]:
        """Hand each record to the producer, in order (a future each, or the PublishError of one it refused)."""
        ids = [item[0] for item in prepared]
        try:
            producer = self._connected(ids[0])
        except PublishError as exc:
            return [PublishError(event_id, exc.reason, exc.code, sent=False) for event_id in ids]
        pending: list[Any] = []
        abort: PublishError | None = None
        for event_id, tenant, subject, value, _fingerprint, _event in prepared:
            if abort is not None:  # the broker is unusable: fail fast instead of waiting per event
                pending.append(PublishError(event_id, abort.reason, abort.code, sent=False))
                continue
            try:
                pending.append(producer.send(self.topic, value=value, key=kafka_key(tenant, subject)))
            except Exception as exc:  # noqa: BLE001 - reported per event
                err = PublishError(event_id, f"topic {self.topic!r}: {_reason(exc)}", _code(exc), sent=False)
                pending.append(err)
                if err.code in ("timeout", "unavailable", "closed"):
                    abort = err
        return pending

    def _await(self, ids: list[str], pending: list[Any]) -> list[PublishResult | PublishError]:
        """The outcome of each appended record: flushed, each future waited for up to the delivery bound."""
        deadline = time.monotonic() + self.timeout_s + 5  # delivery_timeout_ms fails a record before this
        producer = self._producer
        try:
            if producer is not None:
                producer.flush(timeout=self.timeout_s + 5)
        except Errors.KafkaError as exc:  # e.g. 3.0.12's "Future not done" after a batch split: wait per record
            log.debug("flush: %s", _reason(exc))
        for item in pending:
            if not isinstance(item, PublishError) and not item.is_done:
                try:
                    item.get(timeout=max(0.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001, S110 - the outcome is read from the future below
                    pass
        return [self._outcome(event_id, item) for event_id, item in zip(ids, pending, strict=True)]

    def _outcome(self, event_id: str, item: Any) -> PublishResult | PublishError:
        if isinstance(item, PublishError):
            return item
        if not item.is_done:
            return PublishError(event_id, f"no acknowledgement within {self.timeout_s + 5:.0f}s", "timeout")
        if item.failed():
            return PublishError(event_id, _reason(item.exception), _code(item.exception))
        meta = item.value
        return PublishResult(event_id, meta.partition, meta.offset)

    def publish_many(self, events: Iterable[EventLike]) -> Published:
        """Publish a batch; raises the first PublishError (with `.outcomes` for every event) if any failed.

        The results (a list) carry `.token`: one consistency token for the whole batch."""
        outcomes = self.send_many(events)
        for outcome in outcomes:
            if isinstance(outcome, PublishError):
                outcome.outcomes = outcomes  # type: ignore[assignment]  # no InvalidEvent without report_invalid
                raise outcome
        return Published(outcomes)  # type: ignore[arg-type]  # all PublishResult here

    def publish(self, event: EventLike) -> PublishResult:
        """Publish one event and wait for the broker's acknowledgement."""
        return self.publish_many([event])[0]

    # -- convenience -----------------------------------------------------------------------
    def _publish_typed(self, event_type: EventType, event: dict[str, Any], fields: dict[str, Any]) -> PublishResult:
        """Publish `event` of `event_type`, `fields` beside it: a `type` among them would publish another kind of
        event than the method says (an erase_subject that asserts), so it is refused."""
        if "type" in fields:
            raise TypeError(f"the type is {event_type.value} here: publish() takes an event of another type")
        return self.publish({"type": event_type.value, **event, **fields})

    def assert_fact(
        self, tenant: str, subject: str, key: str | None, value: Any, content: str, **fields: Any
    ) -> PublishResult:
        """`memory.asserted`: the fact (tenant, subject, key, scope) now has this value."""
        event = {"tenant": tenant, "subject": subject, "key": key, "value": value, "content": content}
        return self._publish_typed(EventType.ASSERTED, event, fields)

    def retract(
        self, tenant: str, subject: str, key: str | None, scope: str = "", reason: str | None = None, **fields: Any
    ) -> PublishResult:
        """`memory.retracted`: the fact's active version ends; with `target_version=` only that version (key None
        for an episode's: an episode has no key)."""
        event = {"tenant": tenant, "subject": subject, "key": key, "scope": scope, "reason": reason}
        return self._publish_typed(EventType.RETRACTED, event, fields)

    def confirm(self, tenant: str, subject: str, key: str, scope: str = "", **fields: Any) -> PublishResult:
        """`memory.confirmed`: the fact was re-confirmed (no new value)."""
        event = {"tenant": tenant, "subject": subject, "key": key, "scope": scope}
        return self._publish_typed(EventType.CONFIRMED, event, fields)

    def erase_subject(self, tenant: str, subject: str, reason: str | None = None, **fields: Any) -> PublishResult:
        """`subject.erased`: the projections purge everything about the subject."""
        return self._publish_typed(EventType.ERASED, {"tenant": tenant, "subject": subject, "reason": reason}, fields)
