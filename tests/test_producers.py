"""The write path against the real broker: the SDK from threads and processes, its errors, the CLI."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from producers.contract import MAX_EVENT_BYTES, InvalidEvent, MemoryEvent, decode, from_dict
from producers.kafka_producer import kafka_connection
from producers.sdk import EventIdConflict, LedgerProducer, PublishError, PublishResult
from producers.settings import Settings
from producers.topics import ensure_topics
from tests.conftest import unique
from tests.support import drop_topics, end_offsets, publish_raw, read_topic

SUBJECTS = [f"user:{i}" for i in range(24)]  # shared by every producer, so their writes interleave


# -- helpers ----------------------------------------------------------------------------------


def _event(producer_name: str, seq: int, subject: str) -> dict[str, Any]:
    return {
        "type": "memory.asserted",
        "tenant": "acme",
        "subject": subject,
        "key": "counter",
        "value": {"producer": producer_name, "seq": seq},
        "content": f"{producer_name} says {seq}",
    }


def produce_sequence(settings: Settings, name: str, count: int) -> list[tuple[str, str, int, int, int]]:
    """One producer sends `count` events round-robin over SUBJECTS: (event_id, subject, seq, partition, offset).

    Module level so that a spawned process can run it. Mixes batches and single publishes.
    """
    out: list[tuple[str, str, int, int, int]] = []
    with LedgerProducer(settings) as producer:
        seq = 0
        while seq < count:
            size = 1 if seq % 7 == 0 else 50
            events = [
                from_dict(_event(name, s, SUBJECTS[s % len(SUBJECTS)])) for s in range(seq, min(count, seq + size))
            ]
            results = [producer.publish(events[0])] if size == 1 else producer.publish_many(events)
            for event, result in zip(events, results, strict=True):
                assert result.event_id == event.event_id
                out.append((event.event_id, event.subject, event.value["seq"], result.partition, result.offset))
            seq += len(events)
    return out


@pytest.fixture
def ledger(settings: Settings):
    """A private ledger topic (6 partitions) and DLQ, deleted afterwards."""
    ensure_topics(settings)
    yield settings
    drop_topics(settings)


# -- many producers ---------------------------------------------------------------------------


def test_threads_and_processes_in_parallel_lose_nothing_and_keep_per_subject_order(ledger: Settings) -> None:
    n_threads, n_procs, per_producer = 4, 3, 500
    sent: dict[str, list] = {}
    errors: list[BaseException] = []

    def run_thread(name: str) -> None:
        try:
            sent[name] = produce_sequence(ledger, name, per_producer)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n_procs, mp_context=ctx) as pool:
        futures = {f"proc{i}": pool.submit(produce_sequence, ledger, f"proc{i}", per_producer) for i in range(n_procs)}
        threads = [threading.Thread(target=run_thread, args=(f"thread{i}",)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for name, fut in futures.items():
            sent[name] = fut.result(timeout=120)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)
    total = (n_threads + n_procs) * per_producer
    assert sum(len(v) for v in sent.values()) == total

    records = read_topic(ledger)
    on_topic = {}
    for r in records:
        event = decode(r.value)
        assert r.key == event.kafka_key
        on_topic[event.event_id] = (event, r.partition, r.offset)
    assert len(records) == total  # nothing lost, nothing doubled
    assert set(on_topic) == {row[0] for rows in sent.values() for row in rows}

    subject_partition: dict[str, int] = {}
    for name, rows in sent.items():
        per_subject: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for event_id, subject, seq, partition, offset in rows:
            event, real_partition, real_offset = on_topic[event_id]
            # publish() told the truth about where the event is
            assert (partition, offset) == (real_partition, real_offset)
            assert event.value == {"producer": name, "seq": seq} and event.subject == subject
            # one subject, one partition, whoever sent it
            assert subject_partition.setdefault(subject, partition) == partition
            per_subject[subject].append((seq, offset))
        for subject, pairs in per_subject.items():
            by_offset = [seq for seq, _ in sorted(pairs, key=lambda p: p[1])]
            assert by_offset == sorted(by_offset), f"{name} {subject}: order on the ledger differs from send order"
    assert len(set(subject_partition.values())) > 1  # keys really spread over the partitions


def test_a_republished_event_carries_the_same_event_id(ledger: Settings) -> None:
    event = from_dict(_event("p", 1, "user:1"))
    with LedgerProducer(ledger) as producer:
        first = producer.publish(event)
        again = producer.publish(event)  # e.g. a retry after a lost acknowledgement
        raw_dict = producer.publish(event.to_wire())  # and from the wire dict
    assert first.event_id == again.event_id == raw_dict.event_id == event.event_id
    assert again.offset > first.offset and again.partition == first.partition
    records = read_topic(ledger)
    assert len(records) == 3
    assert {decode(r.value).event_id for r in records} == {event.event_id}
    assert len({r.value for r in records}) == 1  # byte-identical: downstream sees one event thrice


def test_convenience_calls_build_the_right_events(ledger: Settings) -> None:
    with LedgerProducer(ledger) as producer:
        results = [
            producer.assert_fact(
                "acme", "project:P1", "project.port", 8080, "P1 listens on 8080", source={"type": "explicit"}
            ),
            producer.confirm("acme", "project:P1", "project.port"),
            producer.retract("acme", "project:P1", "project.port", reason="moved"),
            producer.assert_fact("acme", "project:P1", None, None, "we met on Monday", kind="episodic"),
            producer.erase_subject("acme", "project:P1", reason="gdpr request"),
        ]
    events = {decode(r.value).event_id: decode(r.value) for r in read_topic(ledger)}
    got = [events[r.event_id] for r in results]
    assert [e.type.value for e in got] == [
        "memory.asserted",
        "memory.confirmed",
        "memory.retracted",
        "memory.asserted",
        "subject.erased",
    ]
    assert got[0].confidence == 1.0 and got[0].value == 8080
    assert got[2].reason == "moved" and got[4].reason == "gdpr request"
    assert got[3].kind.value == "episodic" and got[3].key is None
    assert len({r.partition for r in results}) == 1  # one subject, one partition
    assert [r.offset for r in results] == sorted(r.offset for r in results)


def test_a_batch_does_each_events_work_once_and_reports_each_event(
    ledger: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send_many validates each event once and builds its wire once (the record and the fingerprint share it), sends
    every valid event exactly once, and reports an invalid one in its place without holding back the others."""
    validated: Counter[str] = Counter()
    wired: Counter[str] = Counter()
    validate, to_wire = MemoryEvent.model_validate, MemoryEvent.to_wire

    def counting_validate(data: Any, *args: Any, **kwargs: Any) -> MemoryEvent:
        validated[data.get("event_id", "?") if isinstance(data, dict) else "?"] += 1
        return validate(data, *args, **kwargs)

    def counting_to_wire(self: MemoryEvent) -> dict[str, Any]:
        wired[self.event_id] += 1
        return to_wire(self)

    monkeypatch.setattr(MemoryEvent, "model_validate", counting_validate)
    monkeypatch.setattr(MemoryEvent, "to_wire", counting_to_wire)
    events = [{**_event("p", i, SUBJECTS[i % len(SUBJECTS)]), "event_id": f"once-{i}"} for i in range(40)]
    events[17] = {**events[17], "tenant": ""}  # invalid, in the middle
    with LedgerProducer(ledger) as producer:
        outcomes = producer.send_many(events, report_invalid=True)
    monkeypatch.undo()
    assert isinstance(outcomes[17], InvalidEvent) and outcomes[17].field == "tenant" and outcomes[17].index == 17
    valid_ids = [e["event_id"] for i, e in enumerate(events) if i != 17]
    assert [o.event_id for i, o in enumerate(outcomes) if i != 17] == valid_ids  # type: ignore[union-attr]
    assert all(isinstance(o, PublishResult) for i, o in enumerate(outcomes) if i != 17)
    assert validated == {e["event_id"]: 1 for e in events}
    assert wired == dict.fromkeys(valid_ids, 1)
    on_topic = Counter(decode(r.value).event_id for r in read_topic(ledger))
    assert on_topic == dict.fromkeys(valid_ids, 1)


def test_the_same_event_twice_in_a_batch_is_sent_once_and_both_are_answered_its_position(ledger: Settings) -> None:
    """An event given twice in one batch (a dict and its copy, or a dict and its MemoryEvent) is one record on the
    ledger, and both answers name that record: a second copy's own offset would be a place no read attributes to
    the event."""
    one = {**_event("p", 1, SUBJECTS[0]), "event_id": "twice-1"}
    two = {**_event("p", 2, SUBJECTS[1]), "event_id": "twice-2"}
    with LedgerProducer(ledger) as producer:
        results = producer.publish_many([one, dict(one), two, MemoryEvent.model_validate(one)])
    assert results[0] == results[1] == results[3] and results[2] != results[0], results
    on_topic = Counter(decode(r.value).event_id for r in read_topic(ledger))
    assert on_topic == {one["event_id"]: 1, two["event_id"]: 1}, on_topic


def test_the_sdk_puts_a_subject_where_any_kafka_client_would(ledger: Settings) -> None:
    """The SDK remembers each key's hash; the partition is still the default partitioner's (murmur2), so a subject
    written by the SDK and by another client (the API, a raw producer) stays in one partition."""
    subjects = [f"user:{i}" for i in range(60)]
    with LedgerProducer(ledger) as producer:
        sdk = producer.publish_many([_event("p", i, s) for i, s in enumerate(subjects)] * 2)
    raw = publish_raw(ledger, [(f"acme|{s}".encode(), b"{}") for s in subjects])
    assert [r.partition for r in sdk] == [p for p, _ in raw] * 2
    assert len({p for p, _ in raw}) > 1


def test_the_ledgers_topics_stamp_each_record_with_the_brokers_clock(ledger: Settings) -> None:
    """A producer's timestamp, an hour ahead or at 1970, is not the record's: the broker's time is (the default
    observed_at, the skew window's reference, and an erasure's place in time against other partitions)."""
    producer = KafkaProducer(**kafka_connection(ledger), acks="all")
    try:
        before = time.time() * 1000
        for topic in (ledger.topic, ledger.dlq_topic, ledger.access_topic):
            for stamp in (int(before) + 3_500_000, 1000):
                producer.send(topic, key=b"acme|user:clock", value=b"{}", timestamp_ms=stamp)
        producer.flush(30)
        after = time.time() * 1000
    finally:
        producer.close(5)
    for topic in (ledger.topic, ledger.dlq_topic, ledger.access_topic):
        stamps = [m.timestamp for m in read_topic(ledger, topic)]
        assert len(stamps) == 2 and all(before - 5000 <= t <= after + 5000 for t in stamps), (topic, stamps)


def test_an_existing_ledger_topic_on_the_producers_clock_is_left_and_said_once(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger topic made before (or by another tool) with CreateTime keeps it: `ensure_topics` says so once a
    process, with the command that changes it; a topic it made itself says nothing."""
    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        stamped = {"message.timestamp.type": "CreateTime"}
        admin.create_topics([NewTopic(settings.topic, settings.topic_partitions, 1, topic_configs=stamped)])
    finally:
        admin.close()
    try:
        with caplog.at_level(logging.WARNING, logger="producers.topics"):
            ensure_topics(settings)
            ensure_topics(settings)
        said = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
        assert len(said) == 1 and "CreateTime" in said[0] and "left as it is" in said[0], said
        assert f"--entity-name {settings.topic} --add-config message.timestamp.type=LogAppendTime" in said[0]
    finally:
        drop_topics(settings)
    other = settings.private(unique("t"))
    try:
        with caplog.at_level(logging.WARNING, logger="producers.topics"):
            caplog.clear()
            ensure_topics(other)  # made here: LogAppendTime
            ensure_topics(other)
        assert not [r for r in caplog.records if "clock" in r.getMessage()], caplog.text
    finally:
        drop_topics(other)


def test_cli_topic_option_naming_the_configured_topic_keeps_its_dlq_and_access_topics() -> None:
    """`--topic` spelling the configured ledger topic changes nothing (no stray `<topic>.access` is made); another
    topic brings its own DLQ and access topic."""
    from producers.cli import _settings
    from producers.settings import get_publisher_settings

    configured = get_publisher_settings()
    same = _settings(configured.topic)
    assert (same.dlq_topic, same.access_topic) == (configured.dlq_topic, configured.access_topic)
    other = _settings("x.events")
    assert (other.topic, other.dlq_topic, other.access_topic) == ("x.events", "x.events.dlq", "x.events.access")


# -- errors -----------------------------------------------------------------------------------


def test_an_invalid_event_in_a_batch_stops_the_batch_before_anything_is_sent(ledger: Settings) -> None:
    good = _event("p", 1, "user:1")
    with LedgerProducer(ledger) as producer:
        with pytest.raises(InvalidEvent) as info:
            producer.publish_many([good, good, {**good, "tenant": ""}])
        assert info.value.field == "tenant"
        assert info.value.index == 2 and "event 2 of the batch" in str(info.value)  # which of many it is
        with pytest.raises(InvalidEvent):
            producer.assert_fact("acme", "user:1", "k", 1, content="")
        producer.publish(MemoryEvent(type="subject.erased", tenant="acme", subject="marker"))
    records = read_topic(ledger)
    assert [decode(r.value).subject for r in records] == ["marker"]


def test_the_sdk_refuses_what_the_worker_would_refuse_before_sending(ledger: Settings) -> None:
    """Bad input at the SDK: size, clock skew, unstorable text, numbers; nothing reaches the topic."""
    good = _event("p", 1, "user:1")
    cases = [
        ({**good, "value": "x" * (MAX_EVENT_BYTES + 1)}, "too_large", None),  # each field in its limits, too big
        (
            {**good, "aliases": [f"{i:03}" + "a" * 250 for i in range(64)], "value": ["v" * 4000] * 62},
            "too_large",
            None,
        ),
        ({**good, "observed_at": "2099-01-01T00:00:00Z"}, "clock_skew", "observed_at"),
        ({**good, "content": "nul \x00 inside"}, "unstorable_text", "content"),
        ({**good, "value": {"deep": 10**30}}, "number_out_of_range", "value.deep"),
        ({**good, "value": float("nan")}, "number_out_of_range", "value"),
    ]
    with LedgerProducer(ledger) as producer:
        for event, code, field in cases:
            with pytest.raises(InvalidEvent) as info:
                producer.publish_many([good, event])  # the valid one is not sent either
            assert (info.value.code, info.value.field) == (code, field), info.value
        built = MemoryEvent.model_validate({**good, "observed_at": "2099-01-01T00:00:00Z"})  # an event built by hand
        with pytest.raises(InvalidEvent) as info:
            producer.publish(built)
        assert info.value.code == "clock_skew"
        outcomes = producer.send_many([good, cases[0][0]], report_invalid=True)  # or reported per event
        assert isinstance(outcomes[0], PublishResult)
        assert isinstance(outcomes[1], InvalidEvent) and outcomes[1].code == "too_large"
    assert [decode(r.value).event_id for r in read_topic(ledger)] == [outcomes[0].event_id]


def test_a_reused_event_id_with_other_content_raises_event_id_conflict(ledger: Settings) -> None:
    """Idempotency at the SDK: (tenant, event_id) names one event; a retry is the same event."""
    given = {**_event("p", 1, "user:1"), "event_id": "id-1"}  # observed_at left to default
    first = from_dict(given)
    changed = [  # the same id, different content: each a conflict
        {**first.to_wire(), "value": {"other": True}},
        {**first.to_wire(), "subject": "user:2"},
        {**first.to_wire(), "type": "memory.retracted"},
        {**first.to_wire(), "valid_from": "2020-01-01T00:00:00Z"},
    ]
    with LedgerProducer(ledger, remember_ids=3) as producer:
        producer.publish(first)
        producer.publish(given)  # a retry whose observed_at defaults again (a later time): the same event
        for other in changed:
            with pytest.raises(EventIdConflict) as info:
                producer.publish(other)
            assert isinstance(info.value, InvalidEvent)
            assert (info.value.code, info.value.field, info.value.event_id) == ("event_id_conflict", "event_id", "id-1")
        with pytest.raises(EventIdConflict):  # within one batch too, and nothing of the batch is sent
            producer.publish_many([{**_event("p", 2, "user:3"), "event_id": "id-2"}, *changed[:1]])
        with pytest.raises(EventIdConflict) as twice:
            producer.publish_many(
                [{**_event("p", 3, "user:3"), "event_id": "id-3"}, {**_event("p", 4, "user:3"), "event_id": "id-3"}]
            )
        assert "given twice in this batch" in str(twice.value) and "already sent" in str(info.value), twice.value
        assert twice.value.index == 1 and "event 1 of the batch" in str(twice.value)  # which of the batch it is
        producer.publish({**changed[0], "tenant": "globex"})  # ids are per tenant: another tenant's id-1 is its own
        outcomes = producer.send_many([first, changed[0]], report_invalid=True)
        assert isinstance(outcomes[0], PublishResult) and isinstance(outcomes[1], EventIdConflict)
        for i in range(3):  # the memory is bounded: the oldest ids are forgotten first
            producer.publish({**_event("p", 10 + i, "user:4"), "event_id": f"filler-{i}"})
        producer.publish(changed[0])  # id-1 was forgotten here; the worker still dead-letters it
    on_topic = [(e.tenant, e.event_id) for e in (decode(r.value) for r in read_topic(ledger))]
    assert Counter(on_topic) == {
        ("acme", "id-1"): 4,
        ("globex", "id-1"): 1,
        ("acme", "filler-0"): 1,
        ("acme", "filler-1"): 1,
        ("acme", "filler-2"): 1,
    }


def test_unreachable_broker_gives_a_clear_error_quickly(settings: Settings) -> None:
    nowhere = settings.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"})
    event = from_dict(_event("p", 1, "user:1"))
    t0 = time.monotonic()
    with LedgerProducer(nowhere, timeout_s=2) as producer:
        with pytest.raises(PublishError) as info:
            producer.publish(event)
        # nothing left the process: the id is not taken, so the same id with corrected content is no conflict
        corrected = from_dict({**event.to_wire(), "value": "corrected"})
        with pytest.raises(PublishError) as again:
            producer.publish(corrected)
    assert time.monotonic() - t0 < 30
    assert info.value.event_id == event.event_id
    assert info.value.code == "unavailable" and info.value.sent is False
    assert "127.0.0.1:1" in info.value.reason
    assert again.value.code == "unavailable" and again.value.event_id == event.event_id


def test_a_missing_topic_times_out_and_is_not_auto_created(settings: Settings) -> None:
    events = [_event("p", i, "user:1") for i in range(3)]
    t0 = time.monotonic()
    try:
        with LedgerProducer(settings, timeout_s=2, create_topics=False) as producer:
            with pytest.raises(PublishError) as info:
                producer.publish_many(events)
        assert time.monotonic() - t0 < 15  # one timeout for the batch, not one per event
        assert info.value.code == "timeout"
        assert settings.topic in info.value.reason
        assert [o.code for o in info.value.outcomes] == ["timeout"] * 3
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
        try:
            assert settings.topic not in admin.list_topics()  # the broker allows auto-creation; we must not ask
        finally:
            admin.close()
    finally:
        drop_topics(settings)


def test_a_record_the_broker_refuses_fails_alone(settings: Settings) -> None:
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        admin.create_topics(
            {settings.topic: {"num_partitions": 1, "replication_factor": 1, "configs": {"max.message.bytes": "2000"}}}
        )
        admin.wait_for_topics([settings.topic])
    finally:
        admin.close()
    try:
        small = from_dict(_event("p", 1, "user:1"))
        big = from_dict({**_event("p", 2, "user:2"), "content": "x" * 8000})
        with LedgerProducer(settings, timeout_s=10, create_topics=False) as producer:
            outcomes = producer.send_many([small, big])
            with pytest.raises(PublishError) as info:
                producer.publish(big)
        assert isinstance(outcomes[0], PublishResult)
        assert isinstance(outcomes[1], PublishError) and outcomes[1].event_id == big.event_id
        assert outcomes[1].code == "refused" and "TooLarge" in outcomes[1].reason
        assert info.value.code == "refused"
        assert [decode(r.value).event_id for r in read_topic(settings)] == [small.event_id]
    finally:
        drop_topics(settings)


def test_an_id_a_record_left_with_is_kept_when_a_later_copy_never_leaves(ledger: Settings) -> None:
    """A copy of a sent event that fails before leaving the process (here: the producer closed) does not free the
    id: the record sent first holds it, so other content under it is still refused here, not dead-lettered later."""
    event = {**_event("p", 1, SUBJECTS[0]), "event_id": "held-1"}
    producer = LedgerProducer(ledger)
    first = producer.publish(event)
    fingerprint = producer.known_fingerprint("acme", "held-1")
    producer.close()
    with pytest.raises(PublishError) as info:
        producer.publish(event)
    assert info.value.sent is False
    assert producer.known_fingerprint("acme", "held-1") == fingerprint is not None
    with pytest.raises(EventIdConflict):
        producer.check({**event, "content": "other content"})
    assert [(r.partition, r.offset) for r in read_topic(ledger)] == [(first.partition, first.offset)]


def test_a_copy_that_never_leaves_keeps_the_id_while_another_copy_is_being_sent(settings: Settings) -> None:
    """Two threads send the same event; one copy fails before leaving the process while the other is still being
    sent: the id stays claimed (the other's record may yet leave), so other content under it is refused here."""
    event = {**_event("p", 1, SUBJECTS[0]), "event_id": "race-1"}
    producer = LedgerProducer(settings)  # never connects: the ids' bookkeeping alone
    first, second = [producer._ready(event)], [producer._ready(event)]
    producer._claim_ids(first, False)  # thread A: claimed, its record on its way
    producer._claim_ids(second, False)  # thread B: the same event, claimed again
    producer._settle_ids(second, [PublishError("race-1", "metadata timeout", "timeout", sent=False)])
    with pytest.raises(EventIdConflict):
        producer.check({**event, "content": "other content"})
    producer._settle_ids(first, [PublishResult("race-1", 0, 7)])  # A's record left
    producer._settle_ids([producer._ready(event)], [PublishError("race-1", "closed", "closed", sent=False)])
    with pytest.raises(EventIdConflict):  # a later copy that never left does not free it either
        producer.check({**event, "content": "other content"})


def test_a_closed_producer_refuses_clearly(ledger: Settings) -> None:
    producer = LedgerProducer(ledger)
    producer.publish(_event("p", 1, "user:1"))
    producer.close()
    with pytest.raises(PublishError) as info:
        producer.publish(_event("p", 2, "user:1"))
    assert info.value.code == "closed"


# -- the CLI ----------------------------------------------------------------------------------


LEDGER_BIN = str(Path(sys.executable).parent / "ledger")


def _jsonl(tmp_path: Path, n_valid: int) -> tuple[Path, list[str], dict[int, str]]:
    """A file of valid events with bad lines at known places: (path, valid event_ids, line -> code)."""
    lines: list[bytes] = []
    ids: list[str] = []
    bad: dict[int, str] = {}
    for i in range(n_valid):
        event = from_dict(_event("cli", i, SUBJECTS[i % len(SUBJECTS)]))
        ids.append(event.event_id)
        lines.append(orjson.dumps(event.to_wire()))
        number = len(lines) + 1  # the line a bad record inserted now would get
        if i == 9:
            lines.append(b'{"type": "memory.asserted", "tenant": ')
            bad[number] = "bad_json"
        elif i == 40:
            lines.append(b"")  # blank lines are skipped, not rejected
        elif i == 41:
            lines.append(b'["not", "an", "event"]')
            bad[number] = "not_an_object"
        elif i == 100:
            lines.append(orjson.dumps({k: v for k, v in _event("cli", -1, "user:1").items() if k != "subject"}))
            bad[number] = "missing_field"
        elif i == 150:
            lines.append(orjson.dumps({**_event("cli", -2, "user:1"), "type": "memory.forgotten"}))
            bad[number] = "unknown_type"
        elif i == 200:  # only the SDK can tell: the encoded record is larger than the worker takes
            lines.append(orjson.dumps({**_event("cli", -3, "user:1"), "value": "x" * MAX_EVENT_BYTES}))
            bad[number] = "too_large"
        elif i == 250:  # the first line's event_id (sent in an earlier batch) with other content
            lines.append(orjson.dumps({**_event("cli", -4, "user:1"), "event_id": ids[0]}))
            bad[number] = "event_id_conflict"
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, ids, bad


def test_cli_publishes_the_valid_lines_and_reports_the_rest_by_line(ledger: Settings, tmp_path: Path) -> None:
    path, ids, bad = _jsonl(tmp_path, 300)
    proc = subprocess.run(
        [LEDGER_BIN, "publish", str(path), "--topic", ledger.topic, "--batch-size", "64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "accepted: 300" in out
    assert f"rejected: {len(bad)}" in out
    for line, code in bad.items():
        assert f"line {line}: {code}" in out, out
    missing = next(n for n, code in bad.items() if code == "missing_field")
    assert f"line {missing}: missing_field (subject)" in out
    assert "partitions used: " in out
    on_topic = [decode(r.value).event_id for r in read_topic(ledger)]
    assert sorted(on_topic) == sorted(ids)
    used = re.search(r"^partitions used: (.*)$", out, re.M).group(1)
    counts = {int(p): int(n) for p, n in (item.split(":") for item in used.split(", "))}
    assert counts == Counter(r.partition for r in read_topic(ledger))


def test_cli_reads_stdin_and_exits_zero_when_all_are_accepted(ledger: Settings) -> None:
    events = [from_dict(_event("stdin", i, "user:7")) for i in range(20)]
    data = b"".join(orjson.dumps(e.to_wire()) + b"\n" for e in events)
    proc = subprocess.run(
        [LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet"], input=data, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert b"accepted: 20" in proc.stdout and b"rejected: 0" in proc.stdout
    records = read_topic(ledger)
    assert [decode(r.value).event_id for r in sorted(records, key=lambda r: r.offset)] == [e.event_id for e in events]


def test_a_machine_that_only_publishes_needs_none_of_the_servers_settings(ledger: Settings) -> None:
    """A service's machine outside development, holding only where Kafka is and the topic: the SDK as its docstring
    shows and `ledger publish` both publish (the development key and the local password are defaults it never
    uses); with encryption on and its key store there, the local password is refused, naming LEDGER_PG_DSN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env |= {"LEDGER_KAFKA_BOOTSTRAP": ledger.kafka_bootstrap, "LEDGER_TOPIC": ledger.topic}
    events = [from_dict(_event("publisher", i, "user:8")) for i in range(3)]
    sdk = (
        "from producers.settings import get_publisher_settings\n"
        "from producers.sdk import LedgerProducer\n"
        "with LedgerProducer(get_publisher_settings()) as ledger:\n"
        "    r = ledger.assert_fact('demo', 'user:8', 'pref.seat', 'window', 'User 8 prefers window seats',"
        f" event_id={events[0].event_id!r})\n"
        "    print(r.event_id)\n"
    )
    proc = subprocess.run([sys.executable, "-c", sdk], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == events[0].event_id, proc.stderr[-2000:]
    data = b"".join(orjson.dumps(e.to_wire()) + b"\n" for e in events[1:])
    proc = subprocess.run(
        [LEDGER_BIN, "publish", "-", "--quiet"], env=env, input=data, capture_output=True, timeout=120
    )
    assert proc.returncode == 0 and b"accepted: 2" in proc.stdout, proc.stderr[-2000:]
    assert sorted(decode(r.value).event_id for r in read_topic(ledger)) == sorted(e.event_id for e in events)
    sealed = {**env, "LEDGER_ENCRYPTION": "on"}
    proc = subprocess.run([LEDGER_BIN, "publish", "-"], env=sealed, input=data, capture_output=True, timeout=120)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "LEDGER_PG_DSN" in lines[0], proc.stderr[-2000:]
    assert len(read_topic(ledger)) == len(events)


def test_cli_whose_report_cannot_be_written_says_so_in_one_line(ledger: Settings) -> None:
    """Standard output on a full device: the events are published, and the report that cannot be written is one
    line on stderr and exit code 74 (EX_IOERR: not 1, a check's verdict), not a traceback (nor the interpreter's
    own complaint at its last flush)."""
    data = orjson.dumps(from_dict(_event("full", 1, "user:9")).to_wire()) + b"\n"
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet"],
            input=data, stdout=full, stderr=subprocess.PIPE, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 74, proc.stderr
    assert proc.stderr.decode().strip().splitlines() == ["ledger: No space left on device"], proc.stderr
    assert len(read_topic(ledger)) == 1


def test_cli_publishes_lines_of_a_quiet_or_trickling_pipe_without_waiting_for_a_full_batch(ledger: Settings) -> None:
    """A service's log piped in (`tail -f ... | ledger publish -`) delivers a few lines and then nothing for a while,
    or a line every moment: each line is published once it has waited the linger, not held until 500 more arrive or
    the pipe closes (a kill meanwhile lost them unsent)."""
    events = [from_dict(_event("trickle", i, "user:9")) for i in range(25)]
    wire = [orjson.dumps(e.to_wire()) + b"\n" for e in events]
    proc = subprocess.Popen([LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet", "--linger", "0.5"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdin is not None

    def on_topic() -> int:
        return sum(end_offsets(ledger).values())

    try:
        for start, sent in ((0, 3), (3, 5)):  # a few lines, then quiet
            proc.stdin.write(b"".join(wire[start:sent]))
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            while on_topic() < sent and time.monotonic() < deadline:
                time.sleep(0.1)
            assert on_topic() == sent, "lines held while the pipe stays open"
        for line in wire[5:]:  # a line every 0.2 s, never quiet for the linger
            proc.stdin.write(line)
            proc.stdin.flush()
            time.sleep(0.2)
        assert on_topic() >= 15, "lines held while the pipe trickles"
        out, err = proc.communicate(timeout=60)  # closes the pipe: the end of the input
    finally:
        proc.kill()
    assert proc.returncode == 0 and b"accepted: 25" in out, (out, err[-500:])
    records = sorted(read_topic(ledger), key=lambda r: (r.partition, r.offset))
    assert sorted(decode(r.value).event_id for r in records) == sorted(e.event_id for e in events)


def test_cli_publish_stopped_by_a_service_manager_or_early_or_unread_says_so(ledger: Settings) -> None:
    """The class: however `ledger publish` is stopped, no line it read is lost without a word. SIGTERM (systemd,
    docker stop, `timeout`) ended it at once, silently, the lines read and held for the linger unsent: now they are
    sent, then the summary, exit 143. Ctrl-C while its broker does not answer: a summary of nothing sent.
    A reader of its summary that went away (`| true`) was exit 1, a verdict's code, with no word: now SIGPIPE's,
    as for a Unix filter."""
    import signal
    import socket

    lines = b"".join(orjson.dumps(from_dict(_event("term", i, "user:9")).to_wire()) + b"\n" for i in range(3))
    proc = subprocess.Popen([LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet", "--linger", "600"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(lines)
    proc.stdin.flush()
    time.sleep(3)  # read, and held for the linger
    assert sum(end_offsets(ledger).values()) == 0
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and b"Traceback" not in err, (out, err[-500:])
    assert b"accepted: 3" in out and b"terminated after line 3: the valid lines up to it were sent, 3 pub" in out, out
    # in a process of its own caller (a test's CliRunner, a script), the command leaves the signals as it found them
    from typer.testing import CliRunner

    from infra.cli import app

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGPIPE)
    ran = CliRunner().invoke(app, ["publish", "-", "--topic", ledger.topic, "--quiet"], input=lines[:10])
    assert ran.exit_code == 1 and "rejected: 1" in ran.stdout, ran.stdout  # a piece of a line: bad JSON
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGPIPE)) == before
    assert len(read_topic(ledger)) == 3

    with socket.socket() as silent:  # a "broker" that takes the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {**os.environ, "LEDGER_KAFKA_BOOTSTRAP": f"127.0.0.1:{silent.getsockname()[1]}"}
        proc = subprocess.Popen([LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(lines, timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, (out, err[-500:])
    assert b"accepted: 0" in out and b"stopped early" in out, out

    proc = subprocess.run(["bash", "-c", f'"{LEDGER_BIN}" publish - --topic {ledger.topic} --quiet | true; '
                           'echo "rc=${PIPESTATUS[0]}" >&2'], input=lines[: lines.index(b"\n") + 1],
                          capture_output=True, timeout=120)  # fmt: skip
    assert b"rc=141" in proc.stderr and b"Traceback" not in proc.stderr, proc.stderr[-500:]
    assert len(read_topic(ledger)) == 4  # sent before the summary was written (a redelivery the worker drops)


def test_cli_reads_any_readable_path_and_names_what_it_cannot(ledger: Settings, tmp_path: Path) -> None:
    """A pipe (`<(...)`) and a device read as a file does; a directory or a path that cannot be opened is one line
    saying which (not "no such file" for a path that exists), exit 2."""
    events = [from_dict(_event("pipe", i, "user:8")) for i in range(3)]
    lines = "".join(orjson.dumps(e.to_wire()).decode() + "\n" for e in events)
    piped = subprocess.run(
        ["bash", "-c", f'"{LEDGER_BIN}" publish <(cat) --topic {ledger.topic} --quiet'],
        input=lines, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert piped.returncode == 0 and "accepted: 3" in piped.stdout, (piped.stdout, piped.stderr)
    empty = subprocess.run([LEDGER_BIN, "publish", "/dev/null", "--topic", ledger.topic, "--quiet"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert empty.returncode == 0 and "accepted: 0" in empty.stdout, (empty.stdout, empty.stderr)
    for path, says in ((tmp_path, "is a directory"), (tmp_path / "missing.jsonl", "No such file")):
        proc = subprocess.run([LEDGER_BIN, "publish", str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_cli_topics_is_idempotent(settings: Settings) -> None:
    try:
        first = subprocess.run([LEDGER_BIN, "topics", "--topic", settings.topic], capture_output=True, text=True)
        second = subprocess.run([LEDGER_BIN, "topics", "--topic", settings.topic], capture_output=True, text=True)
        assert first.returncode == second.returncode == 0, first.stderr + second.stderr
        assert f"{settings.topic}: created, 6 partitions" in first.stdout
        assert f"{settings.topic}: exists, 6 partitions" in second.stdout
        assert f"{settings.topic}.dlq: exists" in second.stdout
    finally:
        drop_topics(settings, settings.topic, f"{settings.topic}.dlq", f"{settings.topic}.access")


@pytest.mark.parametrize("command", ["publish", "topics"])
def test_cli_a_bad_topic_option_is_named_as_the_option(command: str) -> None:
    """`--topic` is refused by LEDGER_TOPIC's rule, and the error names the option (and which derived topic broke
    the rule), not a variable the user never set."""
    args = {"publish": ["publish", "-", "--quiet"], "topics": ["topics"]}[command]
    for topic, says in (("a b", "'a b'"), ("a" * 247, "its dead-letter topic")):
        proc = subprocess.run([LEDGER_BIN, *args, "--topic", topic], input="", capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        err = " ".join(proc.stderr.replace("│", " ").split())
        assert proc.returncode == 2, proc.stderr
        assert "'--topic'" in err and says in err and "LEDGER_TOPIC" not in err, proc.stderr


def test_cli_publish_holds_no_line_whole_and_says_how_far_it_got_when_stopped(ledger: Settings) -> None:
    """The class: what `ledger publish` is fed or how it is stopped never ends in a traceback or a silence. A stream
    without a line break (`/dev/zero`) was read whole into memory (MemoryError on a bounded host), Ctrl-C printed
    nothing of what was sent, closed stdin was an AttributeError. Now the over-long line is refused by its number,
    holding at most a bounded piece of it; an interrupted run prints its summary and exits 130; closed stdin is a
    usage error."""
    import signal

    import psutil

    proc = subprocess.Popen(["bash", "-c", f'head -c 200000000 /dev/zero | "{LEDGER_BIN}" publish - --topic '
                             f"{ledger.topic} --quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max([peak, *(c.memory_info().rss for c in psutil.Process(proc.pid).children(recursive=True))])
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 1 and b"line 1: too_large" in out and b"Traceback" not in err, (out, err[-500:])
    assert peak < 300 * 2**20, peak  # the whole line would be ~500 MB

    lines = "".join(orjson.dumps({**_event("int", i, "user:9"), "event_id": f"int-{i}"}).decode() + "\n"
                    for i in range(1003))  # fmt: skip
    # as a terminal's Ctrl-C reaches it: SIGINT not ignored (a background job's children inherit it ignored)
    # (a long linger: the lines of the partial batch stay held until the signal)
    proc = subprocess.Popen([LEDGER_BIN, "publish", "-", "--topic", ledger.topic, "--quiet", "--linger", "600"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(lines.encode())
    proc.stdin.flush()  # then it waits for more: stopped there
    deadline = time.monotonic() + 60
    while sum(end_offsets(ledger).values()) < 1000 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the last three lines read into the next batch, which waits to fill
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, (out, err[-500:])
    assert b"accepted: 1000" in out and b"interrupted: 1000 lines published" in out, out
    assert b"3 valid lines from line 1001 to 1003 were read and not sent" in out, out  # named, never dropped unsaid

    closed = subprocess.run(["bash", "-c", f'"{LEDGER_BIN}" publish - --topic {ledger.topic} <&-'],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert closed.returncode == 2 and "closed" in closed.stderr and "Traceback" not in closed.stderr, closed.stderr


@pytest.mark.unit
def test_a_producers_timeout_is_judged_as_its_setting_is(settings: Settings) -> None:
    """`timeout_s` was taken as given: no time, or `nan`, failed later as a broker "not reachable" while it ran, text
    as a TypeError after the record was handed over, and past 300 s kafka-python's own refusal. Each is refused when
    the producer is made, naming it."""
    for bad in (0, -1, float("nan"), float("inf"), "3", True, 301):
        with pytest.raises(ValueError, match="^timeout_s: "):
            LedgerProducer(settings, timeout_s=bad)
    assert LedgerProducer(settings, timeout_s=2).timeout_s == 2.0
    producer = LedgerProducer(settings)
    for bad in ("soon", float("nan"), -1):  # close() closed first, then failed: its buffer never delivered
        with pytest.raises(ValueError, match="^timeout_s: "):
            producer.close(timeout_s=bad)
        assert not producer._closed


@pytest.mark.unit
def test_a_helper_publishes_only_its_own_type(settings: Settings) -> None:
    """`type=` among a helper's fields replaced its type: erase_subject published an assertion."""
    producer = LedgerProducer(settings)
    helpers = {
        "assert_fact": ("t", "s", "k", 1, "c"),
        "retract": ("t", "s", "k"),
        "confirm": ("t", "s", "k"),
        "erase_subject": ("t", "s"),
    }
    for name, args in helpers.items():
        with pytest.raises(TypeError, match="^the type is "):
            getattr(producer, name)(*args, type="memory.asserted")
