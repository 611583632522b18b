"""The ledger's positioned projection: a batch of ledger records -> events, fact versions, outbox rows.

Built on `PositionedProjection` (rows and positions in one transaction); this module adds the ledger's `decoder`,
`prepare` (sealed records opened) and `apply`. Each fact is recomputed under an advisory lock on its memory_id,
because SELECT ... FOR UPDATE races when two writers create a fact's first version. Idempotency, conflicts and
erasure: README.md and docs/INTERNALS.md ("PostgreSQL"). The underscore methods take the batch's cursor, to share
its one transaction.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from producers.contract import (
    DeadLetterRef,
    EventType,
    InvalidEvent,
    MemoryEvent,
    claimed_fields,
    parse_rfc3339,
    version_id_for,
    wire_fingerprint,
)
from producers.keys.envelope import SEALED, has_personal
from producers.keys.store import (
    ERASURE_CHANNEL,
    ErasureRecord,
    KeyContext,
    destroy_subject_keys,
    erasure_recorded,
    key_context,
    key_states,
    record_erasure,
)
from producers.records import DeadLetter, Incoming, decode_record, open_record
from projections.postgres.accesses import (
    active_transitions,
    erase_accesses,
    keep_erased_versions,
    transition_deltas,
)
from projections.postgres.chain import Checkpoints
from projections.postgres.counts import EVENTS, OUTBOX, VERSIONS, dead_letters_name
from projections.postgres.idempotency import FP_HASH_SQL, ID_HASH_SQL, erased_sql, release_letter_claims
from projections.postgres.positioned import (
    CoreRefused,
    Decode,
    DlqSink,
    PositionedProjection,
    PositionedResult,
    claimed_subject,
    connect,
    letter_tenant,
)
from projections.search.cues import about_entries
from projections.versions import Mark, Route, Version, additions, fact_of, plan, route

if TYPE_CHECKING:
    from producers.settings import Settings

__all__ = [
    "ERASURE_CHANNEL",
    "OUTBOX_CHANNEL",
    "BatchResult",
    "Recorder",
    "connect",  # the positioned projections' (projections.postgres.positioned)
]

OUTBOX_CHANNEL = "memory_ledger_outbox"  # LISTEN for <schema> after a commit that gave the indexers work
# what a letter of an erased subject keeps of its reason besides its code, once its bytes are gone: the top-level
# field it names if it is one of the contract's (a deeper path, or an unknown field's name, may be the record's
# content, as may the message's words)
_TOP_FIELDS = sorted({*MemoryEvent.model_fields, SEALED})
_WITHHELD = (
    "field = CASE WHEN split_part(d.field, '.', 1) = ANY(%s::text[]) THEN split_part(d.field, '.', 1) END, "
    "message = 'withheld with the record''s bytes: its subject was erased, and the words could quote the record'"
)
_NO_FACT = (Route.ERASURE, Route.RESOLUTION)  # routes whose events are logged under no fact (memory_id NULL)
VERSION_COLUMNS = (
    "version_id event_id memory_id tenant subject key scope kind value content entities aliases tags source confidence "
    "importance observed_at valid_from asserted_valid_to partition offset valid_to status superseded_by "
    "superseded_at version confirmed_count last_confirmed_at"
).split()
_Q = [sql.Identifier(c) for c in VERSION_COLUMNS]
_TEXTS = "ARRAY(SELECT t FROM jsonb_array_elements_text(r->{}) WITH ORDINALITY AS a(t, n) ORDER BY n)"
# A batch's rows go to PostgreSQL as one jsonb array of arrays (orjson, in C) taken apart by the statement: one
# parameter instead of a parameter array per column, each of whose elements psycopg dumps in Python. Texts from
# JSON are cast to the column's type, as COPY's text format reads them; times are RFC 3339 with their offset.
_EVENT_HEAD = operator.attrgetter(
    "tenant", "event_id", "subject", "key", "scope", "observed_at", "valid_from", "valid_to", "target_version"
)
_INSERT_EVENTS = (
    "INSERT INTO events (tenant, event_id, subject, key, scope, observed_at, valid_from, valid_to, target_version, "
    'fingerprint, memory_id, type, kind, "partition", "offset", payload, key_id) '
    "SELECT r->>0, r->>1, r->>2, r->>3, r->>4, (r->>5)::timestamptz, (r->>6)::timestamptz, (r->>7)::timestamptz, "
    "r->>8, r->>9, r->>10, r->>11, r->>12, (r->>13)::int, (r->>14)::bigint, r->15, r->>16 "
    "FROM jsonb_array_elements(%b) AS r "
    'ON CONFLICT (tenant, event_id) DO NOTHING RETURNING "partition", "offset"'
)


_ERASURE_GATE = "SELECT pg_advisory_xact_lock{}(hashtextextended(current_schema() || '/erasure gate', 0))"


@dataclass
class BatchResult(PositionedResult):
    # applied: events recorded (new (tenant, event_id)); duplicates: valid events whose (tenant, event_id) was
    # already known with the same fingerprint
    conflicts: int = 0  # same (tenant, event_id), another fingerprint: dead-lettered as event_id_conflict
    erased_replays: int = 0  # re-sent events of an erased subject: no effect, not stored


# deterministic failures of the pure core (projections.versions) on the records it is folding
_CORE_ERRORS = (ValueError, TypeError, KeyError)


class Recorder(PositionedProjection[Incoming, BatchResult]):
    """Writes ledger batches for one consumer (group) and topic into the schema the connection points at."""

    result_type = BatchResult
    chained = True  # the ledger: every record taken is chained, its heads signed (projections.postgres.chain)
    keyed_by_subject = True
    logged_fields = frozenset(_TOP_FIELDS)

    def __init__(
        self,
        conn: psycopg.Connection,
        *,
        consumer: str,
        topic: str,
        dlq_sink: DlqSink | None = None,
        keys: KeyContext | None = None,
    ):
        super().__init__(conn, consumer=consumer, topic=topic, dlq_sink=dlq_sink)
        # the key store that opens sealed records and whose subject keys an erasure destroys; None: a
        # sealed record stops the batch (KekError, retried loudly) and an erasure leaves no erasure record
        self.keys = keys
        self._unwrapped: dict[tuple[str, bytes], bytes] = {}  # (key id, wrapped bytes) -> data key: unwrap once

    @classmethod
    def topic_of(cls, settings: Settings) -> str:
        return settings.topic

    @classmethod
    def for_settings(cls, settings: Settings, conn: psycopg.Connection, *, dlq_sink: DlqSink | None = None) -> Recorder:
        """The worker's recorder (and the rebuild's): the key store is read on `conn` (committed)."""
        keys = key_context(settings, conn)  # opens sealed records; erasures shred
        conn.commit()
        recorder = cls(
            conn, consumer=settings.processor_group, topic=cls.topic_of(settings), dlq_sink=dlq_sink, keys=keys
        )
        recorder.checkpoints = Checkpoints.for_settings(settings)  # None: no signing key, heads only
        return recorder

    @classmethod
    def decoder(cls, settings: Settings) -> Decode:
        skew = timedelta(seconds=settings.max_future_skew_s)  # the worker's window, against the broker time

        def decode(
            topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, ts: int | None
        ) -> Incoming:
            return decode_record(topic, partition, offset, value, key=key, timestamp_ms=ts, max_future_skew=skew)

        return decode

    def dead_letters(self, cur: psycopg.Cursor, invalid: list[Incoming], result: BatchResult) -> list[DeadLetter]:
        """The base's dead letters, but for records whose subject an erasure logged after them in their partition
        already took (`_erase`): a replay or a redelivery refusing them again counts them as erased replays. A
        letter whose subject an erasure in another partition names is kept without its bytes, as `_erase` leaves
        such a letter recorded before it: the two partitions have no order, so either way it ends the same."""
        gone, elsewhere = self._erased_since(cur, invalid)
        result.erased_replays += len(gone)
        letters = super().dead_letters(cur, [r for i, r in enumerate(invalid) if i not in gone], result)
        redacted = {(invalid[i].partition, invalid[i].offset) for i in elsewhere}
        new = [at for at in ((d.record.partition, d.record.offset) for d in letters) if at in redacted]
        if new:
            cur.execute(
                f"UPDATE dead_letters d SET raw = NULL, {_WITHHELD} WHERE topic = %s "
                'AND ("partition", "offset") IN (SELECT * FROM unnest(%s::int[], %s::bigint[]))',
                (_TOP_FIELDS, self.topic, [p for p, _ in new], [o for _, o in new]),
            )
        return letters

    def _erased_since(self, cur: psycopg.Cursor, records: list[Incoming]) -> tuple[set[int], set[int]]:
        """Indexes of `records` naming a (tenant, subject) whose erasure is logged after them in their partition,
        and of the others naming one an erasure in another partition names."""
        named = [(i, letter_tenant(r), claimed_subject(r, keyed=True)) for i, r in enumerate(records)]
        named = [(i, t, s) for i, t, s in named if t and s is not None]
        if not named:
            return set(), set()
        cur.execute(
            'SELECT x.i, bool_or(e."partition" = x.p AND e."offset" > x.o), bool_or(e."partition" <> x.p) '
            "FROM unnest(%s::int[], %s::text[], %s::text[], %s::int[], %s::bigint[]) AS x(i, t, s, p, o) "
            "JOIN events e ON e.tenant = x.t AND e.subject = x.s AND e.type = 'subject.erased' GROUP BY x.i",
            (
                [i for i, _, _ in named],
                [t for _, t, _ in named],
                [s for _, _, s in named],
                [records[i].partition for i, _, _ in named],
                [records[i].offset for i, _, _ in named],
            ),
        )
        found = cur.fetchall()
        return {i for i, later, _ in found if later}, {i for i, later, other in found if other and not later}

    def prepare(self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult) -> list[Incoming]:
        # workers apply their partitions at once: a batch holding an erasure takes the schema's erasure gate alone,
        # every other batch shares it (before any key is read), so a record of the erased subject in another
        # partition is never written unseen by the erasure's purge, nor the erasure by `_cover_elsewhere`
        erasing = any(r.event is not None and r.event.type is EventType.ERASED for r in records)
        cur.execute(_ERASURE_GATE.format("" if erasing else "_shared"))
        opened, erased = self.open_sealed(cur, records, result)
        self._resolve_erased(cur, erased)
        return [_named_ahead(r) for r in opened]

    def apply(self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult, shard: int) -> None:
        """The valid records in ledger order; an erasure is a barrier: what came before it is applied (or
        dead-lettered) first."""
        segment: list[Incoming] = []
        destroyed: dict[str, int] = {}  # keys an erasure earlier in this batch destroyed -> the erasure's partition
        late: list[Incoming] = []
        for r in records:
            if r.key_id is not None and r.key_id in destroyed:  # sealed with a key this batch shredded
                if destroyed[r.key_id] == r.partition:  # published after the erasure: as `open_sealed` judges it
                    late.append(_key_destroyed(r))
                else:
                    result.erased_replays += 1
                    if r.event is not None and r.event.dead_letter is not None:  # opened before its key went
                        self._resolve_dead_letters(cur, [r], erased=True)
                continue
            if _route(r) is Route.ERASURE:
                self._apply_events(cur, segment, result)
                # the letters before it too: another erasure of their subject takes them with its past (their ids
                # then answer for them), as when each came in a batch of its own
                self.dead_letters(cur, late, result)
                segment, late = [], []
                destroyed |= dict.fromkeys(self._erase(cur, r, result), r.partition)
            else:
                segment.append(r)
        self._apply_events(cur, segment, result)
        self.dead_letters(cur, late, result)

    def open_sealed(
        self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult
    ) -> tuple[list[Incoming], list[Incoming]]:
        """Open the sealed records with their data keys (read in this transaction); drop the shredded ones, which
        come back apart, as read (their clear fields). Reads only: `ledger verify` opens the log with it.

        A record of the key's own subject sealed with a key an erasure destroyed is that subject's erased past:
        counted as an erased replay, never a dead letter (one naming another subject stays `key_mismatch`, as when
        it was first applied); but one published after that erasure (later in its partition) is an event a producer
        sealed with a key it held past the erasure, which nobody can open now: a dead letter (`key_destroyed`),
        so the accepted event is not lost unseen (one naming another subject: `key_mismatch`, whatever the
        batching). An unknown key, another subject's key or a ciphertext that does not open is a dead letter
        (`unknown_key`, `key_mismatch`, `bad_ciphertext`). With encryption required, a clear record that carries
        personal fields is one too (`not_encrypted`).
        """
        sealed = [r for r in records if r.envelope is not None]
        required = self.keys is not None and self.keys.required
        if not sealed and not required:
            return records, []
        states = {}
        if sealed:
            if self.keys is None:
                raise RuntimeError("a sealed record reached a recorder without a key store (KeyContext)")
            kids = [r.key_id for r in sealed]
            states = key_states(  # type: ignore[arg-type]
                cur, self.keys.schema, self.keys.keks, kids, cache=self._unwrapped, digests=self.keys.digests
            )
        out: list[Incoming] = []
        erased: list[Incoming] = []
        for r in records:
            if r.envelope is not None:
                sealed_record = r
                state = states.get(r.key_id)  # type: ignore[arg-type]
                if state is None:
                    r = open_record(r, None)
                elif state.destroyed_by is not None and _after(r, state.destroyed_by):
                    # another subject's record is judged as when its batch opened it before the erasure applied
                    mismatch = open_record(r, None, destroyed=True, owner=state.owns)
                    r = mismatch if mismatch.error is not None else _key_destroyed(r)
                else:
                    r = open_record(r, state.key, destroyed=state.destroyed, owner=state.owns)
                if r.erased:
                    result.erased_replays += 1
                    erased.append(sealed_record)  # its clear fields: what it resolved stays resolved
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
        return out, erased

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
                self._conflicts(cur, [(r, "by an event of a subject erased since") for r in other], result)
            records = [r for i, r in enumerate(records) if i not in erased]
            if not records:
                return []
        rows = []
        for r in records:
            e: MemoryEvent = r.event  # type: ignore[assignment]
            wire = e.to_wire()  # once per event: the payload and its fingerprint
            fact = None if route(e.type) in _NO_FACT else fact_of(e, resolved)
            rows.append(
                (
                    *_EVENT_HEAD(e),
                    wire_fingerprint(wire),
                    fact,
                    e.type.value,
                    e.kind.value,
                    r.partition,
                    r.offset,
                    wire,
                    r.key_id,
                )
            )
        cur.execute(_INSERT_EVENTS, (Jsonb(rows),))
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
            self._conflicts(cur, conflicts, result)
        return new

    def _cover_elsewhere(self, cur: psycopg.Cursor, records: list[Incoming]) -> None:
        """Make the records that an erasure of their subject in another partition covers its erased past: logged at
        or before it by the log's timestamps (a record with none: in doubt, covered), their id not logged.

        Two partitions have no offset order and the worker reads each at its own pace, so such a record ends as if
        the worker had applied it before the erasure, which then purged it (`_erase`): its id and fingerprint in
        `erased_events` (`_erased` then counts it an erased replay), a door's claim of it gone, its version id kept
        (`erased_versions`), a letter it resolved resolved without its id and reason. One logged after the erasure
        is news, as one later in the erasure's own partition. Only the first record of an id in the batch is
        judged: the others are its duplicates or conflicts, as one record at a time.
        """
        firsts: dict[tuple[str, str], Incoming] = {}
        for r in records:
            if r.event is not None and r.event.type is not EventType.ERASED:
                firsts.setdefault((r.event.tenant, r.event.event_id), r)
        if not firsts:
            return
        named = list(firsts.values())
        cur.execute(
            "SELECT x.n FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::timestamptz[]) "
            "WITH ORDINALITY AS x(t, s, id, p, ts, n) "
            "WHERE EXISTS (SELECT 1 FROM events e WHERE e.tenant = x.t AND e.subject = x.s "
            "AND e.type = 'subject.erased' AND e.\"partition\" <> x.p "
            # a tombstone logged before `logged_at` existed: the later of its two times, so it rather covers more
            "AND (x.ts IS NULL OR coalesce(e.logged_at, greatest(e.observed_at, e.recorded_at)) >= x.ts)) "
            "AND NOT EXISTS (SELECT 1 FROM events e WHERE e.tenant = x.t AND e.event_id = x.id)",
            (
                [r.event.tenant for r in named],  # type: ignore[union-attr]
                [r.event.subject for r in named],  # type: ignore[union-attr]
                [r.event.event_id for r in named],  # type: ignore[union-attr]
                [r.partition for r in named],
                [r.timestamp for r in named],
            ),
        )
        covered = [named[n - 1] for (n,) in cur.fetchall()]
        if not covered:
            return
        evs: list[MemoryEvent] = [r.event for r in covered]  # type: ignore[misc]
        cur.execute(  # fingerprints only for the covered (rare): every other record paid one probe
            "WITH x AS (SELECT * FROM unnest(%b::text[], %b::text[], %b::text[]) AS x(t, id, fp)), "
            f"kept AS (INSERT INTO erased_events (tenant, id_hash, fp_hash) SELECT t, {ID_HASH_SQL.format('id')}, "
            f"{FP_HASH_SQL.format(fp='fp', id='id')} FROM x ON CONFLICT DO NOTHING) "
            "DELETE FROM event_claims c USING x WHERE c.tenant = x.t AND c.event_id = x.id",
            ([e.tenant for e in evs], [e.event_id for e in evs], [e.fingerprint for e in evs]),
        )
        for tenant in sorted({e.tenant for e in evs}):
            keep_erased_versions(cur, tenant, [e.version_id for e in evs if e.tenant == tenant])
        self._resolve_dead_letters(cur, [r for r in covered if r.event.dead_letter is not None], erased=True)  # type: ignore[union-attr]

    def _conflicts(self, cur: psycopg.Cursor, found: list[tuple[Incoming, str]], result: BatchResult) -> None:
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
        self.dead_letters(cur, refused, result)
        release_letter_claims(cur, [r.event for r, _ in found if r.event is not None])

    def _apply_events(self, cur: psycopg.Cursor, records: list[Incoming], result: BatchResult) -> None:
        if not records:
            return
        self._cover_elsewhere(cur, records)  # before the targets: a covered record is not logged
        resolved = self._retraction_targets(cur, records)
        new = self._log_events(cur, records, result, resolved)
        result.applied += len(new)
        self._resolve_dead_letters(cur, [r for r in new if r.event is not None and r.event.dead_letter is not None])
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
        versions = self.load_versions(cur, facts)
        # the batch's marks, just logged: left out of the stored ones read back (by tenant: ids are a tenant's)
        fresh_marks = {(r.event.tenant, r.event.event_id) for r in new if r.event is not None}
        marks = self.load_marks(cur, facts, exclude=fresh_marks)
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

    def _resolve_dead_letters(self, cur: psycopg.Cursor, records: list[Incoming], *, erased: bool = False) -> None:
        """Record what the newly logged `records` (events naming a `dead_letter`) did to their letters (`erased`:
        their subject's erasure took their ids and reasons, `_erase`)."""
        rows = []
        for r in records:
            e = r.event
            assert e is not None and e.dead_letter is not None
            state = "discarded" if e.type is EventType.DISCARDED else "redriven"
            event_id, reason = (None, None) if erased else (e.event_id, e.reason)
            link = e.dead_letter
            rows.append((link.partition, link.offset, e.tenant, state, event_id, r.partition, r.offset, reason))
            rows[-1] += (e.observed_at,)
        self._write_resolutions(cur, rows)

    def _resolve_erased(self, cur: psycopg.Cursor, records: list[Incoming]) -> None:
        """The resolutions still made by `records` sealed with a key their subject's erasure destroyed (a rebuild
        reads such records; the live projection applied them before the erasure): from the clear fields (the
        `dead_letter`, tenant, type and observed_at), without the event's id and reason, which the erasure took, as
        the live projection keeps them after it (`_erase`). A clear part that does not say all of it resolves
        nothing."""
        rows = []
        for r in records:
            clear = r.envelope.clear if r.envelope is not None else {}
            try:
                link = DeadLetterRef.model_validate(clear["dead_letter"])
                tenant, type_, at = clear["tenant"], EventType(clear["type"]), parse_rfc3339(clear["observed_at"])
            except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
                continue
            if type_ is EventType.ERASED or not isinstance(tenant, str):
                continue
            state = "discarded" if type_ is EventType.DISCARDED else "redriven"
            rows.append((link.partition, link.offset, tenant, state, None, r.partition, r.offset, None, at))
        self._write_resolutions(cur, rows)

    def _write_resolutions(self, cur: psycopg.Cursor, rows: list[tuple]) -> None:
        """(letter partition, letter offset, tenant, state, event_id, by partition, by offset, reason, resolved_at)
        rows into `dead_letter_resolutions`.

        A re-drive (any event type) makes its letter `redriven`, `deadletter.discarded` makes it `discarded`. Of two
        resolutions of one letter and tenant the one first in ledger position stays, in whatever order they are
        applied (a rebuild applies partitions in any order), so the row is a function of the log. One naming a
        letter at or after its own place in its own partition resolves nothing: no record there was refused before
        it (a raw producer could otherwise close its next refusal in advance). A batch may hold several of one
        letter (raw producers): only its first in ledger position is written, as one statement may not update a
        row twice."""
        first: dict[tuple[int, int, str], tuple] = {}
        for row in rows:
            if row[0] == row[5] and row[1] >= row[6]:
                continue
            held = first.get(row[:3])
            if held is None or (row[5], row[6]) < (held[5], held[6]):
                first[row[:3]] = row
        rows = list(first.values())
        if not rows:
            return
        cols = list(zip(*rows, strict=True))
        cur.execute(
            'INSERT INTO dead_letter_resolutions (topic, "partition", "offset", tenant, state, event_id, by_partition, '
            "by_offset, reason, resolved_at) SELECT %s, * FROM unnest(%b::int[], %b::bigint[], %b::text[], "
            "%b::text[], %b::text[], %b::int[], %b::bigint[], %b::text[], %b::timestamptz[]) "
            'ON CONFLICT (topic, "partition", "offset", tenant) DO UPDATE SET state = excluded.state, '
            "event_id = excluded.event_id, by_partition = excluded.by_partition, by_offset = excluded.by_offset, "
            "reason = excluded.reason, resolved_at = excluded.resolved_at "
            "WHERE (excluded.by_partition, excluded.by_offset) "
            "< (dead_letter_resolutions.by_partition, dead_letter_resolutions.by_offset)",
            (self.topic, *(list(c) for c in cols)),
        )

    def _retraction_targets(self, cur: psycopg.Cursor, records: list[Incoming]) -> dict[tuple[str, str], str]:
        """(tenant, event_id) of each retraction this batch logs whose target_version is a version of its tenant and
        subject logged before it (stored, or earlier in this batch) -> that version's memory_id
        (projections.versions.fact_of), when the target is an episode (whose id is not its key's) or the retraction
        names no key (the contract lets target_version alone say which fact it ends).

        "Before" is ledger order: a subject's events share a partition, so a replay resolves each retraction as the
        first run did, however the records are batched. Only records the batch logs count, on either side: a
        refused one (a duplicate, a conflict) is filed nowhere, and its id is another record's.
        """
        targeted = [
            r
            for r in records
            if r.event is not None and r.event.type is EventType.RETRACTED and r.event.target_version is not None
        ]
        if not targeted:
            return {}
        wanted = self._logged(cur, records, targeted)
        if not wanted:
            return {}
        logged: dict[str, tuple[str, str, str, bool, tuple[int, int] | None]] = {}
        cur.execute(
            "SELECT version_id, tenant, subject, memory_id, kind = 'episodic' FROM fact_versions "
            "WHERE version_id = ANY(%s)",
            ([r.event.target_version for r in wanted],),
        )
        for vid, tenant, subject, mid, episodic in cur.fetchall():
            logged[vid] = (tenant, subject, mid, episodic, None)
        versions = {r.event.target_version for r in wanted} - logged.keys()
        asserted = [
            r
            for r in records
            if r.event is not None and r.event.type is EventType.ASSERTED and r.event.version_id in versions
        ]
        for r in self._logged(cur, records, asserted):
            e = r.event
            episodic = e.kind.value == "episodic"
            logged[e.version_id] = (e.tenant, e.subject, e.memory_id, episodic, (r.partition, r.offset))
        out: dict[tuple[str, str], str] = {}
        for r in wanted:
            e = r.event
            found = logged.get(e.target_version)
            if (
                found is not None
                and found[:2] == (e.tenant, e.subject)
                and (found[3] or e.key is None)
                and (found[4] or (-1, -1)) < (r.partition, r.offset)
            ):
                out[(e.tenant, e.event_id)] = found[2]
        return out

    def _logged(self, cur: psycopg.Cursor, records: list[Incoming], some: list[Incoming]) -> list[Incoming]:
        """Those of `some` (records of the batch `records`) that this batch logs: the first record of their
        (tenant, event_id) in the batch, an id neither logged before (`events`) nor an erased event's. The others
        are refused (a duplicate, a conflict) or replays of an erased event, whatever the batching."""
        first: dict[tuple[str, str], Incoming] = {}
        for r in records:
            if r.event is not None:
                first.setdefault((r.event.tenant, r.event.event_id), r)
        found = [r for r in some if first[(r.event.tenant, r.event.event_id)] is r]
        if not found:
            return []
        cur.execute(
            "SELECT x.i FROM unnest(%s::int[], %s::text[], %s::text[]) AS x(i, t, id) "
            "WHERE EXISTS (SELECT 1 FROM events e WHERE e.tenant = x.t AND e.event_id = x.id)",
            (list(range(len(found))), [r.event.tenant for r in found], [r.event.event_id for r in found]),
        )
        taken = {row[0] for row in cur.fetchall()}
        erased = self._erased(cur, found)
        return [r for n, r in enumerate(found) if n not in taken and n not in erased]

    def load_versions(self, cur: psycopg.Cursor, facts: list[str]) -> dict[str, list[Version]]:
        """The stored chains of `facts`, with the columns the fold and the writers read (`CHAIN_COLUMNS`).

        The content columns (`UNREAD_COLUMNS`) are left empty: a stored version is only ever refolded, counted
        active or not, and written back by the UPDATE of its derived columns: reading whole chains would cost
        time that grows with the chains.
        """
        cur.execute(_LOAD_CHAINS, (facts,))
        out: dict[str, list[Version]] = defaultdict(list)
        for row in cur.fetchall():
            v = _chain_version(row)
            out[v.memory_id].append(v)
        return out

    def load_marks(
        self, cur: psycopg.Cursor, facts: list[str], exclude: set[tuple[str, str]] = frozenset()
    ) -> dict[str, list[Mark]]:
        """The stored retractions and confirmations of `facts` but those of the (tenant, event_id) `exclude`."""
        cur.execute(
            "SELECT memory_id, tenant, event_id, type, valid_from, observed_at, target_version FROM events "
            "WHERE memory_id = ANY(%s) AND type IN ('memory.retracted', 'memory.confirmed')",
            (facts,),
        )
        out: dict[str, list[Mark]] = defaultdict(list)
        for mid, tenant, eid, typ, vf, obs, target in cur.fetchall():
            if (tenant, eid) not in exclude:
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
        if inserts:  # new version_ids only (their events were just logged as new): a plain INSERT
            rows = Jsonb([(*_ROW(v), about_entries(v.subject, v.entities, v.key)) for v in inserts])
            cur.execute(_INSERT_VERSIONS, {"rows": rows, "consumer": self.consumer, "topic": self.topic})
            counts.update((v.tenant, VERSIONS) for v in inserts)
        touched = [*inserts, *updates]
        if touched:
            queued = [(v.version_id, v.tenant, v.subject, v.partition, v.offset) for v in touched]
            cur.execute(  # at its version's place in the log (api.consistency waits for a write's rows by it)
                'INSERT INTO search_outbox (version_id, tenant, subject, op, "partition", "offset") '
                "SELECT v, t, s, 'upsert', p, o "
                "FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[]) AS x(v, t, s, p, o)",
                [list(col) for col in zip(*queued, strict=True)],
            )
            counts.update((v.tenant, OUTBOX) for v in touched)
            cur.execute("SELECT pg_notify(%s, current_schema())", (OUTBOX_CHANNEL,))  # delivered on commit: once

    def _erase(self, cur: psycopg.Cursor, record: Incoming, result: BatchResult) -> set[str]:
        """subject.erased: purge the subject's versions, events and dead letters, keep only the erasure tombstones;
        the keys shredded.

        The purged events' ids stay as salted hashes (erased_events) so that re-sending one has no effect; a letter
        another subject's record left, that one of its events resolved, stays resolved without that event's id and
        reason (`dead_letter_resolutions`: `_resolve_erased` makes the same row in a replay). Then, in
        the same transaction, the subject's data key is destroyed and the erasure record written: a
        worker killed anywhere in between rolls all of it back and its restart does all of it. A replay of an
        erasure already recorded (a rebuild) destroys nothing: the subject's key now may be a newer one.
        """
        e = record.event
        assert e is not None
        if not self._log_events(cur, [record], result):
            return set()  # a duplicate, a conflict (dead-lettered) or a replay: no erasure happens again
        result.applied += 1
        cur.execute(  # its place in time against records of the subject in other partitions (`_cover_elsewhere`)
            'UPDATE events SET logged_at = %s WHERE "partition" = %s AND "offset" = %s',
            (record.timestamp, record.partition, record.offset),
        )
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
        # a receipt cites every event by the version id its id gives (version_id_for), assertions or not: the other
        # events' are kept beside the versions', so a receipt citing a retraction or a confirmation verifies erased
        cur.execute(
            "SELECT event_id FROM events WHERE tenant = %s AND subject = %s "
            "AND type NOT IN ('memory.asserted', 'subject.erased')",
            (e.tenant, e.subject),
        )
        keep_erased_versions(cur, e.tenant, [version_id_for(e.tenant, eid) for (eid,) in cur.fetchall()])
        cur.execute(  # the letters of records naming it logged before it in its partition go with it (a replay never
            # makes them: it cannot open them); one refused after it is news the erasure did not cover
            'DELETE FROM dead_letters WHERE tenant = %s AND subject = %s AND topic = %s AND "partition" = %s '
            'AND "offset" < %s RETURNING topic, event_id, "offset", raw',
            (e.tenant, e.subject, record.topic, record.partition, record.offset),
        )
        letters = cur.fetchall()
        for topic, *_ in letters:
            result.counts[(e.tenant, dead_letters_name(topic))] -= 1
        cur.execute(  # its letters in other partitions (records sent under another key, or none) have no order with
            # it: each keeps its place and code, not its bytes (Recorder.dead_letters does the same to a later one)
            'WITH taken AS (SELECT topic, "partition", "offset", raw FROM dead_letters WHERE tenant = %s '
            'AND subject = %s AND topic = %s AND "partition" <> %s AND raw IS NOT NULL FOR UPDATE) '
            f"UPDATE dead_letters d SET raw = NULL, {_WITHHELD} FROM taken t WHERE d.topic = t.topic "
            'AND d."partition" = t."partition" AND d."offset" = t."offset" RETURNING t.raw',
            (e.tenant, e.subject, record.topic, record.partition, _TOP_FIELDS),
        )
        withheld = [raw for (raw,) in cur.fetchall()]
        # its refused records are the subject's records in the log too: the erasure record counts them sealed or
        # clear, as what stays readable in the topic is what it must tell (of another partition's, those refused
        # before it was applied)
        letter_offsets = [o for _, _, o, _ in letters]
        sealed_letters = sum(1 for raw in [*(raw for *_, raw in letters), *withheld] if SEALED in claimed_fields(raw))
        first_offset = min(o for o in (first_offset, *letter_offsets) if o is not None) if letters else first_offset
        refused = sorted({event_id for _, event_id, *_ in letters if event_id is not None})
        if refused:  # their ids are the erased past too: re-sent, any content is an erased duplicate (no fingerprint
            # kept: the record was refused), and a door's claim of one no longer reads pending
            cur.execute(
                f"INSERT INTO erased_events (tenant, id_hash) SELECT %s, {ID_HASH_SQL.format('i')} "
                "FROM unnest(%s::text[]) AS i ON CONFLICT DO NOTHING",
                (e.tenant, refused),
            )
            cur.execute("DELETE FROM event_claims WHERE tenant = %s AND event_id = ANY(%s)", (e.tenant, refused))
        cur.execute(  # a letter its events resolved stays resolved, by an event whose id and reason go with it
            "UPDATE dead_letter_resolutions r SET event_id = NULL, reason = NULL FROM events e "
            "WHERE e.tenant = %s AND e.subject = %s AND r.tenant = e.tenant AND r.event_id = e.event_id",
            (e.tenant, e.subject),
        )
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
            'INSERT INTO search_outbox (version_id, tenant, subject, op, "partition", "offset") '
            "VALUES (NULL, %s, %s, 'delete_subject', %s, %s)",
            (e.tenant, e.subject, record.partition, record.offset),
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
                records=n_events + len(letters) + len(withheld),
                sealed_records=n_sealed + sealed_letters,
                clear_records=n_events + len(letters) + len(withheld) - n_sealed - sealed_letters,
                key_ids=[k for k, _ in shredded],
                key_fingerprints=[f for _, f in shredded],
                purged={
                    "postgres": {
                        "versions": n_versions,
                        "events": n_events,
                        "accesses": n_accesses,
                        "pending_index": n_outbox,
                        "dead_letters": len(letters),
                    }
                },
            ),
        )
        return {k for k, _ in shredded}


def _route(record: Incoming) -> Route:
    """The event's route; an error of the pure core on it is a poison record."""
    assert record.event is not None
    try:
        return route(record.event.type)
    except _CORE_ERRORS as exc:
        raise CoreRefused(f"{type(exc).__name__}: {exc}") from exc


def version_to_row(v: Version) -> tuple:
    values = list(_ROW(v))  # every column in one C call, cheaper than a getattr loop
    for i in _JSON:
        values[i] = Jsonb(values[i])
    for i in _LISTS:
        values[i] = list(values[i])
    return tuple(values)


# VERSION_COLUMNS is Version's field order (asserted at import): a row is built positionally, faster than by keyword
if tuple(VERSION_COLUMNS) != tuple(f.name for f in dataclasses.fields(Version)):
    raise AssertionError("VERSION_COLUMNS must list Version's fields in their order")
_LISTS = tuple(VERSION_COLUMNS.index(n) for n in ("entities", "aliases", "tags"))
_SOURCE = VERSION_COLUMNS.index("source")
_JSON = (VERSION_COLUMNS.index("value"), _SOURCE)
_ROW = operator.attrgetter(*VERSION_COLUMNS)
# a version's row as the jsonb array `_ROW` gives (the batch's jsonb array of them) taken apart into its columns
_TYPED = {
    "value": "r->{}",
    "source": "r->{}",
    "entities": _TEXTS,
    "aliases": _TEXTS,
    "tags": _TEXTS,
    "confidence": "(r->>{})::float8",
    "importance": "(r->>{})::float8",
    "partition": "(r->>{})::int",
    "offset": "(r->>{})::bigint",
    "version": "(r->>{})::int",
    "confirmed_count": "(r->>{})::int",
    **dict.fromkeys(
        ("observed_at", "valid_from", "asserted_valid_to", "valid_to", "superseded_at", "last_confirmed_at"),
        "(r->>{})::timestamptz",
    ),
}  # the rest: text
# then what the version is about (schema.sql: `about`, cues.about_entries: Python's normal form, which SQL's lacks),
# and what a receipt cites of each (schema.sql: `fingerprint`, `link`), from its event's row and its record's link
# written before it in this transaction: two scalar primary-key lookups in the same statement (a join to the batch made
# the planner hash the whole tables), no round trip of their own
_INSERT_VERSIONS = sql.SQL(
    "INSERT INTO fact_versions ({}, about, fingerprint, link) SELECT {}, " + _TEXTS.format(len(VERSION_COLUMNS)) + ", "
    "(SELECT e.fingerprint FROM events e WHERE e.tenant = r->>{tenant} AND e.event_id = r->>{event_id}), "
    "(SELECT l.link FROM chain_links l WHERE l.consumer = %(consumer)s AND l.topic = %(topic)s "
    'AND l."partition" = (r->>{partition})::int AND l."offset" = (r->>{offset})::bigint) '
    "FROM jsonb_array_elements(%(rows)b) AS r"
).format(
    sql.SQL(", ").join(_Q),
    sql.SQL(", ").join(sql.SQL(_TYPED.get(c, "r->>{}").format(i)) for i, c in enumerate(VERSION_COLUMNS)),
    tenant=sql.SQL(str(VERSION_COLUMNS.index("tenant"))),
    event_id=sql.SQL(str(VERSION_COLUMNS.index("event_id"))),
    partition=sql.SQL(str(VERSION_COLUMNS.index("partition"))),
    offset=sql.SQL(str(VERSION_COLUMNS.index("offset"))),
)
# what Recorder.load_versions leaves out of a stored version (never read from it: see there), and its empty values
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


def _after(r: Incoming, erasure: tuple[str, int, int]) -> bool:
    """Whether record `r` comes after the erasure at (topic, partition, offset) in the log."""
    topic, partition, offset = erasure
    return r.topic == topic and r.partition == partition and r.offset > offset


def _named_ahead(r: Incoming) -> Incoming:
    """`r`, refused if it names a dead letter at or after its own place in its own partition: no record there was
    refused before it, so it could only close a refusal to come, or take the id the letter's own resolution needs
    (`deadletter:<partition>:<offset>`) and leave it unresolvable."""
    link = r.event.dead_letter if r.event is not None else None
    if link is None or link.partition != r.partition or link.offset < r.offset:
        return r
    message = (
        f"names the dead letter at partition {link.partition}, offset {link.offset}, which is not before this record "
        "in its partition: no record there was refused before it"
    )
    return dataclasses.replace(r, event=None, error=InvalidEvent("invalid_value", message, "dead_letter"))


def _key_destroyed(r: Incoming) -> Incoming:
    message = (
        "sealed with a data key that its subject's erasure, earlier in the log, destroyed: the producer held the key "
        "past the erasure, and nobody can open these personal fields now. Publish the event again: it gets a new key"
    )
    return dataclasses.replace(r, envelope=None, event=None, error=InvalidEvent("key_destroyed", message, "sealed.kid"))
