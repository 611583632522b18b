"""The exact stage's question about entity ids, asked of PostgreSQL's current state instead of the search index.

A fact about a never-seen entity is in PostgreSQL as soon as the projection commits it, before any indexer writes
its document, and the same ask is also faster here (docs/INTERNALS.md, "Exact answers from PostgreSQL"). Rows are
selected by the rules of the index's exact search (recall.index.ElasticIndex.exact_body), so the answer is the one
the index would give; verification then re-reads each candidate as for any other stage.
`exact_current_marked` also reads the tenant's newest vocab_log sequence, so a cached vocabulary learns whether it
was current without a round trip of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from projections.postgres.queries import RETRACTION_ENDED, below_json, below_sql, holds_at_sql
from projections.search.cues import about_entry, event_types_in, key_phrases, normalize_entity, subject_ids
from projections.search.recall.model import Candidate, Scope
from projections.search.vocab import NEWEST_SQL

__all__ = ["exact_current", "exact_current_marked", "known_sql"]

# what a version is about (schema.sql's `about`, GIN-indexed): its ids normalized as the cues are, and with keys the
# (id, key) pairs, so an ask for one key of an entity with thousands of facts reads that key's versions
_ABOUT = "f.about && %(about)s::text[]"
_COLUMNS = (
    "f.version_id, f.memory_id, f.subject, f.entities, f.key, f.scope, f.kind, f.content, f.aliases, f.tags, "
    "f.source, f.valid_from, f.observed_at"
)


def _ms(t: str) -> str:
    """`t` cut to the millisecond, as the index's `date` fields hold times and recall.index._ms cuts the asked ones."""
    return f"date_trunc('milliseconds', {t})"


def known_sql(below: bool) -> str:
    """recall.index._in_force, as known then, each time cut to the millisecond as the index's are: begun by then,
    and not ended before then by its own valid_to, a successor known before then or a retraction known before then
    that ended it whatever else was known (queries.RETRACTION_ENDED); with `below` (a replay), each only if logged
    below the receipt's positions. Any such retraction counts here, where a document keeps its first in the log:
    this may leave out more than the index, never a version that held then (both propose supersets of the fold's)."""
    at, known = _ms("%(at)s"), _ms("%(known_at)s")
    s_below, r_below = (f" AND {below_sql('s')}", f" AND {below_sql('r')}") if below else ("", "")
    return (
        f"{_ms('f.valid_from')} <= {at} AND {_ms('f.observed_at')} <= {known} "
        f"AND (f.asserted_valid_to IS NULL OR {_ms('f.asserted_valid_to')} >= {at}) "
        f"AND NOT ({_ms('f.superseded_at')} < {at} AND EXISTS (SELECT 1 FROM fact_versions s "
        f"WHERE s.version_id = f.superseded_by AND {_ms('s.observed_at')} < {known}{s_below})) "
        f"AND NOT ({_ms('f.valid_to')} < {at} AND EXISTS (SELECT 1 FROM events r "
        f"WHERE {RETRACTION_ENDED} AND {_ms('r.observed_at')} < {known}{r_below}))"
        + (f" AND {below_sql('f')}" if below else "")
    )


_KNOWN, _KNOWN_BELOW = known_sql(False), known_sql(True)
_HOLDS = holds_at_sql("at").as_string()
_FILTERS = {  # RecallFilters, as the index's terms filters on the document's fields
    "kind": "f.kind = ANY(%(kind)s)",
    "key": "f.key = ANY(%(key)s)",
    "scope": "f.scope = ANY(%(scope)s)",
    "tags": "f.tags && %(tags)s::text[]",
    "source_type": "f.source->>'type' = ANY(%(source_type)s)",
}
_TIME = (  # recall.index.ElasticIndex.filters: events and episodes only inside the time cue, other kinds regardless
    "(f.kind NOT IN ('event', 'episodic') OR (f.valid_from >= %(start)s AND f.valid_from < %(end)s) "
    "OR (f.observed_at >= %(start)s AND f.observed_at < %(end)s))"
)
# the index's sort: valid_from desc (a `date` field holds milliseconds), then the id (a keyword: bytes)
_ORDER = " ORDER BY date_trunc('milliseconds', f.valid_from) DESC, f.version_id COLLATE \"C\""


def _query(
    scope: Scope, keys: Sequence[str], event_types: Sequence[str], size: int, columns: str = _COLUMNS
) -> tuple[str, dict[str, Any]]:
    """The SQL of the ask and its parameters. Event types are read from the text (cues.event_types_in), so with
    them the key is not a filter of its own and every row about the ids comes back; otherwise the first `size` of
    the rows about the ids (with keys: about an id with one of the keys)."""
    about = _about(scope.entities, () if event_types else keys)
    params: dict[str, Any] = {"tenant": scope.tenant, "at": scope.at, "about": about, "size": size}
    where = ["f.tenant = %(tenant)s", _ABOUT]
    if scope.known_at is not None:
        params["known_at"] = scope.known_at
        if scope.below is None:
            where.append(_KNOWN)
        else:  # a replay: only what was logged below its receipt's positions (index._in_force)
            where.append(_KNOWN_BELOW)
            params["below"] = below_json(scope.below)
    else:
        where.append(_HOLDS)
    if scope.subject:
        where.append("f.subject = %(subject)s")
        params["subject"] = scope.subject
    for name, values in scope.filters.items():
        where.append(_FILTERS[name])
        params[name] = list(values)
    if scope.time is not None:
        where.append(_TIME)
        params.update(start=scope.time.start, end=scope.time.end)
    limit = "" if event_types else " LIMIT %(size)s"
    return f"SELECT {columns} FROM fact_versions f WHERE {' AND '.join(where)}{_ORDER}{limit}", params


def _about(ids: Sequence[str], keys: Sequence[str] = ()) -> list[str]:
    """The entries of `about` to look up (cues.about_entry): each id, or with keys every (id, key) pair."""
    if keys:
        return [about_entry(i, k) for i in ids for k in keys]
    return [about_entry(i) for i in ids]


def _selected(row: dict[str, Any], scope: Scope, keys: Sequence[str], event_types: Sequence[str]) -> bool:
    """Whether the index's exact search would return `row`'s document (the fields build_doc gives it): the SQL
    narrowed by the same rules; this decides by the document's own functions (ids, event types)."""
    about = {normalize_entity(e) for e in row["entities"] or ()} | set(subject_ids(row["subject"]))
    if about.isdisjoint(scope.entities):
        return False
    if keys or event_types:
        text = " ".join([row["content"] or "", *key_phrases(row["key"]), *(row["tags"] or ()), *(row["aliases"] or ())])
        if row["key"] not in keys and set(event_types_in(text)).isdisjoint(event_types):
            return False
    if scope.time is not None and row["kind"] in ("event", "episodic"):
        start, end = scope.time.start, scope.time.end
        if not (start <= row["valid_from"] < end or start <= row["observed_at"] < end):
            return False
    return scope.filters.accepts(row)


async def exact_current(
    pool: AsyncConnectionPool, scope: Scope, keys: Sequence[str], event_types: Sequence[str], size: int
) -> list[Candidate]:
    """What `SearchIndex.exact(scope, keys, event_types, size)` answers once every committed version is indexed.

    `scope.entities` must be set (the ids narrow the rows; without them this would read the tenant's every row)."""
    found, _ = await exact_current_marked(pool, scope, keys, event_types, size, marked=False)
    return found


async def exact_current_marked(
    pool: AsyncConnectionPool,
    scope: Scope,
    keys: Sequence[str],
    event_types: Sequence[str],
    size: int,
    *,
    marked: bool = True,
) -> tuple[list[Candidate], int | None]:
    """`exact_current`, and the tenant's newest vocab_log sequence (vocab.NEWEST_SQL) read by the same statement, a
    column of every row: None when no row came back (or not `marked`)."""
    if not scope.entities:
        raise ValueError("exact_current needs the entity ids of the question")
    query, params = _query(scope, keys, event_types, size, f"{NEWEST_SQL}, {_COLUMNS}" if marked else _COLUMNS)
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        rows = await cur.fetchall()
    found = [Candidate(r["version_id"], r["memory_id"]) for r in rows if _selected(r, scope, keys, event_types)]
    return found[:size], rows[0]["vocab_newest"] if marked and rows else None
