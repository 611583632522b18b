"""Read queries over the projection (the API's facts, history, events and stats) and the checksum.

Async functions take a psycopg AsyncConnection whose search_path is the projection schema (the
API pool). "As of T" is the one "holds at t" rule (`holds_at_sql`, `visible_sql`: the SQL of
projections.versions.holds_at and visible_at, which recall's verification uses too); "as known at T'" re-folds the
subject's versions and marks observed up to T' with the same pure core, so it shows exactly
what the ledger said at T' (later supersessions, retractions and late history left out). The
audit replay (`subject_events`) re-folds the subject's chains the same way to say what each
event does now (`projections.versions.effects`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.types.json import Jsonb

from producers.contract import EventType, rfc3339
from projections import shapes
from projections.postgres.counts import ACCESS_COUNTERS, ACCESSES_ACTIVE, FACTS_ACTIVE, FACTS_ACTIVE_SERVED
from projections.postgres.recorder import VERSION_COLUMNS, row_to_version
from projections.search.cues import about_entry, look_alike_forms
from projections.versions import (
    ERASED_EFFECT,
    NO_EFFECT,
    Mark,
    Route,
    Version,
    effects,
    fold,
    is_override,
    route,
    visible_at,
)

if TYPE_CHECKING:  # the receipt's reads import this module's `shaped`
    from projections.postgres.receipts import Basis

__all__ = [
    "BELOW",
    "EFFECTIVE_TO",
    "OVERRIDE",
    "RETRACTION_ENDED",
    "current_facts",
    "facts_page",
    "episode_holds_sql",
    "event_effect",
    "fact_history",
    "history_page",
    "holds_at_sql",
    "access_summary",
    "below_json",
    "below_sql",
    "invariant_counts",
    "look_alike_subjects",
    "one_snapshot",
    "projection_checksum",
    "shaped",
    "shown_as_known",
    "subject_events",
    "subject_versions",
    "version_dict",
    "visible_sql",
]

_COLS = sql.SQL(", ").join(sql.Identifier(c) for c in VERSION_COLUMNS)
_F_COLS = sql.SQL(", ").join(sql.Identifier("f", c) for c in VERSION_COLUMNS)

# --- "which version holds at t", in SQL ------------------------------------------------------------------------
# The rule is projections.versions.holds_at / visible_at; the search index's filter is
# projections.search.recall.index.holds_at_filter; tests/test_holds_at.py checks that the three agree.

EFFECTIVE_TO = "LEAST(f.valid_to, f.superseded_at)"  # a version's end: LEAST ignores NULLs (NULL only when both are)
OVERRIDE = "(f.kind = 'preference' AND f.asserted_valid_to IS NOT NULL)"  # projections.versions.is_override
# the `events` row `r` is a retraction that ended the retracted version `f` whatever else the ledger knew: by its
# id, or by its time where no override's window holds that time (an override's would end the override instead)
RETRACTION_ENDED = (
    "f.status = 'retracted' AND r.memory_id = f.memory_id AND r.type = 'memory.retracted' "
    "AND r.valid_from = f.valid_to AND (r.target_version = f.version_id OR (r.target_version IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM fact_versions o WHERE o.memory_id = f.memory_id AND "
    + OVERRIDE.replace("f.", "o.")
    + " AND o.valid_from <= r.valid_from AND r.valid_from < o.asserted_valid_to)))"
)


def holds_at_sql(t: str = "t") -> sql.SQL:
    """`f` (a fact_versions row) holds at the valid time %(<t>)s: valid_from <= t < its end (no end: it holds)."""
    return sql.SQL(f"f.valid_from <= %({t})s AND ({EFFECTIVE_TO} IS NULL OR %({t})s < {EFFECTIVE_TO})")


def below_sql(alias: str | None = None, below: str = "below") -> str:
    """The row `alias` (a fact_versions or events row; None: the statement's one table) was logged below the
    positions %(<below>)s (partition -> next offset, a receipt's); a partition they do not name: nothing of it."""
    of = f"{alias}." if alias else ""
    return f'{of}"offset" < coalesce((%({below})s::jsonb ->> {of}"partition"::text)::bigint, 0)'


def episode_holds_sql(t: str = "t", known: str | None = None, below: str | None = None) -> str:
    """An episode `f` holds at the valid time %(<t>)s as the ledger knew it at the transaction time %(<known>)s.

    The fold's rule for a chain of one version (projections.versions): observed by then, inside its asserted
    window, and not ended by a retraction of it (`target_version`, filed under the episode's memory_id by the
    recorder) observed by then whose time lies in that window at or before t. Without `known` it is
    `holds_at_sql`: the stored end is what the ledger knows now. tests/test_time_travel_answers.py checks both
    against the fold. `below` (with `known`): of the episode and its retractions, only what was logged below the
    positions %(<below>)s (a receipt's replay: below_sql).
    """
    if known is None:
        return holds_at_sql(t).as_string()
    logged = f" AND {below_sql('f', below)}" if below else ""
    retraction_logged = f" AND {below_sql('r', below)}" if below else ""
    return (
        f"f.observed_at <= %({known})s{logged} AND f.valid_from <= %({t})s "
        f"AND (f.asserted_valid_to IS NULL OR %({t})s < f.asserted_valid_to) AND NOT EXISTS (SELECT 1 FROM events r "
        "WHERE r.memory_id = f.memory_id AND r.type = 'memory.retracted' AND r.target_version = f.version_id "
        f"AND r.observed_at <= %({known})s{retraction_logged} AND r.valid_from >= f.valid_from "
        f"AND r.valid_from <= %({t})s AND (f.asserted_valid_to IS NULL OR r.valid_from < f.asserted_valid_to))"
    )


def visible_sql(columns: sql.Composable, where: sql.Composable, t: str = "t") -> sql.Composed:
    """SELECT `columns` of the version of each fact (fact_versions `f` matching `where`) that holds at %(<t>)s and
    wins there: an override first, then the latest by (valid_from, observed_at, version_id). One row per
    memory_id, in memory_id order."""
    return sql.SQL(
        "SELECT DISTINCT ON (f.memory_id) {columns} FROM fact_versions f WHERE ({where}) AND {holds} "
        "ORDER BY f.memory_id, " + OVERRIDE + " DESC, f.valid_from DESC, f.observed_at DESC, f.version_id DESC"
    ).format(columns=columns, where=where, holds=holds_at_sql(t))


def _t(value: datetime | None) -> str | None:
    return None if value is None else rfc3339(value)


def version_dict(v: Version) -> shapes.FactVersion:
    """A version as the API shows it (times as RFC 3339, `event_id` = the assertion that made it, as its producer
    named it; `version_id` = version_id_for(tenant, event_id))."""
    return {
        "memory_id": v.memory_id,
        "version_id": v.version_id,
        "event_id": v.event_id,
        "version": v.version,
        "tenant": v.tenant,
        "subject": v.subject,
        "key": v.key,
        "scope": v.scope,
        "kind": v.kind,
        "value": v.value,
        "content": v.content,
        "entities": list(v.entities),
        "aliases": list(v.aliases),
        "tags": list(v.tags),
        "source": v.source,
        "confidence": v.confidence,
        "importance": v.importance,
        "observed_at": _t(v.observed_at),
        "valid_from": _t(v.valid_from),
        "valid_to": _t(v.valid_to),
        "override": is_override(v),
        "status": v.status,
        "superseded_by": v.superseded_by,
        "superseded_at": _t(v.superseded_at),
        "confirmed_count": v.confirmed_count,
        "last_confirmed_at": _t(v.last_confirmed_at),
        "partition": v.partition,
        "offset": v.offset,
    }


_SUBJECT = sql.SQL("f.tenant = %(tenant)s AND f.subject = %(subject)s")
# what a page of them is cut by: the version and the columns of _LISTED_ORDER
_CURRENT_ORDERED = visible_sql(sql.SQL("f.version_id, f.memory_id, f.key, f.scope, f.valid_from"), _SUBJECT)


async def current_facts(
    conn: psycopg.AsyncConnection,
    tenant: str,
    subject: str,
    as_of: datetime,
    known_at: datetime | None = None,
    below: Mapping[int, int] | None = None,
    basis: Basis | None = None,
) -> list[shapes.FactVersion]:
    """The subject's facts holding at valid time `as_of` (an override wins inside its window); with `known_at`
    and/or `below` (partition -> next offset: a receipt's positions) only from the events observed by then and
    logged below those positions, re-folded. `basis`: filled by the read of the current facts (_page_rows); a
    re-fold leaves it as it was."""
    if known_at is not None or below is not None:
        async with one_snapshot(conn):
            chain_rows = await _chain_rows(
                conn, "subject", _known(known_at, below), _chain_args(tenant, subject, known_at, below)
            )
        return _in_force(await shaped(len(chain_rows[0]), _known_facts, chain_rows, as_of, below is not None))
    rows, _ = await _page_rows(
        conn, _CURRENT_ORDERED, _LISTED_ORDER, {"tenant": tenant, "subject": subject, "t": as_of}, 0, None, basis
    )  # the whole list is the page without a limit: one order for both, PostgreSQL's
    return _in_force(await _versions(rows))


def _in_force(facts: list[shapes.FactVersion]) -> list[shapes.FactVersion]:
    """Facts holding at the answer's as_of are `active` there, whatever their chain says of a later valid time (a
    supersession or retraction from then on: `superseded_at` and `valid_to` say when), so a reader that keeps the
    active ones keeps what holds."""
    for fact in facts:
        fact["status"] = "active"
    return facts


# _listed's order in SQL: the "C" collation compares UTF-8 bytes, which order as Python compares code points
_LISTED_ORDER = sql.SQL('coalesce(v.key, \'\') COLLATE "C", v.scope COLLATE "C", v.valid_from, v.memory_id COLLATE "C"')


async def facts_page(
    conn: psycopg.AsyncConnection,
    tenant: str,
    subject: str,
    as_of: datetime,
    offset: int,
    limit: int | None,
    known_at: datetime | None = None,
    below: Mapping[int, int] | None = None,
    basis: Basis | None = None,
) -> tuple[list[shapes.FactVersion], int]:
    """`current_facts(...)[offset:offset + limit]` and how many facts there are in all. The current facts are cut
    in SQL, so a page of a subject's thousands reads and converts only its own rows; as known at a time (or below
    a receipt's positions) the re-fold needs every row, and the list it gives is cut here."""
    if known_at is not None or below is not None:
        listed = await current_facts(conn, tenant, subject, as_of, known_at, below)
        return listed[offset : None if limit is None else offset + limit], len(listed)
    args = {"tenant": tenant, "subject": subject, "t": as_of}
    rows, total = await _page_rows(conn, _CURRENT_ORDERED, _LISTED_ORDER, args, offset, limit, basis)
    return _in_force(await _versions(rows)), total


async def _page_rows(
    conn: psycopg.AsyncConnection,
    ordered: sql.Composable,
    order: sql.Composable,
    params: dict[str, Any],
    offset: int,
    limit: int | None,
    basis: Basis | None = None,
) -> tuple[list[Any], int]:
    """The fact_versions rows (_COLS) of the page `offset` to `offset + limit` of `ordered` (as `v`: the versions'
    ids and the columns `order` names), and how many rows `ordered` has; a page past the end counts them by a
    statement of its own. The whole list is sorted and counted by its narrow columns, and only the page's rows
    are read whole: sorting thousands of whole rows spilled to disk.

    `basis` (an answer's receipt's): the statement also reads what the receipt cites of each row and the positions
    (Basis.COLUMNS), in the answer's own snapshot, so the receipt takes no statement of its own; the page is joined
    to one row of positions, so even an empty page has them."""
    page = sql.SQL(
        "(SELECT v.*, count(*) OVER () AS total FROM ({ordered}) v ORDER BY {order} OFFSET %(offset)s LIMIT %(limit)s) "
        "v JOIN fact_versions f ON f.version_id = v.version_id"
    ).format(ordered=ordered, order=order)
    if basis is None:
        statement = sql.SQL("SELECT {columns}, v.total FROM {page} ORDER BY {order}")
        cited = positions = sql.SQL("")
        args = {**params, "offset": offset, "limit": limit}
    else:
        statement = sql.SQL(
            "SELECT {columns}, {cited}, b.*, v.total FROM (SELECT {positions}) b LEFT JOIN ({page}) ON true "
            "ORDER BY {order}"
        )
        cited, positions = (sql.SQL(c) for c in basis.COLUMNS)
        args = {**params, "offset": offset, "limit": limit, **basis.params()}
    cur = await conn.execute(
        statement.format(columns=_F_COLS, cited=cited, positions=positions, page=page, order=order), args
    )
    rows = await _rows(cur)
    total = rows[0][-1] if rows else None
    rows = [r[:-1] for r in rows]
    if basis is not None:  # a subject's thousands of citations: off the event loop, as the receipt's own read was
        rows = await shaped(len(rows), basis.take_versions, rows)
    if rows or offset == 0:
        return rows, total or 0
    if basis is not None and conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        async with one_snapshot(conn):  # past the end: the empty page, its count and the positions in one snapshot
            return await _page_rows(conn, ordered, order, params, offset, limit, basis)
    cur = await conn.execute(sql.SQL("SELECT count(*) FROM ({}) v").format(ordered), params)
    return [], (await cur.fetchone())[0]


def _known_facts(
    chain_rows: tuple[list[tuple], list[tuple]], as_of: datetime, listed: bool
) -> list[shapes.FactVersion]:
    """The facts holding at `as_of`, re-folded from the chains' rows (`listed`: in the listing's order)."""
    by_fact, marks = _chains(*chain_rows)
    folded = [v for mid, versions in by_fact.items() for v in fold(versions, marks.get(mid, []))]
    held = visible_at(folded, as_of)
    return _listed(held) if listed else [version_dict(v) for v in held]


async def _versions(rows: list[Any]) -> list[shapes.FactVersion]:
    """fact_versions rows (_COLS) as the API shows them, in their order."""
    return await shaped(len(rows), lambda: [version_dict(row_to_version(r)) for r in rows])


def _listed(versions: list[Version]) -> list[shapes.FactVersion]:
    """Facts as the API lists them: by key, scope, valid time and id."""
    versions.sort(key=lambda v: (v.key or "", v.scope, v.valid_from, v.memory_id))
    return [version_dict(v) for v in versions]


_INLINE_ROWS = 200  # rows up to this many are shaped on the event loop (a thread hop costs more)
_T = TypeVar("_T")


async def _rows(cur: psycopg.AsyncCursor[Any]) -> list[Any]:
    """All of `cur`'s rows. psycopg converts a row (its times, its jsonb) when it is fetched, on the event loop: a
    subject's thousands of rows took a hundred milliseconds and more at once, so they are fetched _INLINE_ROWS at a
    time, other requests served between two of them."""
    rows: list[Any] = []
    while chunk := await cur.fetchmany(_INLINE_ROWS):
        rows += chunk
        if len(chunk) < _INLINE_ROWS:
            break
        await asyncio.sleep(0)
    return rows


async def shaped(rows: int, shape: Callable[..., _T], *args: Any) -> _T:
    """shape(*args), what a read makes of its `rows` rows. A subject's thousands of rows (the fold of its chains, each
    row's versions and times) take hundreds of milliseconds of CPU: in a worker thread, so that the event loop
    serves other requests meanwhile (psycopg's conversion of the rows stays on it, in chunks: `_rows`)."""
    return await asyncio.to_thread(shape, *args) if rows > _INLINE_ROWS else shape(*args)


# an event (or version row) logged below the positions `below` names (jsonb {"partition": next_offset})
BELOW = sql.SQL(" AND " + below_sql())


# a row comparison: the index (tenant, subject, partition, offset) starts the page where the one before ended
_PAST = sql.SQL(""" AND ("partition", "offset") > (%(past_partition)s::int, %(past_offset)s::bigint)""")


def below_json(below: Mapping[int, int] | None) -> Jsonb | None:
    return None if below is None else Jsonb({str(p): o for p, o in below.items()})


async def _subject_chains(
    conn: psycopg.AsyncConnection,
    tenant: str,
    subject: str,
    known_at: datetime | None = None,
    below: Mapping[int, int] | None = None,
) -> tuple[dict[str, list[Version]], dict[str, list[Mark]]]:
    """The subject's versions and marks (retractions, confirmations) per memory_id, observed by `known_at` and
    logged below `below` if given."""
    args = _chain_args(tenant, subject, known_at, below)
    return _chains(*await _chain_rows(conn, "subject", _known(known_at, below), args))


async def shown_as_known(
    conn: psycopg.AsyncConnection,
    tenant: str,
    memory_ids: list[str],
    at: datetime,
    known_at: datetime,
    below: Mapping[int, int] | None = None,
) -> tuple[dict[str, str], set[str]]:
    """As the ledger knew the facts `memory_ids` at `known_at` (from the events logged below `below`, if given), by
    the fold of their chains: the version each shows at `at` (memory_id -> version_id; a fact showing none is left
    out), and every version of them that held at `at` then, in any lane, to the millisecond the search index keeps
    (so also one that began or ended in the millisecond of `at`, which the index proposes as holding then)."""
    args = {"tenant": tenant, "memory_ids": memory_ids, "known_at": known_at, "below": below_json(below)}
    chain_rows = await _chain_rows(conn, "facts", _known(known_at, below), args)

    def fold_them() -> tuple[dict[str, str], set[str]]:
        by_fact, marks = _chains(*chain_rows)
        folded = [v for mid, versions in by_fact.items() for v in fold(versions, marks.get(mid, []))]
        shown = {v.memory_id: v.version_id for v in visible_at(folded, at)}
        return shown, {v.version_id for v in folded if _holds_in_millisecond(v, at)}

    return await shaped(len(chain_rows[0]), fold_them)


def _ms(t: datetime) -> datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _holds_in_millisecond(v: Version, at: datetime) -> bool:
    """`v` holds at `at` as the search index's `date` fields judge it (recall.index.holds_at_filter): begun by the
    millisecond of `at`, and not ended before it."""
    ends = [t for t in (v.valid_to, v.superseded_at) if t is not None]
    return _ms(v.valid_from) <= _ms(at) and (not ends or _ms(min(ends)) >= _ms(at))


def _known(known_at: datetime | None, below: Mapping[int, int] | None) -> sql.Composable:
    known = sql.SQL("") if known_at is None else sql.SQL(" AND observed_at <= %(known_at)s")
    return known if below is None else known + BELOW


def _chain_args(
    tenant: str, subject: str, known_at: datetime | None, below: Mapping[int, int] | None
) -> dict[str, Any]:
    return {"tenant": tenant, "subject": subject, "known_at": known_at, "below": below_json(below)}


_CHAIN_OF = {
    "subject": sql.SQL("subject = %(subject)s"),
    "memory_id": sql.SQL("memory_id = %(memory_id)s"),
    # an audit replay page's facts: an event's effect is decided by its own fact's chain alone
    "memory_ids": sql.SQL("subject = %(subject)s AND memory_id = ANY(%(memory_ids)s)"),
    "facts": sql.SQL("memory_id = ANY(%(memory_ids)s)"),  # some facts, of any subjects
}


async def _chain_rows(
    conn: psycopg.AsyncConnection, of: str, known: sql.Composable, args: Mapping[str, Any]
) -> tuple[list[tuple], list[tuple]]:
    """The version rows and the marks' event rows (memory_id first) of one subject's facts, of one fact or of some
    facts of one subject, or of some facts of any (`of`: "subject", "memory_id", "memory_ids" or "facts", named in
    `args` with the tenant), both
    filtered by `known`."""
    of_sql = _CHAIN_OF[of]
    cur = await conn.execute(
        sql.SQL("SELECT {} FROM fact_versions WHERE tenant = %(tenant)s AND {}{}").format(_COLS, of_sql, known), args
    )
    version_rows = await _rows(cur)
    cur = await conn.execute(
        sql.SQL(
            "SELECT memory_id, event_id, type, valid_from, observed_at, target_version FROM events "
            "WHERE tenant = %(tenant)s AND {} AND type IN ('memory.retracted', 'memory.confirmed'){}"
        ).format(of_sql, known),
        args,
    )
    return version_rows, await _rows(cur)


def _chains(
    version_rows: list[tuple], mark_rows: list[tuple]
) -> tuple[dict[str, list[Version]], dict[str, list[Mark]]]:
    versions: dict[str, list[Version]] = defaultdict(list)
    for r in version_rows:
        v = row_to_version(r)
        versions[v.memory_id].append(v)
    marks: dict[str, list[Mark]] = defaultdict(list)
    for mid, eid, typ, vf, obs, target in mark_rows:
        marks[mid].append(Mark(eid, typ, vf, obs, target))
    return versions, marks


_CHAIN = sql.SQL("FROM fact_versions f WHERE f.tenant = %(tenant)s AND f.memory_id = %(memory_id)s")
_HISTORY_ORDERED = sql.SQL("SELECT f.version_id, f.version {}").format(_CHAIN)  # a page of it is cut by version


async def fact_history(
    conn: psycopg.AsyncConnection,
    tenant: str,
    memory_id: str,
    below: Mapping[int, int] | None = None,
    basis: Basis | None = None,
) -> list[shapes.FactVersion]:
    """The fact's versions, oldest first (by valid time); empty if the tenant has no such fact. With `below`
    (partition -> next offset: a receipt's positions): the chain re-folded from the events logged below them.
    `basis`: as current_facts'."""
    return (await history_page(conn, tenant, memory_id, 0, None, below, basis))[0]


async def history_page(
    conn: psycopg.AsyncConnection,
    tenant: str,
    memory_id: str,
    offset: int,
    limit: int | None,
    below: Mapping[int, int] | None = None,
    basis: Basis | None = None,
) -> tuple[list[shapes.FactVersion], int]:
    """`fact_history(...)[offset:offset + limit]` and how many versions there are in all (0: no such fact), cut
    in SQL as facts_page cuts the current facts (below a receipt's positions: the re-folded chain, cut here)."""
    if below is not None:
        versions = await _history_below(conn, tenant, memory_id, below)
        return versions[offset : None if limit is None else offset + limit], len(versions)
    args = {"tenant": tenant, "memory_id": memory_id}
    rows, total = await _page_rows(conn, _HISTORY_ORDERED, sql.SQL("v.version"), args, offset, limit, basis)
    return await _versions(rows), total


async def _history_below(
    conn: psycopg.AsyncConnection, tenant: str, memory_id: str, below: Mapping[int, int]
) -> list[shapes.FactVersion]:
    args = {"tenant": tenant, "memory_id": memory_id, "below": below_json(below)}
    async with one_snapshot(conn):
        version_rows, mark_rows = await _chain_rows(conn, "memory_id", BELOW, args)

    def refolded() -> list[shapes.FactVersion]:
        versions = [row_to_version(r) for r in version_rows]
        marks = [Mark(eid, typ, vf, obs, target) for _, eid, typ, vf, obs, target in mark_rows]
        return [version_dict(v) for v in fold(versions, marks)]

    return await shaped(len(version_rows) + len(mark_rows), refolded)


async def subject_versions(conn: psycopg.AsyncConnection, tenant: str, subject: str) -> list[shapes.FactVersion]:
    """Every version of the subject's facts (current, superseded, retracted), by memory_id then chain order:
    the history lines of POST /v1/context."""
    cur = await conn.execute(
        sql.SQL("SELECT {} FROM fact_versions WHERE tenant = %s AND subject = %s ORDER BY memory_id, version").format(
            _COLS
        ),
        (tenant, subject),
    )
    rows = await _rows(cur)
    return await _versions(rows)


async def subject_events(
    conn: psycopg.AsyncConnection,
    tenant: str,
    subject: str,
    observed_from: datetime | None = None,
    observed_to: datetime | None = None,
    limit: int = 10_000,
    below: Mapping[int, int] | None = None,
    past: tuple[int, int] | None = None,
) -> tuple[list[shapes.LedgerEvent], bool]:
    """The subject's events in ledger order (partition, offset), optionally within [from, to) of observed_at and
    only those placed after `past` (a (partition, offset): where the page before ended), at most `limit` of them,
    and whether there are more (the first `limit` are shown: never a silent cut).

    Each carries `effect`: what it does in its fact's current chain ({effect, version_id, detail},
    projections.versions.effects), folded over all that fact's events, not only those on the page shown (a page of
    few facts reads only their chains: a page of a long log costs its own facts, not the subject's). With `below`
    (partition -> next offset: a receipt's positions) only the events logged below them, effects as they were then.
    """
    async with one_snapshot(conn):
        cur = await conn.execute(
            sql.SQL(
                'SELECT event_id, type, kind, memory_id, key, scope, "partition", "offset", observed_at, valid_from, '
                "valid_to, target_version, payload FROM events WHERE tenant = %(tenant)s AND subject = %(subject)s "
                "AND (%(f)s::timestamptz IS NULL OR observed_at >= %(f)s) "
                "AND (%(t)s::timestamptz IS NULL OR observed_at < %(t)s){}{} "
                'ORDER BY "partition", "offset" LIMIT %(limit)s'
            ).format(sql.SQL("") if below is None else BELOW, sql.SQL("") if past is None else _PAST),
            {
                "tenant": tenant,
                "subject": subject,
                "f": observed_from,
                "t": observed_to,
                "limit": limit + 1,
                "below": below_json(below),
                "past_partition": None if past is None else past[0],
                "past_offset": None if past is None else past[1],
            },
        )
        rows = await _rows(cur)
        more = len(rows) > limit
        rows = rows[:limit]
        facts = sorted({r[3] for r in rows if r[3]})
        args = _chain_args(tenant, subject, None, below) | {"memory_ids": facts}
        of = "memory_ids" if (more or past is not None) and len(facts) <= _PAGE_FACTS else "subject"
        chain_rows = await _chain_rows(conn, of, _known(None, below), args) if rows else ([], [])
        closed = await _letters_closed(conn, tenant, [r[0] for r in rows if route(EventType(r[1])) is Route.RESOLUTION])
    return await shaped(len(rows) + len(chain_rows[0]), _ledger_events, rows, chain_rows, closed), more


async def _letters_closed(conn: psycopg.AsyncConnection, tenant: str, event_ids: list[str]) -> dict[str, str]:
    """Of these resolution events, those that closed a dead letter of the tenant: event_id -> the detail saying which.
    A raw one naming a letter that is not the tenant's, or one another resolution closed first, closed none."""
    if not event_ids:
        return {}
    cur = await conn.execute(  # a resolution is recorded whether or not its letter exists (a rebuild may apply it
        # first): it closed one only where the tenant has that letter, as the listing joins them
        'SELECT r.event_id, r."partition", r."offset", r.state FROM dead_letter_resolutions r JOIN dead_letters d '
        'ON d.topic = r.topic AND d."partition" = r."partition" AND d."offset" = r."offset" AND d.tenant = r.tenant '
        "WHERE r.tenant = %s AND r.event_id = ANY(%s)",
        (tenant, event_ids),
    )
    return {
        eid: f"closes the dead letter at partition {p}, offset {o} ({state}); no fact"
        for eid, p, o, state in await cur.fetchall()
    }


# a part of the log (a page with more after it, or after a cursor) naming up to this many facts reads their chains
# fact by fact (index probes, ~0.1 ms a fact under the API's generic plans); the whole log, or a page of more facts,
# reads the subject's chains in one range (~0.02 ms a row)
_PAGE_FACTS = 256


def _ledger_events(
    rows: list[tuple], chain_rows: tuple[list[tuple], list[tuple]], closed: Mapping[str, str]
) -> list[shapes.LedgerEvent]:
    done = _effects(*_chains(*chain_rows))
    out: list[shapes.LedgerEvent] = []
    for eid, typ, kind, mid, key, scope, part, off, obs, vf, vt, target, payload in rows:
        out.append(
            {
                "event_id": eid,
                "type": typ,
                "kind": kind,
                "memory_id": mid,
                "key": key,
                "scope": scope,
                "partition": part,
                "offset": off,
                "observed_at": _t(obs),
                "valid_from": _t(vf),
                "valid_to": _t(vt),
                "target_version": target,
                "effect": _effect_of(eid, typ, done, closed),
                "event": payload,
            }
        )
    return out


# the subjects of a tenant whose own id reads as %(s)s (case, width, Unicode form, white space at the ends: the cues'
# normal form, as recall reads ids; invisible characters and a dash's kind too: cues.look_alike_forms) and that hold
# facts, when %(s)s itself has no record: no event, no refused record filed under it. A version's `about`
# (schema.sql) holds its subject's whole id first (cues.about_entries), so the GIN index finds the versions naming
# one of the forms, and the first entry keeps those whose subject is it
_LOOK_ALIKES = (
    "SELECT DISTINCT f.subject FROM fact_versions f WHERE f.tenant = %(t)s AND f.subject <> %(s)s "
    "AND f.about && %(about)s::text[] AND f.about[1] = ANY(%(about)s::text[]) "
    "AND NOT EXISTS (SELECT 1 FROM events e WHERE e.tenant = %(t)s AND e.subject = %(s)s) "
    "AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.tenant = %(t)s AND d.subject = %(s)s) "
    "ORDER BY 1 LIMIT 5"
)


async def look_alike_subjects(conn: psycopg.AsyncConnection, tenant: str, subject: str) -> list[str]:
    """Up to five other subjects of `tenant` that read as `subject` and hold facts, when `subject` has no record
    (no event, no refused record filed under it): what a caller erasing `subject` most likely meant."""
    own = [about_entry(form) for form in look_alike_forms(subject)]
    cur = await conn.execute(_LOOK_ALIKES, {"t": tenant, "s": subject, "about": own})
    return [row[0] for row in await cur.fetchall()]


async def event_effect(
    conn: psycopg.AsyncConnection, tenant: str, subject: str, event_id: str, type_: str
) -> shapes.Effect:
    """What one applied event does now in its subject's chains ({effect, version_id, detail}): `subject_events`'
    `effect` of that event alone (GET /v1/events/{event_id})."""
    if route(EventType(type_)) is Route.RESOLUTION:
        return _effect_of(event_id, type_, {}, await _letters_closed(conn, tenant, [event_id]))
    if route(EventType(type_)) is Route.ERASURE:
        return _effect_of(event_id, type_, {})
    async with one_snapshot(conn):
        by_fact, marks = await _subject_chains(conn, tenant, subject)
    return _effect_of(event_id, type_, _effects(by_fact, marks))


_CLOSED_NONE = (
    "closes no dead letter (none of this tenant's at its dead_letter, or another event closed it first); no fact"
)


def _effects(by_fact: dict[str, list[Version]], marks: dict[str, list[Mark]]) -> dict[str, shapes.Effect]:
    """event_id -> its effect, over the subject's chains (event ids are unique within a tenant)."""
    done: dict[str, shapes.Effect] = {}
    for mid in by_fact.keys() | marks.keys():
        done.update(effects(by_fact.get(mid, []), marks.get(mid, [])))
    return done


def _effect_of(
    event_id: str, type_: str, done: dict[str, shapes.Effect], closed: Mapping[str, str] | None = None
) -> shapes.Effect:
    if route(EventType(type_)) is Route.ERASURE:
        return {"effect": ERASED_EFFECT, "version_id": None, "detail": "erased what the subject had before it"}
    if route(EventType(type_)) is Route.RESOLUTION:
        detail = (closed or {}).get(event_id, _CLOSED_NONE)
        return {"effect": NO_EFFECT, "version_id": None, "detail": detail}
    found = done.get(event_id)
    if found is not None:
        return found
    return {"effect": NO_EFFECT, "version_id": None, "detail": "no version of it in the projection"}


@asynccontextmanager
async def one_snapshot(conn: psycopg.AsyncConnection) -> AsyncIterator[None]:
    """Reads that must agree (a page of events and the chains behind it; an answer and the positions its receipt
    names) see one REPEATABLE READ snapshot."""
    if not conn.autocommit or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        yield  # already inside the caller's transaction: its isolation stands
        return
    # said in the BEGIN itself (a SET TRANSACTION after it would cost a round trip of its own), then forgotten: the
    # connection goes back to its pool
    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
    await conn.set_read_only(True)
    try:
        async with conn.transaction():
            yield
    finally:
        await conn.set_isolation_level(None)
        await conn.set_read_only(None)


_INVARIANTS = """
SELECT
  (SELECT count(*) FROM (SELECT memory_id FROM fact_versions
     WHERE tenant = %(tenant)s AND status = 'active' AND valid_to IS NULL AND superseded_by IS NULL
     GROUP BY memory_id HAVING count(*) > 1) d) AS double_active,
  (SELECT count(*) FROM fact_versions f WHERE f.tenant = %(tenant)s AND (
       (f.superseded_by IS NULL) <> (f.superseded_at IS NULL)
    OR (f.status = 'superseded' AND f.superseded_by IS NULL)
    OR (f.status = 'active' AND f.superseded_by IS NOT NULL)
    OR (f.superseded_by IS NOT NULL AND NOT EXISTS (
          SELECT 1 FROM fact_versions n WHERE n.version_id = f.superseded_by AND n.memory_id = f.memory_id
          AND n.version > f.version AND n.valid_from = f.superseded_at))))
  + (SELECT count(*) FROM (SELECT memory_id FROM fact_versions WHERE tenant = %(tenant)s GROUP BY memory_id
       HAVING min(version) <> 1 OR max(version) <> count(*) OR count(DISTINCT version) <> count(*)) g)
    AS chain_integrity_violations,
  (SELECT count(*) FROM fact_versions WHERE tenant = %(tenant)s AND source->>'type' = 'explicit'
     AND confidence <> 1.0) AS explicit_confidence_violations,
  (SELECT count(*) FROM events WHERE tenant = %(tenant)s) AS events_applied,
  (SELECT count(*) FROM fact_versions WHERE tenant = %(tenant)s) AS versions,
  (SELECT count(*) FROM dead_letters) AS dlq_count,
  (SELECT count(*) FROM search_outbox WHERE tenant = %(tenant)s) AS search_outbox_pending
"""


async def invariant_counts(conn: psycopg.AsyncConnection, tenant: str) -> dict[str, int]:
    """The counters of /v1/stats that PostgreSQL alone answers (all 0 but the counts when healthy)."""
    cur = await conn.execute(_INVARIANTS, {"tenant": tenant})
    row = await cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: int(v) for d, v in zip(cur.description, row, strict=True)}


def projection_checksum(conn: psycopg.Connection, schema: str) -> str:
    """md5 over fact_versions and events (and the access tables) in key order, without wall-clock columns.

    Equal for two schemas that hold the same projection, e.g. the live one and a rebuild from offset 0. An access
    table a schema does not have yet (created on the next start) counts as empty.
    """
    parts = []
    with conn.transaction():
        conn.execute("SET LOCAL TimeZone TO 'UTC'")
        for table, key, exclude in (
            # a document revision, drawn anew by a replay; a receipt's copies of `events.fingerprint` (compared there)
            # and of the chain's links (a rebuild chains from offset 0: links a schema older than the chain lacks)
            ("fact_versions", ("version_id",), {"rev", "fingerprint", "link"}),
            # event ids are unique per tenant only; an erasure's `logged_at` is NULL in a row older than the column,
            # where a rebuild fills it in (`ledger verify` compares it with the record)
            ("events", ("tenant", "event_id"), {"recorded_at", "logged_at"}),
            ("accesses", ("tenant", "access_id"), set()),  # the access topic's projection
            ("access_counts", ("tenant", "memory_id"), set()),
        ):
            cols = [
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "ORDER BY ordinal_position",
                    (schema, table),
                ).fetchall()
                if r[0] not in exclude
            ]
            if not cols:  # a table of a later layout step, not created in this schema yet: empty
                parts.append(f"{table}:0:{hashlib.md5(b'').hexdigest()}")
                continue
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), md5(coalesce(string_agg(md5(t::text), '' ORDER BY {key}), '')) "
                    "FROM (SELECT {cols} FROM {tbl}) t"
                ).format(
                    key=sql.SQL(", ").join(sql.Identifier("t", k) for k in key),
                    cols=sql.SQL(", ").join(sql.Identifier(c) for c in cols),
                    tbl=sql.Identifier(schema, table),
                )
            ).fetchone()
            assert row is not None
            parts.append(f"{table}:{row[0]}:{row[1]}")
    return hashlib.md5("|".join(parts).encode()).hexdigest()


# --- access tracking: what recall and context served ----------------------------------------------------

_ACCESS_COUNTERS = """
SELECT name, coalesce(sum(n), 0) FROM counts WHERE tenant = %(tenant)s AND name = ANY(%(names)s) GROUP BY name
"""
# any version of a fact names its subject, key and scope (its memory_id is their digest): the first one found
_MOST_SERVED = """
SELECT a.memory_id, v.subject, v.key, v.scope, a.accesses, a.last_accessed_at
FROM access_counts a
JOIN LATERAL (SELECT f.subject, f.key, f.scope FROM fact_versions f WHERE f.memory_id = a.memory_id
              AND f.tenant = a.tenant LIMIT 1) v ON true
WHERE a.tenant = %(tenant)s
ORDER BY a.accesses DESC, a.last_accessed_at DESC, a.memory_id
LIMIT %(top)s
"""


async def access_summary(conn: psycopg.AsyncConnection, tenant: str, *, top: int = 10) -> shapes.AccessSummary:
    """How much of what the tenant knows is ever served: the never-retrieved ratio and the most-served facts.

    `never_retrieved_ratio` = (active facts - active facts served at least once by recall or context) / active
    facts (None without active facts); `accesses_of_active` sums their accesses. A fact is *active* while one of
    its versions has status `active`: neither superseded nor retracted (an asserted valid_to that has passed, or a
    valid_from still to come, does not make it inactive). All three are counters (projections.postgres.counts,
    kept by the recorder and the access projector in their transactions), so this is a few index lookups.

    Not "facts with a version that holds now" (valid time): that set depends on the clock, so no writer can keep a
    counter of it, and counting it scans every version of the tenant, as does a walk of access_counts per served
    fact (bench/results/stats-20261201T152041Z.md). `active` is stored with the row and changes only when an event
    changes the chain.

    `most_served`: the `top` facts by accesses (then the latest access, then memory_id), active or not, with their
    subject and key: the first rows of the index access_counts_most, one probe of fact_versions each.
    """
    async with one_snapshot(conn):
        cur = await conn.execute(_ACCESS_COUNTERS, {"tenant": tenant, "names": list(ACCESS_COUNTERS)})
        counted = {name: int(n) for name, n in await _rows(cur)}
        cur = await conn.execute(_MOST_SERVED, {"tenant": tenant, "top": top})
        most = await _rows(cur)
    active, served = counted.get(FACTS_ACTIVE, 0), counted.get(FACTS_ACTIVE_SERVED, 0)
    return {
        "active_facts": active,
        "served_facts": served,
        "never_retrieved_ratio": round((active - served) / active, 6) if active else None,
        "accesses_of_active": counted.get(ACCESSES_ACTIVE, 0),
        "most_served": [
            {"memory_id": m, "subject": s, "key": k, "scope": sc, "accesses": int(n), "last_accessed_at": _t(last)}
            for m, s, k, sc, n, last in most
        ],
    }
