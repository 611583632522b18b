"""`ledger verify`: the ledger topic re-read from its first offset, against the chain, its checkpoints and the rows.

It checks the checkpoints' signatures, the chain recomputed from the log, that every record below the stored
position is accounted for in the projection, and that the fact versions are what the fold makes of those events,
all in one read-only snapshot so the rows and positions agree. Every
divergence names its partition and offset. What each check means: docs/INTERNALS.md, "The ledger chain".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import psycopg
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from producers.contract import EventType, MemoryEvent, wire_fingerprint
from producers.kafka_producer import kafka_connection
from producers.keys.kek import KekError
from producers.keys.signing import key_id, load_signer, parse_public_key
from producers.records import Incoming
from producers.settings import Settings
from producers.topics import probe
from projections.postgres.chain import (
    GENESIS,
    Checkpoint,
    Head,
    checkpoint_valid,
    link,
    read_checkpoints,
    read_heads,
    read_starts,
)
from projections.postgres.idempotency import erased_sql
from projections.postgres.positioned import claimed_subject, connect, letter_tenant
from projections.postgres.positions import stored_positions
from projections.postgres.queries import below_sql
from projections.postgres.recorder import BatchResult, Recorder
from projections.versions import DERIVED, Route, fold, route

__all__ = [
    "Divergence",
    "PartitionReport",
    "VerifyReport",
    "expected_event_row",
    "render",
    "row_differences",
    "verify",
]

log = logging.getLogger(__name__)

MAX_DIVERGENCES = 1000  # the first ones kept in a report (by partition and offset); the count goes on
_NO_FACT = (Route.ERASURE, Route.RESOLUTION)  # logged under no fact (memory_id NULL), as the recorder does
EVENT_COLUMNS = (
    "tenant event_id fingerprint subject memory_id type kind key scope observed_at valid_from valid_to "
    "target_version payload key_id logged_at"
).split()
_CLEAR_COLUMNS = ("tenant", "event_id", "subject", "type", "key", "scope")  # a sealed record's clear fields


@dataclass(frozen=True)
class Divergence:
    """Where the log, the chain and the projection disagree."""

    kind: str  # signature | untrusted_key | chain | missing_record | unchained | projection
    partition: int
    offset: int
    message: str
    after: int | None = None  # a chain mismatch: the last offset known good (the change lies after it)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "partition": self.partition, "offset": self.offset}
        if self.after is not None:
            out["after"] = self.after
        out["message"] = self.message
        return out


@dataclass
class PartitionReport:
    partition: int
    position: int  # the stored next_offset: the records below it were taken
    start: int = 0  # where the chain began, in a schema that predates it (records before it are not chained)
    records: int = 0  # records read from the log below the position
    head: Head | None = None
    checkpoints: int = 0
    checkpoints_valid: int = 0  # signature verified (and by a trusted key, when keys are trusted)
    last_checkpoint: int | None = None  # the offset of the last valid checkpoint of the head's chain

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "position": self.position,
            "chain_start": self.start,
            "records": self.records,
            "head": None if self.head is None else self.head.as_json(),
            "checkpoints": self.checkpoints,
            "checkpoints_valid": self.checkpoints_valid,
            "last_checkpoint": self.last_checkpoint,
        }


@dataclass
class VerifyReport:
    topic: str
    schema: str
    consumer: str
    partitions: list[PartitionReport] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    divergence_count: int = 0
    events_checked: int = 0
    dead_letters_checked: int = 0
    sealed_unopened: int = 0
    trusted_keys: list[str] = field(default_factory=list)  # key ids
    chained: bool = True  # False: the schema has no chain tables yet
    notes: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.divergence_count == 0

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def diverged(self, d: Divergence) -> None:
        """Count `d`; keep it if it is among the first MAX_DIVERGENCES by (partition, offset)."""
        self.divergence_count += 1
        self.divergences.append(d)
        if len(self.divergences) > 2 * MAX_DIVERGENCES:
            self._trim()

    def _trim(self) -> None:
        self.divergences.sort(key=lambda d: (d.partition, d.offset))
        del self.divergences[MAX_DIVERGENCES:]

    def as_json(self) -> dict[str, Any]:
        return {
            "intact": self.intact,
            "topic": self.topic,
            "schema": self.schema,
            "consumer": self.consumer,
            "first_divergence": None if self.first is None else self.first.as_json(),
            "divergence_count": self.divergence_count,
            "divergences": [d.as_json() for d in self.divergences],
            "partitions": [p.as_json() for p in self.partitions],
            "events_checked": self.events_checked,
            "dead_letters_checked": self.dead_letters_checked,
            "sealed_unopened": self.sealed_unopened,
            "trusted_keys": self.trusted_keys,
            "chained": self.chained,
            "notes": self.notes,
        }


# -- pure: what an events row must hold -------------------------------------------------------------------------


def expected_event_row(event: MemoryEvent, key_id: str | None, logged_at: datetime | None = None) -> dict[str, Any]:
    """The `events` columns the recorder writes for `event` (its opened form; `key_id`: the data key that sealed it;
    `logged_at`: its record's timestamp, kept for an erasure).

    `memory_id` is left out for a retraction of one version (the recorder may file it under an episode it finds in
    the database); the payload as JSON reads it back."""
    wire = event.to_wire()
    row: dict[str, Any] = {
        "tenant": event.tenant,
        "event_id": event.event_id,
        "fingerprint": wire_fingerprint(wire),
        "subject": event.subject,
        "type": event.type.value,
        "kind": event.kind.value,
        "key": event.key,
        "scope": event.scope,
        "observed_at": event.observed_at,
        "valid_from": event.valid_from,
        "valid_to": event.valid_to,
        "target_version": event.target_version,
        "payload": orjson.loads(orjson.dumps(wire)),
        "key_id": key_id,
        "logged_at": logged_at if event.type is EventType.ERASED else None,
    }
    if route(event.type) in _NO_FACT:
        row["memory_id"] = None
    elif not (event.type is EventType.RETRACTED and event.target_version):
        row["memory_id"] = event.memory_id
    return row


def row_differences(expected: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """The columns of `expected` whose stored value differs, in column order."""
    return [c for c in EVENT_COLUMNS if c in expected and expected[c] != stored.get(c)]


# -- the run ----------------------------------------------------------------------------------------------------


def trusted_keys(settings: Settings) -> dict[str, bytes]:
    """key id -> public key: the configured signing key's public half and `chain_trusted_keys`."""
    out: dict[str, bytes] = {}
    signer = load_signer(settings.chain_key_file)
    if signer is not None:
        out[signer.key_id] = signer.public
    for text in settings.chain_trusted_keys:
        public = parse_public_key(text)
        out[key_id(public)] = public
    return out


def _broker_answers(settings: Settings, wait_s: float) -> bool:
    """`probe`, without kafka-python's line for each connection it retries meanwhile (its answer is the one line a
    broker away gets); at DEBUG they stay. A broker away leaves them quiet: the probe's thread may go on retrying
    for about its wait again after its answer, while the caller reports it."""
    chatty = logging.getLogger("kafka")
    level = chatty.level
    if settings.log_level != "DEBUG":
        chatty.setLevel(logging.CRITICAL)
    answered = probe(settings, timeout=wait_s)
    if answered:
        chatty.setLevel(level)
    return answered


def verify(settings: Settings, *, batch_size: int = 2000) -> VerifyReport:
    """Verify `settings.topic` against the chain, the checkpoints and the projection in `settings.pg_schema`."""
    consumer, topic = settings.processor_group, settings.topic
    wait_s = max(1.0, settings.producer_timeout_s)
    if not _broker_answers(settings, wait_s):  # at once, as `ledger topics` finds it, not after the stall's wait
        raise KafkaTimeoutError(f"no broker of {settings.kafka_bootstrap} answered within {wait_s:g} s")
    report = VerifyReport(topic=topic, schema=settings.pg_schema, consumer=consumer)
    trusted = trusted_keys(settings)
    report.trusted_keys = sorted(trusted)
    if not trusted:
        report.notes.append(
            "no trusted chain key configured (LEDGER_CHAIN_KEY_FILE, LEDGER_CHAIN_TRUSTED_KEYS): checkpoint "
            "signatures are checked against the public keys stored with them only"
        )
    decode = Recorder.decoder(settings)
    stall_s = max(30.0, 2 * settings.producer_timeout_s)  # a broker that delivers nothing this long: KafkaTimeoutError
    # a server that takes the connection and never answers ends in connect_timeout, as every other command's does
    with connect(settings.pg_dsn, settings.pg_schema, connect_timeout=settings.pg_connect_timeout_s) as conn:
        try:
            recorder = Recorder.for_settings(settings, conn)
        except KekError as exc:  # the chain needs no secret: go on, checking sealed records on their clear fields
            conn.rollback()
            recorder = Recorder(conn, consumer=consumer, topic=topic)
            report.notes.append(f"sealed records are not opened ({exc}): checked on their clear fields only")
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            positions = stored_positions(cur, consumer, topic)
            heads: dict[int, Head] = {}
            checkpoints: list[Checkpoint] = []
            starts: dict[int, int] = {}
            tables = cur.execute(
                "SELECT to_regclass('chain_heads') IS NOT NULL, to_regclass('chain_starts') IS NOT NULL"
            ).fetchone()
            if tables and tables[0]:
                heads = read_heads(cur, consumer, topic)
                checkpoints = read_checkpoints(cur, consumer, topic)
            else:
                report.chained = False
                report.notes.append("the schema has no chain: a worker of this version adds it at its start")
            if tables and tables[1]:
                starts = read_starts(cur, consumer, topic)
            valid = _check_signatures(report, topic, checkpoints, trusted)
            kafka = KafkaConsumer(
                **kafka_connection(settings),
                group_id=None,
                enable_auto_commit=False,
                max_poll_records=batch_size,
                request_timeout_ms=max(1000, int(settings.producer_timeout_s * 1000)),
            )
            try:
                for p in sorted({p for p, o in positions.items() if o > 0} | set(heads)):
                    part = PartitionReport(p, positions.get(p, 0), head=heads.get(p), start=starts.get(p, 0))
                    part.checkpoints = sum(1 for cp in checkpoints if cp.head.partition == p)
                    mine = [cp for cp in valid if cp.head.partition == p]
                    part.checkpoints_valid = len(mine)
                    _check_partition(report, part, kafka, cur, recorder, decode, mine, batch_size, stall_s)
                    report.partitions.append(part)
            finally:
                kafka.close()
            _check_versions(report, cur, recorder, positions)
    report._trim()
    return report


def _check_signatures(
    report: VerifyReport, topic: str, checkpoints: list[Checkpoint], trusted: dict[str, bytes]
) -> list[Checkpoint]:
    """The checkpoints whose signature verifies (under a trusted key, when any is trusted); the others reported."""
    valid = []
    for cp in checkpoints:
        h = cp.head
        if not checkpoint_valid(topic, cp):
            report.diverged(
                Divergence(
                    "signature",
                    h.partition,
                    h.offset,
                    f"the checkpoint of {h.count} records at offset {h.offset} does not verify under key {cp.key_id}",
                )
            )
        elif trusted and trusted.get(cp.key_id) != cp.public_key:
            report.diverged(
                Divergence(
                    "untrusted_key",
                    h.partition,
                    h.offset,
                    f"the checkpoint at offset {h.offset} is signed by key {cp.key_id}, which is not trusted",
                )
            )
        else:
            valid.append(cp)
    return valid


def _partition_records(
    kafka: KafkaConsumer, tp: TopicPartition, start: int, upto: int, batch_size: int, stall_s: float
) -> Iterator[list[Any]]:
    """The records of `tp` from `start` below `upto`, in log order, in polled batches; KafkaTimeoutError when the
    broker delivers nothing for `stall_s` seconds."""
    kafka.assign([tp])
    kafka.seek(tp, start)
    moved = time.monotonic()
    while (at := kafka.position(tp)) < upto:
        polled = kafka.poll(timeout_ms=1000, max_records=batch_size)
        batch = [m for m in polled.get(tp, []) if m.offset < upto]
        if batch:
            yield batch
        if kafka.position(tp) > at:
            moved = time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise KafkaTimeoutError(f"{tp.topic}/{tp.partition}: no record past offset {at} in {stall_s:.0f}s")


def _check_partition(
    report: VerifyReport,
    part: PartitionReport,
    kafka: KafkaConsumer,
    cur: psycopg.Cursor,
    recorder: Recorder,
    decode: Any,
    checkpoints: list[Checkpoint],
    batch_size: int,
    stall_s: float,
) -> None:
    p, position, head = part.partition, part.position, part.head
    tp = TopicPartition(report.topic, p)
    begin = kafka.beginning_offsets([tp])[tp]
    end = kafka.end_offsets([tp])[tp]
    if end < position:
        report.diverged(
            Divergence(
                "missing_record",
                p,
                end,
                f"the log ends at offset {end}, but the stored position says records up to {position - 1} were taken",
            )
        )
    if head is None and position > part.start:
        report.diverged(
            Divergence(
                "unchained",
                p,
                part.start,
                f"no chain head, but the stored position says the records from offset {part.start} to {position - 1} "
                "were taken: " + ("the chain was removed" if report.chained else "the schema predates the chain"),
            )
        )
    chained_from = part.start if head is None else head.first_offset
    if chained_from > 0:
        report.notes.append(
            f"partition {p}: the records before offset {chained_from} predate the chain and are not covered by it "
            "(`ledger rebuild` chains the ledger from offset 0)"
        )
    # every chain of the partition (the head's; a checkpoint of an older chain, carried over by a rebuild)
    attested: dict[int, list[tuple[str, Head]]] = {}  # offset -> what says which link and count it has
    if head is not None:
        attested.setdefault(head.offset, []).append(("head", head))
    for cp in checkpoints:
        attested.setdefault(cp.head.offset, []).append(("checkpoint", cp.head))
    firsts = {h.first_offset for items in attested.values() for _, h in items}
    chains = {f: [GENESIS, 0] for f in firsts}  # first_offset -> [link, count]
    good = {f: f - 1 for f in firsts}  # the last offset each chain was found right at
    broken: set[int] = set()
    if head is not None and begin > min(firsts):
        report.diverged(
            Divergence(
                "missing_record",
                p,
                min(firsts),
                f"the log begins at offset {begin}; the chain covers records from offset {min(firsts)}",
            )
        )
    if head is not None:
        part.last_checkpoint = max(
            (cp.head.offset for cp in checkpoints if cp.head.first_offset == head.first_offset), default=None
        )
    last_taken = -1
    rows = _events_rows(cur, p, position)
    letters = _letter_rows(cur, report.topic, p, position)
    stored_links = _link_rows(cur, report.consumer, report.topic, p, position)  # what receipts cite
    live = None if head is None else head.first_offset
    upto = min(position, end)
    for batch in _partition_records(kafka, tp, begin, upto, batch_size, stall_s) if upto > begin else ():
        part.records += len(batch)
        for m in batch:
            last_taken = m.offset
            for f, state in chains.items():
                if m.offset >= f:
                    state[0] = link(state[0], p, m.offset, m.key, m.value)
                    state[1] += 1
            stored = stored_links.pop(m.offset, None)
            if stored is not None and live is not None and m.offset >= live and stored != chains[live][0]:
                report.diverged(
                    Divergence(
                        "chain",
                        p,
                        m.offset,
                        f"the stored link of offset {m.offset} ({stored.hex()[:16]}…) is not the log's "
                        f"({chains[live][0].hex()[:16]}…): a receipt citing it would not hold",
                        after=m.offset - 1,  # every link before it was checked
                    )
                )
            for what, h in attested.pop(m.offset, ()):
                f = h.first_offset
                if f in broken:
                    continue
                link_now, count_now = chains[f]
                if (link_now, count_now) != (h.head, h.count):
                    broken.add(f)
                    report.diverged(
                        Divergence(
                            "chain",
                            p,
                            m.offset,
                            f"the {what} at offset {m.offset} says {h.count} records with link {h.head.hex()[:16]}…; "
                            f"the log gives {count_now} with {link_now.hex()[:16]}…: a record after offset "
                            f"{good[f]} is not the one the projection took",
                            after=good[f],
                        )
                    )
                else:
                    good[f] = m.offset
        decoded = [decode(m.topic, p, m.offset, m.key, m.value, m.timestamp) for m in batch]
        _check_projection(report, cur, recorder, decoded, rows, letters)
    for offset, items in sorted(attested.items()):  # attested offsets the log no longer holds
        for what, h in items:
            if h.first_offset not in broken:
                report.diverged(
                    Divergence("missing_record", p, offset, f"the {what} covers offset {offset}, which the log lacks")
                )
    if head is not None and last_taken > head.offset:
        report.diverged(
            Divergence(
                "unchained",
                p,
                head.offset + 1,
                f"records up to offset {last_taken} are below the stored position {position} but the chain head is at "
                f"offset {head.offset}",
            )
        )
    for offset in sorted(rows):
        report.diverged(Divergence("projection", p, offset, f"an events row at offset {offset}, which the log lacks"))
    for offset in sorted(letters):
        report.diverged(Divergence("projection", p, offset, f"a dead letter at offset {offset}, which the log lacks"))


def _check_versions(report: VerifyReport, cur: psycopg.Cursor, recorder: Recorder, positions: dict[int, int]) -> None:
    """The version rows against the events rows (each checked against the log before): one row at the place of each
    assertion logged below the positions and none elsewhere, and each fact's chain columns (its end, status,
    successor, number, confirmations) what the fold of its assertions and marks gives (projections.versions.fold),
    as a rebuild would write them. One pass over the tables whatever the partitions; the facts a chunk at a time."""
    below = {"below": orjson.dumps({str(q): n for q, n in positions.items()}).decode()}
    cur.execute(
        'SELECT e."partition", e."offset", e.tenant, e.event_id FROM events e WHERE ' + below_sql("e")
        + " AND e.type = 'memory.asserted' AND NOT EXISTS (SELECT 1 FROM fact_versions f WHERE f.tenant = e.tenant "
        'AND f.event_id = e.event_id AND f."partition" = e."partition" AND f."offset" = e."offset")',
        below,
    )  # fmt: skip
    for p, o, tenant, event_id in cur.fetchall():
        report.diverged(Divergence("projection", p, o, f"the assertion ({tenant!r}, {event_id!r}) has no version row"))
    cur.execute(
        'SELECT f."partition", f."offset", f.version_id FROM fact_versions f WHERE NOT (' + below_sql("f") + " AND "
        "EXISTS (SELECT 1 FROM events e WHERE e.tenant = f.tenant AND e.event_id = f.event_id AND "
        "e.type = 'memory.asserted' AND e.\"partition\" = f.\"partition\" AND e.\"offset\" = f.\"offset\"))",
        below,
    )  # fmt: skip
    for p, o, version_id in cur.fetchall():
        report.diverged(Divergence("projection", p, o, f"the version row {version_id} has no assertion logged there"))
    with cur.connection.cursor(name="verify_facts") as facts:  # server-side: the fact ids are never held whole
        facts.itersize = _FACTS_PER_READ
        facts.execute("SELECT DISTINCT memory_id FROM fact_versions ORDER BY 1")
        while chunk := [row[0] for row in facts.fetchmany(_FACTS_PER_READ)]:
            stored, marks = recorder.load_versions(cur, chunk), recorder.load_marks(cur, chunk)
            for memory_id in chunk:
                held = {v.version_id: v for v in stored[memory_id]}
                for v in fold(held.values(), marks.get(memory_id, ())):
                    was = held[v.version_id].derived()
                    wrong = [c for c, a, b in zip(DERIVED, v.derived(), was, strict=True) if a != b]
                    if wrong:
                        report.diverged(
                            Divergence(
                                "projection", v.partition, v.offset,
                                f"the version row of offset {v.offset} does not hold what its fact's events fold "
                                "to: " + ", ".join(wrong),
                            )
                        )  # fmt: skip


_FACTS_PER_READ = 1000  # facts whose chains one statement reads (verify holds one chunk at a time)


def _events_rows(cur: psycopg.Cursor, partition: int, position: int) -> dict[int, dict[str, Any]]:
    cols = ", ".join(f'"{c}"' for c in EVENT_COLUMNS)
    cur.execute(
        f'SELECT "offset", {cols} FROM events WHERE "partition" = %s AND "offset" < %s',
        (partition, position),
    )
    return {row[0]: dict(zip(EVENT_COLUMNS, row[1:], strict=True)) for row in cur.fetchall()}


def _link_rows(cur: psycopg.Cursor, consumer: str, topic: str, partition: int, position: int) -> dict[int, bytes]:
    found = cur.execute("SELECT to_regclass('chain_links') IS NOT NULL").fetchone()
    if not (found and found[0]):  # a schema no worker of this version started on yet
        return {}
    cur.execute(
        'SELECT "offset", link FROM chain_links WHERE consumer = %s AND topic = %s AND "partition" = %s '
        'AND "offset" < %s',
        (consumer, topic, partition, position),
    )
    return {o: bytes(h) for o, h in cur.fetchall()}


def _letter_rows(cur: psycopg.Cursor, topic: str, partition: int, position: int) -> dict[int, bytes | None]:
    cur.execute(
        'SELECT "offset", raw FROM dead_letters WHERE topic = %s AND "partition" = %s AND "offset" < %s',
        (topic, partition, position),
    )
    return {o: None if raw is None else bytes(raw) for o, raw in cur.fetchall()}


def last_erasures(rows: dict[int, dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Each erased (tenant, subject) of one partition's events rows -> the offset of its last erasure, which took the
    letters of the records naming it before it. The rows come in no order: of two erasures, the later counts."""
    erasures: dict[tuple[str, str], int] = {}
    for offset, row in rows.items():
        if row["type"] == EventType.ERASED.value:
            named = (row["tenant"], row["subject"])
            erasures[named] = max(offset, erasures.get(named, -1))
    return erasures


def _check_projection(
    report: VerifyReport,
    cur: psycopg.Cursor,
    recorder: Recorder,
    decoded: list[Incoming],
    rows: dict[int, dict[str, Any]],
    letters: dict[int, bytes | None],
) -> None:
    """Account for each record of one partition's batch (`rows` and `letters` lose the ones matched)."""
    erasures = last_erasures(rows)
    unopened = {r.offset for r in decoded if r.envelope is not None and recorder.keys is None}
    openable = [r for r in decoded if r.offset not in unopened]
    opened = {r.offset: r for r in recorder.open_sealed(cur, openable, BatchResult())[0]}  # shredded ones drop out
    unaccounted: list[tuple[int, str, str, str | None]] = []  # offset, tenant, event_id, fingerprint (None: unopened)
    for r in decoded:
        p, o = r.partition, r.offset
        row, letter = rows.pop(o, None), letters.pop(o, _ABSENT)
        if letter is not _ABSENT:
            report.dead_letters_checked += 1
            if letter != r.raw and not (letter is None and _erased_in_another_partition(cur, r)):
                report.diverged(Divergence("projection", p, o, "the dead letter's bytes are not the record's"))
            if row is not None:
                report.diverged(Divergence("projection", p, o, "the record is both an events row and a dead letter"))
            continue
        if o in unopened:
            report.sealed_unopened += 1
            clear = r.envelope.clear if r.envelope is not None else {}
            if row is not None:
                report.events_checked += 1
                wrong = [c for c in _CLEAR_COLUMNS if c in clear and clear[c] != row.get(c)]
                if row.get("key_id") != r.key_id:
                    wrong.append("key_id")
                if wrong:
                    report.diverged(_row_differs(p, o, wrong))
            elif isinstance(clear.get("tenant"), str) and isinstance(clear.get("event_id"), str):
                unaccounted.append((o, clear["tenant"], clear["event_id"], None))
            continue
        x = opened.get(o)
        if x is None:  # sealed with a key an erasure destroyed: the erasure accounts for it
            if row is not None:
                report.diverged(Divergence("projection", p, o, "an events row of a record whose data key is destroyed"))
            continue
        if row is None and erasures.get((letter_tenant(x), claimed_subject(x, keyed=True)), -1) > o:
            continue  # its subject erased since: the erasure took its row, or its letter (a refused record's)
        if x.event is None:
            report.diverged(
                Divergence(
                    "projection",
                    p,
                    o,
                    f"an invalid record ({x.error.code if x.error else 'unreadable'}) with no dead letter"
                    + (" but an events row" if row is not None else ""),
                )
            )
            continue
        if row is not None:
            report.events_checked += 1
            expected = expected_event_row(x.event, x.key_id, x.timestamp)
            if expected["logged_at"] is not None and row["logged_at"] is None:
                del expected["logged_at"]  # an erasure logged before the recorder kept its timestamp
                report.notes.append(
                    f"partition {p} offset {o}: an erasure without its log time (logged before the column; the "
                    "recorder covers other partitions by the later of its observed and recorded times; "
                    "`ledger rebuild` writes it)"
                )
            wrong = row_differences(expected, row)
            if wrong:
                report.diverged(_row_differs(p, o, wrong))
            continue
        unaccounted.append((o, x.event.tenant, x.event.event_id, x.event.fingerprint))
    if unaccounted:
        _account(report, cur, decoded[0].partition, unaccounted)


_ABSENT: Any = object()


def _erased_in_another_partition(cur: psycopg.Cursor, record: Incoming) -> bool:
    """Whether an erasure in a partition other than `record`'s names the subject its letter is filed under: the
    letter then keeps no bytes (projections.postgres.recorder, `_erase` and `Recorder.dead_letters`)."""
    tenant, subject = letter_tenant(record), claimed_subject(record, keyed=True)
    if not tenant or subject is None:
        return False
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM events WHERE tenant = %s AND subject = %s AND type = 'subject.erased' "
        'AND "partition" <> %s)',
        (tenant, subject, record.partition),
    )
    return bool(cur.fetchone()[0])  # type: ignore[index]


def _row_differs(partition: int, offset: int, columns: list[str]) -> Divergence:
    return Divergence(
        "projection",
        partition,
        offset,
        f"the events row at offset {offset} does not hold what the record says: {', '.join(columns)}",
    )


def _account(
    report: VerifyReport, cur: psycopg.Cursor, partition: int, unaccounted: list[tuple[int, str, str, str | None]]
) -> None:
    """Valid records with no row at their position: a duplicate of an applied event, or of an erased one."""
    tenants = [t for _, t, _, _ in unaccounted]
    ids = [i for _, _, i, _ in unaccounted]
    cur.execute(
        "SELECT tenant, event_id, fingerprint FROM events "
        "WHERE (tenant, event_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))",
        (tenants, ids),
    )
    applied = {(t, i): fp for t, i, fp in cur.fetchall()}
    cur.execute(erased_sql(with_fingerprints=False), (tenants, ids))
    erased = set(cur.fetchall())
    for offset, tenant, event_id, fp in unaccounted:
        if (tenant, event_id) in erased:
            continue
        if (tenant, event_id) in applied and fp in (None, applied[(tenant, event_id)]):
            continue
        why = "another content is applied under its id" if (tenant, event_id) in applied else "no row, no dead letter"
        report.diverged(
            Divergence(
                "projection",
                partition,
                offset,
                f"the record ({tenant!r}, {event_id!r}) is below the stored position but not in the projection: {why}",
            )
        )


def render(report: VerifyReport) -> str:
    """The report for a terminal: one line per partition, then the verdict and the first divergences."""
    lines = [f"ledger verify: topic {report.topic}, schema {report.schema}, consumer {report.consumer}"]
    for part in report.partitions:
        h = part.head
        chained = (
            "no chain head"
            if h is None
            else (
                f"chain of {h.count:,} from offset {h.first_offset}, head at offset {h.offset} ({h.head.hex()[:16]}…)"
            )
        )
        lines.append(
            f"  partition {part.partition}: position {part.position:,}, records read {part.records:,}, {chained}, "
            f"{part.checkpoints_valid}/{part.checkpoints} checkpoints valid"
            + ("" if part.last_checkpoint is None else f" (last at offset {part.last_checkpoint})")
        )
    lines.append(
        f"  {report.events_checked:,} events rows and {report.dead_letters_checked:,} dead letters checked against "
        f"their records" + (f", {report.sealed_unopened:,} sealed records unopened" if report.sealed_unopened else "")
    )
    lines += [f"  note: {n}" for n in report.notes]
    if report.intact:
        lines.append("intact")
        return "\n".join(lines)
    shown = min(10, len(report.divergences))
    lines.append(
        f"DIVERGED: {report.divergence_count} divergence(s)"
        + (":" if shown == report.divergence_count else f"; the first {shown}:")
    )
    for d in report.divergences[:10]:
        after = "" if d.after is None else f" (after offset {d.after})"
        lines.append(f"  partition {d.partition} offset {d.offset}{after} [{d.kind}]: {d.message}")
    return "\n".join(lines)
