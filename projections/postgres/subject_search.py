"""Find a tenant's subjects by prefix, a bounded index walk (the audit console's subject finder).

A subject exists for the audit once it has an event in `events` (an erased subject keeps its
tombstone, so it is still found and its timeline shows the erasure). The walk is a "loose index
scan" over `events_subject_c` (`(tenant, subject COLLATE "C")`): a recursive query that asks the
index for the next distinct subject after the last one, so a page of `limit` subjects costs
`limit` index probes however many events each subject has, and PostgreSQL evaluates only as many
steps of the recursion as the outer `LIMIT` fetches.

Prefixes match code point by code point ("C" collation: byte order of UTF-8, which is code
point order), case-sensitively, and the subjects come back in that order.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

__all__ = ["prefix_upper_bound", "search_subjects", "walk_sql"]

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix`, in code point order; None: no bound.

    The last character that can be incremented is (skipping the surrogates, which no stored text holds),
    and what follows it dropped: "ab" -> "ac", "a\\U0010ffff" -> "b", "" -> None.
    """
    chars = list(prefix)
    while chars:
        nxt = ord(chars.pop()) + 1
        if nxt in _SURROGATES:
            nxt = _SURROGATES.stop
        if nxt <= _MAX_CODE_POINT:
            return "".join(chars) + chr(nxt)
    return None


_S = sql.SQL('subject COLLATE "C"')


def walk_sql(bounded: bool, after: bool = False) -> sql.Composed:
    """The walk: subjects >= %(lo)s (> with `after`: the next page's) and < %(hi)s when bounded, of %(tenant)s, at
    most %(limit)s, in order."""
    below = sql.SQL(" AND {s} < %(hi)s").format(s=_S) if bounded else sql.SQL("")
    start = sql.SQL(">" if after else ">=")
    return sql.SQL(
        "WITH RECURSIVE walk(subject) AS ("
        " (SELECT {s} FROM events WHERE tenant = %(tenant)s AND {s} {start} %(lo)s{below} ORDER BY {s} LIMIT 1)"
        " UNION ALL"
        " SELECT (SELECT {s} FROM events WHERE tenant = %(tenant)s AND {s} > walk.subject{below} ORDER BY {s} LIMIT 1)"
        " FROM walk WHERE walk.subject IS NOT NULL"
        ") SELECT subject FROM walk WHERE subject IS NOT NULL LIMIT %(limit)s"
    ).format(s=_S, below=below, start=start)


_WALKS = {(bounded, after): walk_sql(bounded, after) for bounded in (False, True) for after in (False, True)}


async def search_subjects(
    conn: psycopg.AsyncConnection, tenant: str, prefix: str, limit: int, after: str | None = None
) -> tuple[list[str], bool]:
    """Up to `limit` of the tenant's subjects starting with `prefix` (code point order), after the subject `after`
    (a page's last) when given, and whether there are more."""
    hi = prefix_upper_bound(prefix)
    past = after is not None and after >= prefix  # code point order, as "C" sorts UTF-8; one before the prefix: none
    query = _WALKS[hi is not None, past]
    cur = await conn.execute(query, {"tenant": tenant, "lo": after if past else prefix, "hi": hi, "limit": limit + 1})
    subjects = [row[0] for row in await cur.fetchall()]
    return subjects[:limit], len(subjects) > limit
