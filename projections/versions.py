"""The pure core of the fact projection: events in, version-row changes out (fact_versions rows).

A fact's chain is a function of the set of its events: `fold` recomputes every derived column from the events of
one `memory_id`, so arrival order never matters, a replay gives the same rows, and `apply`/`plan` only diff the
recomputed chain against the stored one. `route` is the one dispatch on the event type. The policies (main lane,
overrides, episodes, retractions of the version visible at their time, applied in (valid_from, observed_at,
event_id) order, confirmations) are in README.md, "Versions are a function of the set of a fact's events".
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, assert_never

from producers.contract import EventType, Kind, MemoryEvent, rfc3339

__all__ = [
    "Additions",
    "additions",
    "EFFECTS",
    "ERASED_EFFECT",
    "NO_EFFECT",
    "Changes",
    "Mark",
    "Route",
    "Version",
    "apply",
    "chain_problems",
    "effects",
    "fact_of",
    "fold",
    "holds_at",
    "is_override",
    "mark_of",
    "new_version",
    "plan",
    "route",
    "visible_at",
]

ACTIVE, SUPERSEDED, RETRACTED = "active", "superseded", "retracted"
# columns that fold() derives; everything else in a version row comes from its event, once
DERIVED = ("valid_to", "status", "superseded_by", "superseded_at", "version", "confirmed_count", "last_confirmed_at")
_DERIVED_OF = operator.attrgetter(*DERIVED)  # a tuple of them, in this order


@dataclass(slots=True)
class Version:
    """One fact_versions row. Never assigned to once built (fold builds a new one when its derived columns change),
    yet not `frozen`: a frozen dataclass sets each of its 28 fields through object.__setattr__, ~10x a plain
    __init__, and the projector builds several a record."""

    version_id: str  # version_id_for(tenant, event_id): unique across tenants
    event_id: str  # the assertion's event id, as its producer chose it
    memory_id: str
    tenant: str
    subject: str
    key: str | None
    scope: str
    kind: str
    value: Any
    content: str
    entities: tuple[str, ...]
    aliases: tuple[str, ...]
    tags: tuple[str, ...]
    source: dict[str, Any]
    confidence: float
    importance: float
    observed_at: datetime
    valid_from: datetime
    asserted_valid_to: datetime | None
    partition: int
    offset: int
    valid_to: datetime | None = None
    status: str = ACTIVE
    superseded_by: str | None = None
    superseded_at: datetime | None = None
    version: int = 0
    confirmed_count: int = 0
    last_confirmed_at: datetime | None = None

    @property
    def order(self) -> tuple[datetime, datetime, str]:
        return (self.valid_from, self.observed_at, self.version_id)

    def derived(self) -> tuple[Any, ...]:
        return _DERIVED_OF(self)  # one C call: asked per fold, a generator costs the worker


# the fields a version takes from its event (all but DERIVED, which are its last fields, in their order)
_SOURCED = tuple(f.name for f in dataclasses.fields(Version))[: -len(DERIVED)]
if tuple(f.name for f in dataclasses.fields(Version))[len(_SOURCED) :] != DERIVED:
    raise AssertionError("DERIVED must be Version's last fields, in their order")
_SOURCED_OF = operator.attrgetter(*_SOURCED)


@dataclass(frozen=True, slots=True)
class Mark:
    """A retraction or confirmation of a fact: its times (and a retraction's target) are all the chain needs."""

    event_id: str
    type: str  # EventType value
    valid_from: datetime
    observed_at: datetime
    target: str | None = None  # a retraction's target version_id (None: the version visible at valid_from)

    @property
    def order(self) -> tuple[datetime, datetime, str]:
        return (self.valid_from, self.observed_at, self.event_id)


class Route(StrEnum):
    """Where an event goes in the projection: one place decides, so a new EventType cannot fall through."""

    VERSION = "version"  # creates a fact version (new_version)
    MARK = "mark"  # retracts or confirms a fact's versions (mark_of)
    ERASURE = "erasure"  # purges a subject; no per-fact change
    RESOLUTION = "resolution"  # closes a dead letter (the recorder records it); no per-fact change


def route(event_type: EventType) -> Route:
    """The route of an event type. Exhaustive: a new EventType fails type checking and the unit test."""
    match event_type:
        case EventType.ASSERTED:
            return Route.VERSION
        case EventType.RETRACTED | EventType.CONFIRMED:
            return Route.MARK
        case EventType.ERASED:
            return Route.ERASURE
        case EventType.DISCARDED:
            return Route.RESOLUTION
        case _:
            assert_never(event_type)


@dataclass
class Changes:
    """What one event (or a batch of them) does to one fact's rows."""

    inserts: list[Version] = field(default_factory=list)
    updates: list[Version] = field(default_factory=list)

    @property
    def outbox(self) -> list[Version]:
        """Every inserted or updated version is re-indexed by search."""
        return [*self.inserts, *self.updates]

    def __bool__(self) -> bool:
        return bool(self.inserts or self.updates)


def new_version(event: MemoryEvent, partition: int, offset: int) -> Version:
    """The version row an assertion creates, before its chain columns are folded in."""
    if route(event.type) is not Route.VERSION:
        raise ValueError(f"{event.type.value} does not create a version")
    assert event.valid_from is not None and event.content is not None  # the contract fills/demands them
    return Version(
        version_id=event.version_id,
        event_id=event.event_id,
        memory_id=event.memory_id,
        tenant=event.tenant,
        subject=event.subject,
        key=event.key,
        scope=event.scope,
        kind=event.kind.value,
        value=event.value,
        content=event.content,
        entities=tuple(event.entities),
        aliases=tuple(event.aliases),
        tags=tuple(event.tags),
        source=event.source.model_dump(mode="json", exclude_none=True),
        confidence=float(event.confidence if event.confidence is not None else 0.8),
        importance=float(event.importance),
        observed_at=event.observed_at,
        valid_from=event.valid_from,
        asserted_valid_to=event.valid_to,
        valid_to=event.valid_to,
        partition=partition,
        offset=offset,
    )


def mark_of(event: MemoryEvent) -> Mark:
    """The mark a retraction or confirmation leaves on its fact."""
    if route(event.type) is not Route.MARK:
        raise ValueError(f"{event.type.value} is not a retraction or confirmation")
    assert event.valid_from is not None
    return Mark(event.event_id, event.type.value, event.valid_from, event.observed_at, event.target_version)


def _show(t: datetime | None) -> str:
    return "open end" if t is None else rfc3339(t)


def is_override(v: Version) -> bool:
    """A preference with a bounded valid_to shadows the long-term value; it supersedes nothing."""
    return v.kind == Kind.PREFERENCE.value and v.asserted_valid_to is not None


def _covering(main: Sequence[Version], ends: Sequence[datetime | None], t: datetime) -> int | None:
    """Index of the main-lane version in force at valid time t (None: nothing was)."""
    for i in range(len(main) - 1, -1, -1):
        if main[i].valid_from <= t:
            end = ends[i]
            return i if end is None or t < end else None
    return None


def _holds(v: Version, end: datetime | None, t: datetime) -> bool:
    return v.valid_from <= t and (end is None or t < end)


@dataclass(frozen=True, slots=True)
class _MarkOutcome:
    """What one retraction or confirmation did in the fold: the version it hit, or why none."""

    version_id: str | None
    why_not: str = ""


@dataclass
class _Folded:
    rows: list[Version]
    marks: dict[str, _MarkOutcome]  # mark event_id -> outcome
    retracted_by: dict[str, Mark]  # version_id -> the retraction that ended it


def _fold(versions: Iterable[Version], marks: Iterable[Mark]) -> _Folded:
    rows = sorted(versions, key=lambda v: v.order)
    by_id = {v.version_id: v for v in rows}
    main = [v for v in rows if not is_override(v)]
    overrides = [v for v in rows if is_override(v)]
    valid_to: dict[str, datetime | None] = {v.version_id: v.asserted_valid_to for v in rows}
    next_of: dict[str, Version] = {main[i].version_id: main[i + 1] for i in range(len(main) - 1)}
    retracted_by: dict[str, Mark] = {}
    outcomes: dict[str, _MarkOutcome] = {}
    confirmed: dict[str, list[datetime]] = {}

    def ends() -> dict[str, datetime | None]:
        """Each version's end as things stand: its valid_to, and for the main lane its successor's start."""
        out = dict(valid_to)
        for v in main:
            nxt = next_of.get(v.version_id)
            candidates = [t for t in (valid_to[v.version_id], nxt.valid_from if nxt else None) if t is not None]
            out[v.version_id] = min(candidates) if candidates else None
        return out

    def main_ends(end: dict[str, datetime | None]) -> list[datetime | None]:
        return [end[v.version_id] for v in main]

    def retracted_earlier(t: datetime, unretracted: dict[str, datetime | None], only: str | None) -> str:
        """Why nothing was in force at t: the versions that would have held were already retracted."""
        hits = [
            f"{by_id[vid].event_id} at {_show(r.valid_from)} by {r.event_id}"
            for vid, r in sorted(retracted_by.items(), key=lambda kv: kv[1].order)
            if (only is None or vid == only) and _holds(by_id[vid], unretracted[vid], t)
        ]
        return f" (already retracted: {', '.join(hits)})" if hits else ""

    ordered = sorted(marks, key=lambda m: m.order)
    unretracted = ends()
    for m in ordered:  # retractions first, in valid-time order: the earliest one ends a version
        if m.type != EventType.RETRACTED.value:
            continue
        t, end = m.valid_from, ends()
        hit: Version | None = None
        if m.target is not None:
            target = by_id.get(m.target)
            if target is None:
                outcomes[m.event_id] = _MarkOutcome(None, f"target {m.target} is not a version of this fact")
            elif not _holds(target, end[target.version_id], t):
                why = retracted_earlier(t, unretracted, target.version_id)
                outcomes[m.event_id] = _MarkOutcome(None, f"target {target.event_id} not in force at {_show(t)}{why}")
            else:
                hit = target
        else:  # the version visible at t: the override in force (the latest, as visible_at picks), else the main lane
            live = [o for o in overrides if _holds(o, end[o.version_id], t)]
            i = _covering(main, main_ends(end), t)
            hit = max(live, key=lambda o: o.order) if live else (main[i] if i is not None else None)
            if hit is None:
                why = retracted_earlier(t, unretracted, None)
                outcomes[m.event_id] = _MarkOutcome(None, f"no version in force at {_show(t)}{why}")
        if hit is not None:
            valid_to[hit.version_id] = t
            retracted_by[hit.version_id] = m
            outcomes[m.event_id] = _MarkOutcome(hit.version_id)
    final = ends()
    live_main = main_ends(final)
    for m in ordered:
        if m.type != EventType.CONFIRMED.value:
            continue
        i = _covering(main, live_main, m.valid_from)
        if i is None:
            override = any(_holds(o, final[o.version_id], m.valid_from) for o in overrides)
            what = "no long-term version" if override else "no version"  # confirmations count on the main lane
            outcomes[m.event_id] = _MarkOutcome(None, f"{what} in force at {_show(m.valid_from)}")
        else:
            confirmed.setdefault(main[i].version_id, []).append(m.observed_at)
            outcomes[m.event_id] = _MarkOutcome(main[i].version_id)

    out: list[Version] = []
    for number, v in enumerate(rows, start=1):
        nxt = next_of.get(v.version_id)
        if v.version_id in retracted_by:
            status = RETRACTED
        elif nxt is not None:
            status = SUPERSEDED
        else:
            status = ACTIVE
        confirms = confirmed.get(v.version_id, [])
        derived = (
            valid_to[v.version_id],
            status,
            nxt.version_id if nxt else None,
            nxt.valid_from if nxt else None,
            number,
            len(confirms),
            max(confirms) if confirms else None,
        )
        # a version whose derived columns stay as they are is kept, not copied (never assigned to): most of a long
        # chain, at every batch that touches the fact; a changed one is built positionally (the derived columns
        # are its last fields), which costs half of dataclasses.replace's keywords
        out.append(v if v.derived() == derived else Version(*_SOURCED_OF(v), *derived))
    return _Folded(out, outcomes, retracted_by)


def fold(versions: Iterable[Version], marks: Iterable[Mark]) -> list[Version]:
    """Recompute the derived columns of one fact's versions from its assertions and marks.

    Returns the versions ordered by valid time, numbered 1..n. Depends only on the sets given,
    never on their order.
    """
    return _fold(versions, marks).rows


# What an event does in its fact's folded chain (`effects`): assertions ...
ACTIVE_EFFECT = "active"  # the current main-lane version (no successor, not retracted)
SUPERSEDED_EFFECT = "superseded"  # replaced by a later version that was observed no earlier
HISTORY_EFFECT = "history"  # arrived late: its successor was observed before it, so it only fills the past
OVERRIDE_EFFECT = "override"  # a temporary override (preference with valid_to), not retracted
RETRACTED_EFFECT = "retracted"  # ended by a retraction
# ... and marks
ENDED_EFFECT = "ended"  # a retraction that ended a version (version_id)
CONFIRMED_EFFECT = "confirmed"  # a confirmation that counted on a version (version_id)
NO_EFFECT = "no_effect"  # a retraction or confirmation that matched nothing; detail says why
ERASED_EFFECT = "erased"  # subject.erased (named by the audit replay; not per fact, so effects() never gives it)
EFFECTS = (
    ACTIVE_EFFECT,
    SUPERSEDED_EFFECT,
    HISTORY_EFFECT,
    OVERRIDE_EFFECT,
    RETRACTED_EFFECT,
    ENDED_EFFECT,
    CONFIRMED_EFFECT,
    NO_EFFECT,
    ERASED_EFFECT,
)


def _effect(effect: str, version_id: str | None, detail: str) -> dict[str, Any]:
    return {"effect": effect, "version_id": version_id, "detail": detail}


def effects(versions: Iterable[Version], marks: Iterable[Mark]) -> dict[str, dict[str, Any]]:
    """What each event of one fact does now, keyed by event_id (assertions by Version.event_id).

    Each value is {"effect": one of EFFECTS, "version_id": the version made/ended/confirmed (None
    for no_effect), "detail": a sentence saying why}. Recomputed from the same fold as the rows,
    so it is a function of the set of events and changes as later events arrive (an `active`
    version becomes `superseded`). A mark of a fact with no versions is `no_effect`.
    """
    marks = list(marks)
    folded = _fold(versions, marks)
    by_id = {v.version_id: v for v in folded.rows}
    out: dict[str, dict[str, Any]] = {}
    for v in folded.rows:
        r = folded.retracted_by.get(v.version_id)
        nxt = by_id.get(v.superseded_by) if v.superseded_by else None
        if r is not None:
            eff = _effect(RETRACTED_EFFECT, v.version_id, f"ended at {_show(r.valid_from)} by retraction {r.event_id}")
        elif nxt is not None and nxt.observed_at < v.observed_at:
            eff = _effect(
                HISTORY_EFFECT,
                v.version_id,
                f"arrived after {nxt.event_id} (observed {_show(nxt.observed_at)}), which supersedes it from "
                f"{_show(v.superseded_at)}: kept as history for {_show(v.valid_from)} to {_show(v.superseded_at)}",
            )
        elif nxt is not None:
            detail = f"superseded by {nxt.event_id} from {_show(v.superseded_at)}"
            eff = _effect(SUPERSEDED_EFFECT, v.version_id, detail)
        elif is_override(v):
            eff = _effect(
                OVERRIDE_EFFECT,
                v.version_id,
                f"overrides the long-term value from {_show(v.valid_from)} to {_show(v.valid_to)}",
            )
        else:
            until = f" until {_show(v.valid_to)}" if v.valid_to is not None else ""
            detail = f"the latest version (v{v.version}), in force from {_show(v.valid_from)}{until}"
            eff = _effect(ACTIVE_EFFECT, v.version_id, detail)
        out[v.event_id] = eff
    for m in marks:
        o = folded.marks.get(m.event_id)
        if o is None or o.version_id is None:
            why = o.why_not if o is not None else f"{m.type} is not a retraction or confirmation"
            out[m.event_id] = _effect(NO_EFFECT, None, why)
            continue
        hit = by_id[o.version_id]
        if m.type == EventType.RETRACTED.value:
            what = "the override" if is_override(hit) else "version"
            detail = f"ended {what} {hit.event_id} at {_show(m.valid_from)}"
            out[m.event_id] = _effect(ENDED_EFFECT, hit.version_id, detail)
        else:
            out[m.event_id] = _effect(CONFIRMED_EFFECT, hit.version_id, f"confirmed version {hit.event_id}")
    return out


def plan(
    versions: Sequence[Version],
    marks: Sequence[Mark],
    new_versions: Iterable[Version] = (),
    new_marks: Iterable[Mark] = (),
) -> Changes:
    """The inserts and updates that bring one fact's stored rows to the folded state.

    `versions`/`marks` are what is stored; the new ones are added unless their event_id is
    already known (a duplicate has no effect at all).
    """
    known_versions = {v.version_id for v in versions}
    known_marks = {m.event_id for m in marks}
    added_v = [v for v in _unique(new_versions, lambda v: v.version_id) if v.version_id not in known_versions]
    added_m = [m for m in _unique(new_marks, lambda m: m.event_id) if m.event_id not in known_marks]
    if not added_v and not added_m:
        return Changes()
    stored = {v.version_id: v for v in versions}
    changes = Changes()
    for v in fold([*versions, *added_v], [*marks, *added_m]):
        old = stored.get(v.version_id)
        if old is None:
            changes.inserts.append(v)
        elif old.derived() != v.derived():
            changes.updates.append(v)
    return changes


@dataclass
class Additions:
    """What a run of events adds to each fact it touches: new versions and new marks, by memory_id."""

    versions: dict[str, list[Version]] = field(default_factory=dict)
    marks: dict[str, list[Mark]] = field(default_factory=dict)

    @property
    def facts(self) -> list[str]:
        return sorted(set(self.versions) | set(self.marks))


def fact_of(event: MemoryEvent, resolved: Mapping[tuple[str, str], str] | None = None) -> str:
    """The memory_id whose chain `event` belongs to: its own, or for a retraction the recorder resolved by its
    target (an episode, or no key named) the target's (`resolved`: (tenant, event_id) -> memory_id)."""
    if resolved:
        return resolved.get((event.tenant, event.event_id), event.memory_id)
    return event.memory_id


def additions(
    events: Iterable[tuple[MemoryEvent, int, int]], resolved: Mapping[tuple[str, str], str] | None = None
) -> Additions:
    """The one dispatch on the event type, shared by the recorder and `apply` (and so by the tests).

    `events` are (event, partition, offset); `resolved` files the retractions resolved by their target under the
    target's fact (`fact_of`). `subject.erased` adds nothing to a fact: the recorder purges the subject on its own,
    so meeting one here is a caller's mistake (ValueError).
    """
    out = Additions()
    for event, partition, offset in events:
        match route(event.type):
            case Route.VERSION:
                out.versions.setdefault(event.memory_id, []).append(new_version(event, partition, offset))
            case Route.MARK:
                out.marks.setdefault(fact_of(event, resolved), []).append(mark_of(event))
            case Route.ERASURE:
                raise ValueError("subject.erased is not a change of one fact (the recorder purges the subject)")
            case Route.RESOLUTION:
                continue  # a discarded dead letter changes no fact: the recorder records the resolution
            case other:
                assert_never(other)
    return out


def apply(
    event: MemoryEvent, versions: Sequence[Version], marks: Sequence[Mark], *, partition: int, offset: int
) -> Changes:
    """What one event does to its fact, given the fact's stored versions and marks.

    The same path as the recorder's (`additions` then `plan`); `subject.erased` is not a per-fact
    change (the recorder purges the subject): no Changes.
    """
    if route(event.type) in (Route.ERASURE, Route.RESOLUTION):
        return Changes()
    added = additions([(event, partition, offset)])
    mid = event.memory_id
    return plan(versions, marks, added.versions.get(mid, []), added.marks.get(mid, []))


def _unique(items: Iterable[Any], key: Any) -> list[Any]:
    seen: set[str] = set()
    out = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def holds_at(v: Version, t: datetime) -> bool:
    """The one "holds at t" rule: a version holds at valid time t on [valid_from, min(valid_to, superseded_at)).

    Retracted and superseded versions still hold before their end, so `as_of` in the past shows them. The same
    rule in SQL is projections.postgres.queries.holds_at_sql (and visible_sql for `visible_at`), in the search
    index's filter projections.search.recall.index.holds_at_filter; tests/test_holds_at.py checks they agree.
    """
    return (
        v.valid_from <= t
        and (v.valid_to is None or t < v.valid_to)
        and (v.superseded_at is None or t < v.superseded_at)
    )


def visible_at(rows: Iterable[Version], t: datetime) -> list[Version]:
    """The version of each fact that holds at valid time t (`holds_at`): an override wins inside its window,
    else the latest by (valid_from, observed_at, version_id)."""
    best: dict[str, Version] = {}
    for v in rows:
        if not holds_at(v, t):
            continue
        cur = best.get(v.memory_id)
        if cur is None or (is_override(v), v.order) > (is_override(cur), cur.order):
            best[v.memory_id] = v
    return sorted(best.values(), key=lambda v: (v.key or "", v.scope, v.valid_from, v.memory_id))


def chain_problems(rows: Sequence[Version]) -> list[str]:
    """Invariant violations among one fact's rows (empty: healthy); the tests and /v1/stats check the same."""
    problems: list[str] = []
    by_id = {v.version_id: v for v in rows}
    numbers = sorted(v.version for v in rows)
    if numbers != list(range(1, len(rows) + 1)):
        problems.append(f"versions are {numbers}, not 1..{len(rows)}")
    current = [v for v in rows if v.status == ACTIVE and v.valid_to is None and v.superseded_by is None]
    if len(current) > 1:
        problems.append(f"{len(current)} active open-ended versions")
    for v in rows:
        if (v.superseded_by is None) != (v.superseded_at is None):
            problems.append(f"{v.version_id}: superseded_by and superseded_at disagree")
        if v.status == SUPERSEDED and v.superseded_by is None:
            problems.append(f"{v.version_id}: superseded without a successor")
        if v.status == ACTIVE and v.superseded_by is not None:
            problems.append(f"{v.version_id}: active but superseded")
        nxt = by_id.get(v.superseded_by) if v.superseded_by else None
        if v.superseded_by and nxt is None:
            problems.append(f"{v.version_id}: successor {v.superseded_by} missing")
        if nxt is not None and (nxt.version <= v.version or nxt.valid_from != v.superseded_at):
            problems.append(f"{v.version_id}: successor out of order")
    return problems
