"""A positioned projection: a topic's records applied to PostgreSQL exactly once, whatever the projection writes.

The ledger's Recorder and the AccessProjector are this base plus their `decoder` and `apply`; everything else is
here once, the same live and in `ledger rebuild`. A batch's rows and positions commit together, after the position
rows are locked and records below them skipped, so a redelivery has no effect. Invalid records are dead-lettered in
the same transaction (the DLQ topic gets them at least once, the table exactly once). A record that fails on every
attempt is bisected out and dead-lettered as `unstorable`, so it never stalls the partition; deadlocks are retried
here, other transient failures by the caller. docs/INTERNALS.md, "PostgreSQL" (Writers).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import psycopg
from psycopg import errors as pg_errors

from producers.contract import InvalidEvent, keyed_subject, named_subject
from producers.logs import record_ids
from producers.records import DeadLetter
from producers.retry import retry
from projections.postgres import connection
from projections.postgres.chain import Checkpoints, advance_chain
from projections.postgres.counts import add_counts, dead_letters_name
from projections.postgres.positions import advance_positions, lock_positions, stored_positions

if TYPE_CHECKING:
    from producers.settings import Settings

__all__ = [
    "CoreRefused",
    "DlqSink",
    "PositionedProjection",
    "PositionedRecord",
    "PositionedResult",
    "connect",
    "dead_letter_text",
    "insert_dead_letters",
    "is_permanent",
    "letter_tenant",
    "unstorable",
]

DlqSink = Callable[[Sequence[DeadLetter]], None]
# topic, partition, offset, key, value, timestamp (ms): what the worker's agents and the rebuild read off Kafka
Decode = Callable[[str, int, int, bytes | None, bytes | None, int | None], Any]

# SQLSTATE classes that no retry changes: 21 cardinality violation (a statement given rows of one batch that
# collide with each other: a writer's bug, but bisection parts the records, which then apply one by one, where a
# retry would stall every partition; one that fails alone is dead-lettered, re-drivable), 22 data exception (e.g.
# 22P05 untranslatable character, 22003 numeric out of range), 23 integrity constraint violation, 54 program limit
# exceeded (a value too large for an index or a tsvector; psycopg files it under OperationalError).
_PERMANENT_DB = (
    pg_errors.CardinalityViolation,
    psycopg.DataError,
    psycopg.IntegrityError,
    pg_errors.ProgramLimitExceeded,
)


class CoreRefused(Exception):
    """The pure core raised on the records it was given (ValueError, TypeError, KeyError): permanent.

    Only errors raised inside a pure-core call are wrapped: the same exception types from the
    recorder's own code (a bug, a deploy that does not match the schema) stay retryable, so a bug
    never dead-letters good records (but a statement that refuses a batch's rows for colliding with each other:
    `_PERMANENT_DB`).
    """


def is_permanent(exc: BaseException) -> bool:
    """True if applying the same records again fails the same way: dead-letter, do not retry.

    Everything else (a lost connection, an admin shutdown, a deadlock, a serialization failure, a
    lock or statement timeout, a DLQ topic that does not answer, an unknown bug) is retried.
    """
    return isinstance(exc, (*_PERMANENT_DB, CoreRefused))


class PositionedRecord(Protocol):
    """One decoded Kafka record (a frozen dataclass): exactly one of event/error is set once it is judged."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def raw(self) -> bytes | None: ...
    @property
    def event(self) -> Any: ...
    @property
    def error(self) -> InvalidEvent | None: ...


@dataclass
class PositionedResult:
    """What one or more transactions over a batch did; a projection's own subclass adds its counters (ints)."""

    applied: int = 0  # records whose effect is new
    duplicates: int = 0  # valid records already applied under another offset (no effect)
    skipped: int = 0  # records below the stored position
    dead: int = 0  # newly dead-lettered records
    dead_codes: dict[str, int] = field(default_factory=dict)  # reason code -> how many of `dead` (metrics)
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next_offset after the batch
    # the counters' changes written with the rows (projections.postgres.counts), the new dead letters (logged)
    counts: Counter = field(default_factory=Counter, repr=False)
    letters: list[DeadLetter] = field(default_factory=list, repr=False)

    def add(self, other: PositionedResult) -> None:
        """Fold in the result of another transaction over later records (bisection): sums, furthest positions."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "positions":
                for p, o in theirs.items():
                    mine[p] = max(mine.get(p, 0), o)
            elif isinstance(mine, dict):  # dead_codes, counts
                for k, n in theirs.items():
                    mine[k] = mine.get(k, 0) + n
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, f.name, mine + theirs)


R = TypeVar("R", bound=PositionedRecord)
Res = TypeVar("Res", bound=PositionedResult)


class PositionedProjection(Generic[R, Res]):
    """Writes batches of one topic for one consumer (group) into the schema the connection points at.

    A projection sets `result_type` and supplies `topic_of`, `decoder` and `apply`; `prepare` may judge records
    further in the transaction (the ledger opens sealed ones there) before the invalid ones are dead-lettered.
    """

    result_type: ClassVar[type[PositionedResult]] = PositionedResult
    # True: every record taken extends its partition's chain in the batch's transaction (projections.postgres.chain)
    chained: ClassVar[bool] = False
    # True: records are keyed `tenant|subject` (contract.kafka_key), so a refused record naming no subject an event
    # could name is filed under its key's subject, and goes with that subject's erasure
    keyed_by_subject: ClassVar[bool] = False
    # the field names a dead letter's log line may show: a path below them, another name, or the reason's words could
    # quote the record (a name or a value of the subject's), and a log is a copy no erasure reaches
    logged_fields: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, conn: psycopg.Connection, *, consumer: str, topic: str, dlq_sink: DlqSink | None = None):
        self.conn = conn
        self.consumer = consumer
        self.topic = topic
        self.dlq_sink = dlq_sink
        self.log = logging.getLogger(type(self).__module__)  # each projection's lines under its own module
        self.checkpoints: Checkpoints | None = None  # a chained projection's signing of its heads (None: heads only)

    # -- what a projection supplies ------------------------------------------------------------
    @classmethod
    def topic_of(cls, settings: Settings) -> str:
        """The topic this projection reads under `settings`."""
        raise NotImplementedError

    @classmethod
    def for_settings(
        cls, settings: Settings, conn: psycopg.Connection, *, dlq_sink: DlqSink | None = None
    ) -> PositionedProjection[R, Res]:
        """The projection the worker runs (and `ledger rebuild` replays through) for `settings`, on `conn`."""
        return cls(conn, consumer=settings.processor_group, topic=cls.topic_of(settings), dlq_sink=dlq_sink)

    @classmethod
    def decoder(cls, settings: Settings) -> Decode:
        """A pure function (topic, partition, offset, key, value, timestamp_ms) -> record, for any thread."""
        raise NotImplementedError

    def prepare(self, cur: psycopg.Cursor, records: list[R], result: Res) -> list[R]:
        """The records above the stored positions, judged further in the transaction; the ones to go on with."""
        return records

    def apply(self, cur: psycopg.Cursor, records: list[R], result: Res, shard: int) -> None:
        """Write the valid records' rows (ledger order per partition) and count them in `result`.

        `shard`: the batch's lowest partition, whose position row this transaction holds locked.
        """
        raise NotImplementedError

    # -- public: each opens (and retries) its own transaction ---------------------------------
    def apply_batch(self, records: Sequence[R], *, attempts: int = 5) -> Res:
        """Apply records (any partitions of self.topic, ledger order within a partition) exactly once.

        A poison record is dead-lettered (`unstorable`) and the others applied; a transient failure raises.
        """
        records = [r for r in records if r.topic == self.topic]
        try:
            return self._commit(records, attempts)
        except Exception as exc:
            if not is_permanent(exc):
                raise
            self.log.warning("batch of %d records refused (%s: %s); bisecting", len(records), type(exc).__name__, exc)
            result: Res = self.result_type()  # type: ignore[assignment]
            self._bisect(records, exc, result, attempts)
            return result

    def positions(self) -> dict[int, int]:
        """partition -> next_offset stored for this consumer and topic."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            return stored_positions(cur, self.consumer, self.topic)

    # -- poison records ------------------------------------------------------------------------
    def _bisect(self, records: list[R], exc: BaseException, result: Res, attempts: int) -> None:
        """`records` failed with the permanent `exc`: apply what can be applied, in ledger order."""
        if len(records) == 1:
            dead = unstorable(records[0], exc)
            # its ids as its bytes claim them, the way every dead letter's are read (any projection's record)
            self.log.error(
                "record %s/%d/%d is unstorable: %s",
                dead.topic,
                dead.partition,
                dead.offset,
                exc,
                extra=record_ids(dead),
            )
            result.add(self._commit([dead], attempts))
            return
        mid = len(records) // 2
        for half in (records[:mid], records[mid:]):  # halves of a list keep each partition's order
            try:
                result.add(self._commit(half, attempts))
            except Exception as again:
                if not is_permanent(again):
                    raise
                self._bisect(half, again, result, attempts)

    def _commit(self, records: list[R], attempts: int) -> Res:
        """One transaction over `records` with their positions; deadlocks and serialization failures retried."""

        def once() -> Res:
            with self.conn.transaction(), self.conn.cursor() as cur:
                result = self._transaction(cur, records)
            self._log_dead_letters(result.letters)  # committed: each once
            return result

        def retried(exc: BaseException, attempt: int) -> None:
            self.log.warning("batch retried after %s (attempt %d)", type(exc).__name__, attempt)

        races = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
        return retry(once, attempts=attempts, retry_on=races, step_s=0.05, on_retry=retried)

    # -- inside the transaction ----------------------------------------------------------------
    def _transaction(self, cur: psycopg.Cursor, records: Sequence[R]) -> Res:
        result: Res = self.result_type()  # type: ignore[assignment]
        if not records:
            return result
        # the first statement of every batch touches `positions` (a schema switch by ledger rebuild waits it out)
        stored = lock_positions(cur, self.consumer, self.topic, sorted({r.partition for r in records}))
        fresh: list[R] = []
        seen: set[tuple[int, int]] = set()
        for r in records:
            if r.offset < stored[r.partition] or (r.partition, r.offset) in seen:
                result.skipped += 1
                continue
            seen.add((r.partition, r.offset))
            fresh.append(r)
        if self.chained and fresh:  # before prepare, which may drop records: every record taken is chained
            advance_chain(cur, self.consumer, self.topic, fresh, self.checkpoints)
        fresh = self.prepare(cur, fresh, result)
        if fresh:
            self.dead_letters(cur, [r for r in fresh if r.event is None], result)
            self.apply(cur, [r for r in fresh if r.event is not None], result, min(stored))
        ends: dict[int, int] = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        result.positions = {p: max(stored[p], end) for p, end in ends.items()}
        advance_positions(cur, self.consumer, self.topic, result.positions)
        add_counts(cur, result.counts, shard=min(stored))  # a shard whose position row this transaction holds
        if result.letters and self.dlq_sink is not None:
            self.dlq_sink(result.letters)  # last, just before the commit: raises if the DLQ topic did not take them
        return result

    def dead_letters(self, cur: psycopg.Cursor, invalid: list[R], result: Res) -> list[DeadLetter]:
        """Record the invalid records once each, counted; returns the new ones (also in `result.letters`)."""
        if not invalid:
            return []
        new = insert_dead_letters(cur, invalid, keyed=self.keyed_by_subject)
        letters = [DeadLetter(r, r.error) for r in invalid if (r.partition, r.offset) in new]  # type: ignore[arg-type]
        result.dead += len(letters)
        for letter in letters:  # each under the tenant it names (counts.py), none it cannot be read from
            result.counts[(letter_tenant(letter.record), dead_letters_name(self.topic))] += 1
            result.dead_codes[letter.error.code] = result.dead_codes.get(letter.error.code, 0) + 1
        result.letters.extend(letters)
        return letters

    def _log_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """One line per dead letter, after its transaction committed, with the record's ids (producers.logs): its
        code and the contract field it concerns (`logged_fields`); the whole reason is the letter's."""
        for letter in letters:
            r, err = letter.record, letter.error
            top = (err.field or "").split(".")[0]
            field = top if top in self.logged_fields else None
            self.log.warning(
                "dead letter %s/%d/%d: %s%s (its reason: the letter's, GET /v1/dead-letters/%d/%d)",
                r.topic,
                r.partition,
                r.offset,
                err.code,
                f" ({field})" if field else "",
                r.partition,
                r.offset,
                extra={**record_ids(r), "code": err.code, "field": field},
            )


def insert_dead_letters(cur: psycopg.Cursor, invalid: Sequence[Any], *, keyed: bool = False) -> set[tuple[int, int]]:
    """Record refused records (topic, partition, offset, error, raw) once each; the new (partition, offset) pairs.
    `keyed`: the records' Kafka keys name their subjects (`claimed_subject`)."""
    ids = [record_ids(r) for r in invalid]  # as the record claims them: an event's fate is asked by its id
    cur.execute(
        'INSERT INTO dead_letters (topic, "partition", "offset", code, field, message, raw, tenant, event_id, subject) '
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
        '%b::bytea[], %b::text[], %b::text[], %b::text[]) ON CONFLICT DO NOTHING RETURNING "partition", "offset"',
        (
            [r.topic for r in invalid],
            [r.partition for r in invalid],
            [r.offset for r in invalid],
            [dead_letter_text(r.error.code) for r in invalid],
            [dead_letter_text(r.error.field) for r in invalid],
            [dead_letter_text(r.error.message) for r in invalid],
            [r.raw for r in invalid],
            [dead_letter_text(i.get("tenant")) for i in ids],
            [dead_letter_text(i.get("event_id")) for i in ids],
            [claimed_subject(r, keyed=keyed) for r in invalid],
        ),
    )
    return set(cur.fetchall())


def claimed_subject(record: Any, *, keyed: bool = False) -> str | None:
    """The subject a refused record names: its event's, else its JSON's if an event could name it (the contract's
    `named_subject`), else, `keyed` (a ledger record), its Kafka key's when the key is the tenant's it claims (a
    record naming no subject, or a NUL in it, is still filed under the subject it was sent for), else None, so that
    only an erasure of that very subject takes its letter. Never logged (producers.logs.record_ids leaves it out)."""
    event = getattr(record, "event", None)
    if event is not None:
        subject = getattr(event, "subject", None)  # an access record names none
        return subject if isinstance(subject, str) else None
    named = named_subject(record.raw)
    if named is None and keyed:
        return keyed_subject(record.key, record_ids(record).get("tenant"))
    return named


def letter_tenant(record: Any) -> str:
    """The tenant a dead letter is counted under (projections.postgres.counts): the one its record claims, as
    `dead_letters.tenant` stores it; '' (no tenant's) when none can be read."""
    return dead_letter_text(record_ids(record).get("tenant")) or ""


def dead_letter_text(text: str | None) -> str | None:
    """Text PostgreSQL will take: NUL and lone surrogates spelled out (a dead letter must never fail)."""
    if text is None:
        return None
    return text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable(record: R, exc: BaseException) -> R:
    """The record as a dead letter with code `unstorable`: the database's (or the core's) reason."""
    if isinstance(exc, psycopg.Error):
        diag = exc.diag
        message = f"{diag.sqlstate or ''} {diag.message_primary or str(exc)}".strip()
        if diag.message_detail:
            message += f" ({diag.message_detail})"
        field_name = diag.column_name
    else:
        cause = exc.__cause__ if isinstance(exc, CoreRefused) and exc.__cause__ is not None else exc
        message, field_name = f"{type(cause).__name__}: {cause}", None
    error = InvalidEvent("unstorable", message[:1000], field_name)
    return dataclasses.replace(record, event=None, error=error)  # type: ignore[type-var]


def connect(dsn: str, schema: str, **kwargs: Any) -> psycopg.Connection:
    """A connection for a positioned projection: search_path on the projection schema, no prepared statements.

    Statements are not prepared, so names are resolved per statement: `ledger rebuild` can rename
    schemas under a running worker.
    """
    conn = connection.connect(dsn, schema, prepare_threshold=None, **kwargs)
    conn.execute("SET TimeZone TO 'UTC'")
    conn.commit()
    return conn
