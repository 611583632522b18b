"""Apply a batch of Kafka records to the projection in ONE transaction with the consumer position.

Exactly-once effect: the batch's rows and the positions (consumer, topic, partition -> next_offset)
commit together. The position rows are locked first (FOR UPDATE, in partition order), records
below the stored position are skipped (redelivery after a crash, or another worker that already
applied them during a rebalance), and each fact is recomputed under
`pg_advisory_xact_lock(hashtextextended(memory_id, 0))` (a plain SELECT ... FOR
UPDATE races when two writers create a fact's first version).

Idempotency is keyed by (tenant, event_id) (`events` primary key): another tenant's event with
the same id is an independent event. Same tenant and id with the same `MemoryEvent.fingerprint`
is a duplicate (no effect); with another fingerprint it is a conflict: dead-lettered with code
`event_id_conflict` (field `event_id`), never applied, never silently dropped. Dispatch on the
event type is `projections.versions.route` (exhaustive).

Erasure (`subject.erased`): the subject's versions, events and pending search upserts are purged;
the ids of its events (and their fingerprints) are kept as salted hashes in `erased_events` first,
so a re-sent pre-erasure event has no effect (`erased_replays`), other content under an erased id is
a conflict (`event_id_conflict`), and new events about the subject apply. The doors' claims of the
purged ids (`event_claims`) go with them.
`pg_notify('memory_ledger_erasure', {schema, tenant, subject})` runs in the same transaction,
so API processes drop cached vocabulary when it commits.

Dead letters: an invalid record is written to `dead_letters` (once per topic/partition/offset) in
the same transaction and handed to `dlq_sink` just before the commit, so the DLQ topic gets it at
least once and the table counts it exactly once.

Poison records: a failure that will happen again on every attempt (`is_permanent`: PostgreSQL
refuses the data, a constraint, a deterministic error of the pure core) is not retried. The batch
is bisected, each half applied in its own transaction with its positions (a half keeps ledger
order per partition), until the single failing record is found; it is dead-lettered with code
`unstorable` (the database's message) and the records after it are applied. Transient failures
(connection, deadlock, DLQ topic down) propagate to the caller, which retries the whole batch:
the halves that already committed are below the stored positions and are skipped.

Public methods open the transaction; underscore twins take a cursor, so several writes share one transaction.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb

from producers.contract import EventType, InvalidEvent, MemoryEvent, wire_fingerprint
from producers.keys.envelope import has_personal
from producers.keys.store import (
    ErasureRecord,
    KeyContext,
    destroy_subject_keys,
    erasure_recorded,
    key_states,
    record_erasure,
)
from producers.logs import record_ids
from producers.records import DeadLetter, Incoming, open_record
from projections.postgres import connection
from projections.postgres.accesses import active_transitions, erase_accesses, transition_deltas
from projections.postgres.counts import EVENTS, OUTBOX, VERSIONS, add_counts, dead_letters_name
from projections.postgres.idempotency import FP_HASH_SQL, ID_HASH_SQL, erased_sql
from projections.postgres.positions import advance_positions, lock_positions, stored_positions
from projections.versions import Mark, Route, Version, additions, fact_of, plan, route

__all__ = [
    "ERASURE_CHANNEL",
    "BatchResult",
    "CoreRefused",
    "Recorder",
    "connect",
    "dead_letter_text",
    "is_permanent",
    "unstorable",
]

log = logging.getLogger(__name__)

ERASURE_CHANNEL = "memory_ledger_erasure"  # LISTEN for {schema, tenant, subject} after each erasure commits
MARK_TYPES = (EventType.RETRACTED.value, EventType.CONFIRMED.value)
VERSION_COLUMNS = (
    "version_id event_id memory_id tenant subject key scope kind value content entities aliases tags source confidence "
    "importance observed_at valid_from asserted_valid_to partition offset valid_to status superseded_by "
    "superseded_at version confirmed_count last_confirmed_at"
).split()
_Q = [sql.Identifier(c) for c in VERSION_COLUMNS]


@dataclass
class BatchResult:
    applied: int = 0  # events recorded (new (tenant, event_id))
    duplicates: int = 0  # valid events whose (tenant, event_id) was already known with the same fingerprint
    conflicts: int = 0  # same (tenant, event_id), another fingerprint: dead-lettered as event_id_conflict
    erased_replays: int = 0  # re-sent events of an erased subject: no effect, not stored
    skipped: int = 0  # records below the stored position
    dead: int = 0  # newly dead-lettered records
    dead_codes: dict[str, int] = field(default_factory=dict)  # reason code -> how many of `dead` (metrics)
    versions_written: int = 0
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next_offset after the batch
    # the counters' changes written with the rows (projections.postgres.counts), the new dead letters (logged)
    counts: Counter = field(default_factory=Counter, repr=False)
    letters: list[DeadLetter] = field(default_factory=list, repr=False)

    def add(self, other: BatchResult) -> None:
        """Fold in the result of another transaction over later records (bisection)."""
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.conflicts += other.conflicts
        self.erased_replays += other.erased_replays
        self.skipped += other.skipped
        self.dead += other.dead
        for code, n in other.dead_codes.items():
            self.dead_codes[code] = self.dead_codes.get(code, 0) + n
        self.versions_written += other.versions_written
        for p, o in other.positions.items():
            self.positions[p] = max(self.positions.get(p, 0), o)
        self.counts.update(other.counts)
        self.letters.extend(other.letters)


DlqSink = Callable[[Sequence[DeadLetter]], None]

# SQLSTATE classes that no retry changes: 22 data exception (e.g. 22P05 untranslatable character,
# 22003 numeric out of range), 23 integrity constraint violation, 54 program limit exceeded (a
# value too large for an index or a tsvector; psycopg files it under OperationalError).
_PERMANENT_DB = (psycopg.DataError, psycopg.IntegrityError, pg_errors.ProgramLimitExceeded)
# deterministic failures of the pure core (projections.versions) on the records it is folding
_CORE_ERRORS = (ValueError, TypeError, KeyError)


class CoreRefused(Exception):
    """The pure core raised on the records it was given (ValueError, TypeError, KeyError): permanent.

    Only errors raised inside a pure-core call are wrapped: the same exception types from the
    recorder's own code (a bug, a deploy that does not match the schema) stay retryable, so a bug
    never dead-letters good records.
    """


def is_permanent(exc: BaseException) -> bool:
    """True if applying the same records again fails the same way: dead-letter, do not retry.

    Everything else (a lost connection, an admin shutdown, a deadlock, a serialization failure, a
    lock or statement timeout, a DLQ topic that does not answer, an unknown bug) is retried.
    """
    return isinstance(exc, (*_PERMANENT_DB, CoreRefused))


def insert_dead_letters(cur: psycopg.Cursor, invalid: Sequence[Any]) -> set[tuple[int, int]]:
    """Record refused records (topic, partition, offset, error, raw) once each; the new (partition, offset) pairs.

    The ledger's recorder and the access projector both keep their refusals here (a redelivery records nothing)."""
    ids = [record_ids(r) for r in invalid]  # as the record claims them: an event's fate is asked by its id
    cur.execute(
        'INSERT INTO dead_letters (topic, "partition", "offset", code, field, message, raw, tenant, event_id) '
        "SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
        '%b::bytea[], %b::text[], %b::text[]) ON CONFLICT DO NOTHING RETURNING "partition", "offset"',
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
        ),
    )
    return set(cur.fetchall())


def letter_tenant(record: Any) -> str:
    """The tenant a dead letter is counted under (projections.postgres.counts): the one its record claims, as
    `dead_letters.tenant` stores it; '' (no tenant's) when none can be read."""
    return dead_letter_text(record_ids(record).get("tenant")) or ""


def dead_letter_text(text: str | None) -> str | None:
    """Text PostgreSQL will take: NUL and lone surrogates spelled out (a dead letter must never fail)."""
    if text is None:
        return None
    return text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable(record: Incoming, exc: BaseException) -> Incoming:
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
    return dataclasses.replace(record, event=None, error=error)


def connect(dsn: str, schema: str, **kwargs) -> psycopg.Connection:
    """A connection for the recorder: search_path on the projection schema, no prepared statements.

    Statements are not prepared, so names are resolved per statement: `ledger rebuild` can rename
    schemas under a running worker.
    """
    conn = connection.connect(dsn, schema, prepare_threshold=None, **kwargs)
    conn.execute("SET TimeZone TO 'UTC'")
    conn.commit()
    return conn


class Recorder:
    """Writes batches for one consumer (group) and topic into the schema the connection points at."""

    def __init__(
        self,
        conn: psycopg.Connection,
        *,
        consumer: str,
        topic: str,
        dlq_sink: DlqSink | None = None,
        keys: KeyContext | None = None,
    ):
        self.conn = conn
        self.consumer = consumer
        self.topic = topic
        self.dlq_sink = dlq_sink
        # issue 13: the key store that opens sealed records and whose subject keys an erasure destroys; None: a
        # sealed record stops the batch (KekError, retried loudly) and an erasure leaves no erasure record
        self.keys = keys
        self._unwrapped: dict[tuple[str, bytes], bytes] = {}  # (key id, wrapped bytes) -> data key: unwrap once

    # -- public: each opens (and retries) its own transaction ---------------------------------
    def apply_batch(self, records: Sequence[Incoming], *, attempts: int = 5) -> BatchResult:
        """Apply records (any partitions of self.topic, ledger order within a partition) exactly once.

        A poison record is dead-lettered (`unstorable`) and the others applied; a transient failure raises.
        """
        records = [r for r in records if r.topic == self.topic]
        try:
            return self._commit(records, attempts)
        except Exception as exc:
            if not is_permanent(exc):
                raise
            log.warning("batch of %d records refused (%s: %s); bisecting", len(records), type(exc).__name__, exc)
            result = BatchResult()
            self._bisect(records, exc, result, attempts)
            return result

    def positions(self) -> dict[int, int]:
        """partition -> next_offset stored for this consumer and topic."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            return self._positions(cur)

    # -- poison records ------------------------------------------------------------------------
    def _bisect(self, records: list[Incoming], exc: BaseException, result: BatchResult, attempts: int) -> None:
        """`records` failed with the permanent `exc`: apply what can be applied, in ledger order."""
        if len(records) == 1:
            (poison,) = records
            log.error(
                "record %s/%d/%d is unstorable: %s",
                poison.topic,
                poison.partition,
                poison.offset,
                exc,
                extra=record_ids(poison),
            )
            result.add(self._commit([unstorable(poison, exc)], attempts))
            return
        mid = len(records) // 2
        for half in (records[:mid], records[mid:]):  # halves of a list keep each partition's order
            try:
                result.add(self._commit(half, attempts))
            except Exception as again:
                if not is_permanent(again):
                    raise
                self._bisect(half, again, result, attempts)

    def _commit(self, records: list[Incoming], attempts: int) -> BatchResult:
        """One transaction over `records` with their positions; deadlocks and serialization failures retried."""
        for attempt in range(1, attempts + 1):
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    result = self._apply_batch(cur, records)
                _log_dead_letters(result.letters)  # committed: each once
                return result
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt == attempts:
                    raise
                log.warning("batch retried after %s (attempt %d)", type(exc).__name__, attempt)
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    # -- cursor twins --------------------------------------------------------------------------
    def _positions(self, cur: psycopg.Cursor) -> dict[int, int]:
        return stored_positions(cur, self.consumer, self.topic)

    def _lock_positions(self, cur: psycopg.Cursor, partitions: list[int]) -> dict[int, int]:
        # the first statement of every batch touches `positions` (a schema switch by ledger rebuild waits it out)
        return lock_positions(cur, self.consumer, self.topic, partitions)

    def _apply_batch(self, cur: psycopg.Cursor, records: Sequence[Incoming]) -> BatchResult:
        result = BatchResult()
        records = [r for r in records if r.topic == self.topic]
        if not records:
            return result
        stored = self._lock_positions(cur, sorted({r.partition for r in records}))
        fresh: list[Incoming] = []
        seen: set[tuple[int, int]] = set()
        for r in records:
            if r.offset < stored[r.partition] or (r.partition, r.offset) in seen:
                result.skipped += 1
                continue
            seen.add((r.partition, r.offset))
            fresh.append(r)
        fresh = self._open(cur, fresh, result)
        letters: list[DeadLetter] = []
        if fresh:
            letters += self._dead_letters(cur, [r for r in fresh if r.event is None], result)
            segment: list[Incoming] = []
            destroyed: set[str] = set()  # keys an erasure earlier in this batch destroyed
            for r in fresh:
                if r.event is None:
                    continue
                if r.key_id is not None and r.key_id in destroyed:  # sealed with a key this batch shredded
                    result.erased_replays += 1
                    continue
                if _route(r) is Route.ERASURE:  # a barrier: what came before it in the batch is applied first
                    self._apply_events(cur, segment, result, letters)
                    segment = []
                    destroyed |= self._erase(cur, r, result, letters)
                else:
                    segment.append(r)
            self._apply_events(cur, segment, result, letters)
        ends: dict[int, int] = {}
        for r in records:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        result.positions = {p: max(stored[p], end) for p, end in ends.items()}
        advance_positions(cur, self.consumer, self.topic, result.positions)
        add_counts(cur, result.counts, shard=min(stored))  # a shard whose position row this transaction holds
        if letters and self.dlq_sink is not None:
            self.dlq_sink(letters)  # last, just before the commit: raises if the DLQ topic did not take them
        return result

    def _open(self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult) -> list[Incoming]:
        """Open the sealed records with their data keys (read in this transaction); drop the shredded ones.

        A record sealed with a key an erasure destroyed is its subject's erased past: counted as an erased replay,
        never a dead letter. An unknown key, another subject's key or a ciphertext that does not open is a dead
        letter (`unknown_key`, `key_mismatch`, `bad_ciphertext`). With encryption required, a clear record that
        carries personal fields is one too (`not_encrypted`).
        """
        sealed = [r for r in records if r.envelope is not None]
        required = self.keys is not None and self.keys.required
        if not sealed and not required:
            return records
        states = {}
        if sealed:
            if self.keys is None:
                raise RuntimeError("a sealed record reached a recorder without a key store (KeyContext)")
            kids = [r.key_id for r in sealed]
            states = key_states(  # type: ignore[arg-type]
                cur, self.keys.schema, self.keys.keks, kids, cache=self._unwrapped, digests=self.keys.digests
            )
        out: list[Incoming] = []
        for r in records:
            if r.envelope is not None:
                state = states.get(r.key_id)  # type: ignore[arg-type]
                if state is None:
                    r = open_record(r, None)
                else:
                    r = open_record(r, state.key, destroyed=state.destroyed, owner=state.owns)
                if r.erased:
                    result.erased_replays += 1
                    continue
            elif required and r.event is not None and r.event.type is not EventType.ERASED:
                if has_personal(r.event.to_wire()):
                    error = InvalidEvent(
                        "not_encrypted",
                        "encryption is required: this record carries personal fields in clear",
                        "sealed",
                    )
                    r = dataclasses.replace(r, event=None, error=error)
            out.append(r)
        return out

    def _dead_letters(self, cur: psycopg.Cursor, invalid: list[Incoming], result: BatchResult) -> list[DeadLetter]:
        """Record the invalid records once each; returns the new ones (for the DLQ topic)."""
        if not invalid:
            return []
        new = insert_dead_letters(cur, invalid)
        letters = [DeadLetter(r, r.error) for r in invalid if (r.partition, r.offset) in new]  # type: ignore[arg-type]
        result.dead += len(letters)
        for letter in letters:  # each under the tenant it names (counts.py), none it cannot be read from
            result.counts[(letter_tenant(letter.record), dead_letters_name(self.topic))] += 1
        result.letters.extend(letters)
        for letter in letters:
            result.dead_codes[letter.error.code] = result.dead_codes.get(letter.error.code, 0) + 1
        return letters

    def _erased(self, cur: psycopg.Cursor, records: list[Incoming]) -> dict[int, bool]:
        """Index in `records` of each record whose id belonged to an erased subject -> whether it says what the
        erased event said (True also when the erasure predates recorded fingerprints).

        Fingerprints are computed only for the ids found erased (rare): every other record pays one lookup.
        """
        cur.execute(
            erased_sql(with_fingerprints=False),
            ([r.event.tenant for r in records], [r.event.event_id for r in records]),  # type: ignore[union-attr]
        )
        found = set(cur.fetchall())
        if not found:
            return {}
        hit = [i for i, r in enumerate(records) if (r.event.tenant, r.event.event_id) in found]  # type: ignore[union-attr]
        evs = [records[i].event for i in hit]
        cur.execute(
            erased_sql(with_fingerprints=True),
            ([e.tenant for e in evs], [e.event_id for e in evs], [e.fingerprint for e in evs]),  # type: ignore[union-attr]
        )
        return {hit[n - 1]: same for n, same in cur.fetchall()}

    def _log_events(
        self,
        cur: psycopg.Cursor,
        records: list[Incoming],
        result: BatchResult,
        letters: list[DeadLetter],
        resolved: dict[tuple[str, str], str] | None = None,
    ) -> list[Incoming]:
        """Log the events once per (tenant, event_id); returns the records that are new, in order.

        Left out: re-sent events of an erased subject (same content: counted; other content under the erased
        id: a conflict), duplicates (same fingerprint, counted), conflicts (another fingerprint: dead-lettered as
        `event_id_conflict`).
        """
        if not records:
            return []
        erased = self._erased(cur, records)
        if erased:
            result.erased_replays += sum(erased.values())
            other = [records[i] for i in sorted(erased) if not erased[i]]
            if other:
                self._conflicts(cur, [(r, "by an event of a subject erased since") for r in other], result, letters)
            records = [r for i, r in enumerate(records) if i not in erased]
            if not records:
                return []
        evs: list[MemoryEvent] = [r.event for r in records]  # type: ignore[misc]
        wires = [e.to_wire() for e in evs]  # once per event: the payload and its fingerprint (issue 14)
        cur.execute(
            "INSERT INTO events (tenant, event_id, fingerprint, subject, memory_id, type, kind, key, scope, "
            '"partition", "offset", observed_at, valid_from, valid_to, target_version, payload, key_id) '
            "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[], %b::timestamptz[], %b::timestamptz[], "
            "%b::timestamptz[], %b::text[], %b::jsonb[], %b::text[]) "
            'ON CONFLICT (tenant, event_id) DO NOTHING RETURNING "partition", "offset"',
            (
                [e.tenant for e in evs],
                [e.event_id for e in evs],
                [wire_fingerprint(w) for w in wires],
                [e.subject for e in evs],
                [None if route(e.type) is Route.ERASURE else fact_of(e, resolved) for e in evs],
                [e.type.value for e in evs],
                [e.kind.value for e in evs],
                [e.key for e in evs],
                [e.scope for e in evs],
                [r.partition for r in records],
                [r.offset for r in records],
                [e.observed_at for e in evs],
                [e.valid_from for e in evs],
                [e.valid_to for e in evs],
                [e.target_version for e in evs],
                [Jsonb(w) for w in wires],
                [r.key_id for r in records],
            ),
        )
        inserted = set(cur.fetchall())
        new = [r for r in records if (r.partition, r.offset) in inserted]
        result.counts.update((r.event.tenant, EVENTS) for r in new)  # type: ignore[union-attr]
        known = [r for r in records if (r.partition, r.offset) not in inserted]
        if not known:
            return new
        cur.execute(
            'SELECT tenant, event_id, fingerprint, "partition", "offset" FROM events '
            "WHERE (tenant, event_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))",
            ([r.event.tenant for r in known], [r.event.event_id for r in known]),  # type: ignore[union-attr]
        )
        first = {(t, eid): (fp, p, o) for t, eid, fp, p, o in cur.fetchall()}
        conflicts: list[tuple[Incoming, str]] = []
        for r in known:
            e = r.event
            assert e is not None
            fp, p, o = first[(e.tenant, e.event_id)]
            if fp == e.fingerprint:
                result.duplicates += 1
                continue
            conflicts.append((r, f"partition {p}, offset {o}"))
        if conflicts:
            self._conflicts(cur, conflicts, result, letters)
        return new

    def _conflicts(
        self, cur: psycopg.Cursor, found: list[tuple[Incoming, str]], result: BatchResult, letters: list[DeadLetter]
    ) -> None:
        """Dead-letter records whose (tenant, event_id) already names other content (`where`: by what)."""
        refused: list[Incoming] = []
        for r, where in found:
            e = r.event
            assert e is not None
            message = (
                f"event_id {e.event_id!r} was already used by another event of tenant {e.tenant!r} "
                f"({where}); this one says something else and is not applied"
            )
            error = InvalidEvent("event_id_conflict", message, "event_id")
            refused.append(dataclasses.replace(r, event=None, error=error))
        result.conflicts += len(refused)
        letters += self._dead_letters(cur, refused, result)

    def _apply_events(
        self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult, letters: list[DeadLetter]
    ) -> None:
        if not records:
            return
        resolved = self._episode_targets(cur, records)
        new = self._log_events(cur, records, result, letters, resolved)
        result.applied += len(new)
        try:  # the pure core's one dispatch on the event type (projections.versions.additions)
            added = additions(((r.event, r.partition, r.offset) for r in new if r.event is not None), resolved)
        except _CORE_ERRORS as exc:
            raise CoreRefused(f"{type(exc).__name__}: {exc}") from exc
        new_versions, new_marks = added.versions, added.marks
        facts = added.facts
        if not facts:
            return
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(m, 0)) FROM unnest(%b::text[]) WITH ORDINALITY AS t(m, i) "
            "ORDER BY i",
            (facts,),
        )
        versions = self._load_versions(cur, facts)
        fresh_marks = {m.event_id for ms in new_marks.values() for m in ms}
        marks = self._load_marks(cur, facts, exclude=fresh_marks)
        inserts: list[Version] = []
        updates: list[Version] = []
        for mid in facts:
            try:
                changes = plan(
                    versions.get(mid, []), marks.get(mid, []), new_versions.get(mid, []), new_marks.get(mid, [])
                )
            except _CORE_ERRORS as exc:
                raise CoreRefused(f"{type(exc).__name__}: {exc}") from exc
            inserts.extend(changes.inserts)
            updates.extend(changes.updates)
        # /v1/stats' access counters: facts this batch makes active or inactive (projections.postgres.accesses)
        result.counts.update(transition_deltas(cur, active_transitions(versions, inserts, updates)))
        self._write_versions(cur, inserts, updates, result.counts)
        result.versions_written += len(inserts) + len(updates)

    def _episode_targets(self, cur: psycopg.Cursor, records: list[Incoming]) -> dict[tuple[str, str], str]:
        """(tenant, event_id) of each retraction whose target_version is an episode of its tenant and subject logged
        before it (stored, or earlier in this batch) -> that episode's memory_id (projections.versions.fact_of).

        "Before" is ledger order: a subject's events share a partition, so a replay resolves each retraction as the
        first run did, however the records are batched.
        """
        wanted = [
            r.event
            for r in records
            if r.event is not None and r.event.type is EventType.RETRACTED and r.event.target_version is not None
        ]
        if not wanted:
            return {}
        logged: dict[str, tuple[str, str, str, tuple[int, int] | None]] = {}
        cur.execute(
            "SELECT version_id, tenant, subject, memory_id FROM fact_versions "
            "WHERE version_id = ANY(%s) AND kind = 'episodic'",
            ([e.target_version for e in wanted],),
        )
        for vid, tenant, subject, mid in cur.fetchall():
            logged[vid] = (tenant, subject, mid, None)
        for r in records:
            e = r.event
            if e is not None and e.type is EventType.ASSERTED and e.kind.value == "episodic":
                logged.setdefault(e.version_id, (e.tenant, e.subject, e.memory_id, (r.partition, r.offset)))
        out: dict[tuple[str, str], str] = {}
        for r in records:
            e = r.event
            if e is None or e.type is not EventType.RETRACTED or e.target_version is None:
                continue
            found = logged.get(e.target_version)
            if (
                found is not None
                and found[:2] == (e.tenant, e.subject)
                and (found[3] or (-1, -1)) < (r.partition, r.offset)
            ):
                out[(e.tenant, e.event_id)] = found[2]
        return out

    def _load_versions(self, cur: psycopg.Cursor, facts: list[str]) -> dict[str, list[Version]]:
        """The stored chains of `facts`, with the columns the fold and the writers read (`CHAIN_COLUMNS`).

        The content columns (`UNREAD_COLUMNS`) are left empty: a stored version is only ever refolded, counted
        active or not, and written back by the UPDATE of its derived columns (issue 14: every chain of a batch was
        read whole, a fifth of the worker's time and growing with the chains).
        """
        cur.execute(_LOAD_CHAINS, (facts,))
        out: dict[str, list[Version]] = defaultdict(list)
        for row in cur.fetchall():
            v = _chain_version(row)
            out[v.memory_id].append(v)
        return out

    def _load_marks(self, cur: psycopg.Cursor, facts: list[str], exclude: set[str]) -> dict[str, list[Mark]]:
        """The stored retractions and confirmations of `facts` (a memory_id is one tenant's: ids are unique in it)."""
        cur.execute(
            "SELECT memory_id, event_id, type, valid_from, observed_at, target_version FROM events "
            "WHERE memory_id = ANY(%s) AND type IN ('memory.retracted', 'memory.confirmed')",
            (facts,),
        )
        out: dict[str, list[Mark]] = defaultdict(list)
        for mid, eid, typ, vf, obs, target in cur.fetchall():
            if eid not in exclude:
                out[mid].append(Mark(eid, typ, vf, obs, target=target))
        return out

    def _write_versions(
        self, cur: psycopg.Cursor, inserts: list[Version], updates: list[Version], counts: Counter
    ) -> None:
        # updates first: a row stops being current before its successor is inserted (unique index)
        if updates:
            cur.execute(
                "UPDATE fact_versions f SET valid_to = u.valid_to, status = u.status, superseded_by = u.superseded_by, "
                "superseded_at = u.superseded_at, version = u.version, confirmed_count = u.confirmed_count, "
                "last_confirmed_at = u.last_confirmed_at, rev = nextval('doc_rev') "
                "FROM unnest(%b::timestamptz[], %b::text[], %b::text[], "
                "%b::timestamptz[], %b::int[], %b::int[], %b::timestamptz[], %b::text[]) "
                "AS u(valid_to, status, superseded_by, superseded_at, version, confirmed_count, last_confirmed_at, id) "
                "WHERE f.version_id = u.id",
                [list(col) for col in zip(*[(*v.derived(), v.version_id) for v in updates], strict=True)],
            )
        if inserts:
            # new version_ids only (their events were just logged as new): COPY is safe and ~3x executemany
            copy_sql = sql.SQL("COPY fact_versions ({}) FROM STDIN").format(sql.SQL(", ").join(_Q))
            with cur.copy(copy_sql) as copy:
                for v in inserts:
                    copy.write_row(version_to_row(v))
            counts.update((v.tenant, VERSIONS) for v in inserts)
        touched = [*inserts, *updates]
        if touched:
            cur.execute(
                "INSERT INTO search_outbox (version_id, tenant, subject, op) "
                "SELECT v, t, s, 'upsert' FROM unnest(%b::text[], %b::text[], %b::text[]) AS x(v, t, s)",
                ([v.version_id for v in touched], [v.tenant for v in touched], [v.subject for v in touched]),
            )
            counts.update((v.tenant, OUTBOX) for v in touched)

    def _erase(self, cur: psycopg.Cursor, record: Incoming, result: BatchResult, letters: list[DeadLetter]) -> set[str]:
        """subject.erased: purge the subject's versions and events, keep only the erasure tombstones; the keys shredded.

        The purged events' ids stay as salted hashes (erased_events) so that re-sending one has no effect. Then, in
        the same transaction, the subject's data key is destroyed and the erasure record written (issue 13): a
        worker killed anywhere in between rolls all of it back and its restart does all of it. A replay of an
        erasure already recorded (a rebuild) destroys nothing: the subject's key now may be a newer one.
        """
        e = record.event
        assert e is not None
        if not self._log_events(cur, [record], result, letters):
            return set()  # a duplicate, a conflict (dead-lettered) or a replay: no erasure happens again
        result.applied += 1
        cur.execute(
            'SELECT count(*), count(key_id), min("offset") FROM events '
            "WHERE tenant = %s AND subject = %s AND type <> 'subject.erased'",
            (e.tenant, e.subject),
        )
        n_events, n_sealed, first_offset = cur.fetchone()  # type: ignore[misc]
        cur.execute(
            "SELECT count(*) FROM accesses a JOIN fact_versions f ON f.version_id = a.version_id "
            "WHERE f.tenant = %s AND f.subject = %s",
            (e.tenant, e.subject),
        )
        n_accesses = cur.fetchone()[0]  # type: ignore[index]
        cur.execute(
            "INSERT INTO erased_events (tenant, id_hash, fp_hash) "
            f"SELECT tenant, {ID_HASH_SQL.format('event_id')}, {FP_HASH_SQL.format(fp='fingerprint', id='event_id')} "
            "FROM events WHERE tenant = %s AND subject = %s AND type <> 'subject.erased' ON CONFLICT DO NOTHING",
            (e.tenant, e.subject),
        )
        cur.execute(  # the doors' claims of these ids: erased_events answers for them now (idempotency.claim_events)
            "DELETE FROM event_claims c USING events e WHERE e.tenant = %s AND e.subject = %s "
            "AND e.type <> 'subject.erased' AND c.tenant = e.tenant AND c.event_id = e.event_id",
            (e.tenant, e.subject),
        )
        erase_accesses(cur, e.tenant, e.subject)  # its versions' accesses and aggregates, while the versions exist
        cur.execute("DELETE FROM fact_versions WHERE tenant = %s AND subject = %s", (e.tenant, e.subject))
        n_versions = cur.rowcount
        result.counts[(e.tenant, VERSIONS)] -= cur.rowcount
        cur.execute(
            "DELETE FROM events WHERE tenant = %s AND subject = %s AND type <> 'subject.erased'", (e.tenant, e.subject)
        )
        result.counts[(e.tenant, EVENTS)] -= cur.rowcount
        cur.execute(
            "DELETE FROM search_outbox WHERE tenant = %s AND subject = %s AND op = 'upsert'", (e.tenant, e.subject)
        )
        n_outbox = cur.rowcount
        result.counts[(e.tenant, OUTBOX)] -= cur.rowcount
        cur.execute(
            "INSERT INTO search_outbox (version_id, tenant, subject, op) VALUES (NULL, %s, %s, 'delete_subject')",
            (e.tenant, e.subject),
        )
        result.counts[(e.tenant, OUTBOX)] += 1
        cur.execute(  # delivered to LISTENers when this transaction commits (API caches)
            "SELECT pg_notify(%s, json_build_object('schema', current_schema(), 'tenant', %s::text, "
            "'subject', %s::text)::text)",
            (ERASURE_CHANNEL, e.tenant, e.subject),
        )
        if self.keys is None or erasure_recorded(cur, self.keys.schema, e.tenant, e.event_id):
            return set()
        shredded = destroy_subject_keys(cur, self.keys.digests, e.tenant, e.subject, e.event_id)
        record_erasure(
            cur,
            self.keys.digests,
            ErasureRecord(
                tenant=e.tenant,
                erasure_id=e.event_id,
                subject=e.subject,
                requested_at=e.observed_at,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                first_offset=first_offset,
                records=n_events,
                sealed_records=n_sealed,
                clear_records=n_events - n_sealed,
                key_ids=[k for k, _ in shredded],
                key_fingerprints=[f for _, f in shredded],
                purged={
                    "postgres": {
                        "versions": n_versions,
                        "events": n_events,
                        "accesses": n_accesses,
                        "pending_index": n_outbox,
                    }
                },
            ),
        )
        return {k for k, _ in shredded}


def _log_dead_letters(letters: Sequence[DeadLetter]) -> None:
    """One line per dead letter, after its transaction committed, with the record's ids (producers.logs)."""
    for letter in letters:
        r, err = letter.record, letter.error
        log.warning(
            "dead letter %s/%d/%d: %s%s: %s",
            r.topic,
            r.partition,
            r.offset,
            err.code,
            f" ({err.field})" if err.field else "",
            err.message,
            extra={**record_ids(r), "code": err.code, "field": err.field},
        )


def _route(record: Incoming) -> Route:
    """The event's route; an error of the pure core on it is a poison record."""
    assert record.event is not None
    try:
        return route(record.event.type)
    except _CORE_ERRORS as exc:
        raise CoreRefused(f"{type(exc).__name__}: {exc}") from exc


def version_to_row(v: Version) -> tuple:
    values = list(_ROW(v))  # every column in one C call (issue 14: the getattr loop was 2% of a rebuild)
    for i in _JSON:
        values[i] = Jsonb(values[i])
    for i in _LISTS:
        values[i] = list(values[i])
    return tuple(values)


# VERSION_COLUMNS is Version's field order (asserted at import): a row is built positionally, ~2x the keyword way
if tuple(VERSION_COLUMNS) != tuple(f.name for f in dataclasses.fields(Version)):
    raise AssertionError("VERSION_COLUMNS must list Version's fields in their order")
_LISTS = tuple(VERSION_COLUMNS.index(n) for n in ("entities", "aliases", "tags"))
_SOURCE = VERSION_COLUMNS.index("source")
_JSON = (VERSION_COLUMNS.index("value"), _SOURCE)
_ROW = operator.attrgetter(*VERSION_COLUMNS)
# what Recorder._load_versions leaves out of a stored version (never read from it: see there), and its empty values
UNREAD_COLUMNS = {"value": None, "content": "", "entities": (), "aliases": (), "tags": (), "source": {}}
CHAIN_COLUMNS = [c for c in VERSION_COLUMNS if c not in UNREAD_COLUMNS]
_LOAD_CHAINS = sql.SQL("SELECT {} FROM fact_versions WHERE memory_id = ANY(%s)").format(
    sql.SQL(", ").join(sql.Identifier(c) for c in CHAIN_COLUMNS)
)
_CHAIN_AT = [CHAIN_COLUMNS.index(c) if c in CHAIN_COLUMNS else -1 for c in VERSION_COLUMNS]


def _chain_version(row: Sequence) -> Version:
    """A Version from a row of `_LOAD_CHAINS`: the unread columns get their empty values."""
    return Version(*[row[i] if i >= 0 else UNREAD_COLUMNS[c] for c, i in zip(VERSION_COLUMNS, _CHAIN_AT, strict=True)])


def row_to_version(row: Sequence) -> Version:
    data = list(row)
    for i in _LISTS:
        data[i] = tuple(data[i] or ())
    data[_SOURCE] = data[_SOURCE] or {}
    return Version(*data)
