"""Read the erasure records the recorder writes into the key store's schema (`Settings.keys_schema`).

A record names its subject only by its tenant's keyed digest (HMAC-SHA256 under the tenant's digest key in the key
store, `producers.keys.store.SubjectDigests`): whoever knows the subject id finds its erasure by asking with it (the
digest is computed here), and nobody can confirm a guessed id from a record alone. Records written before keyed
digests hold the unkeyed one, which a lookup still matches. Pages are ordered by application time, newest first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from producers.contract import rfc3339
from producers.keys.kek import KeyEncryption
from producers.keys.store import open_digest_key, subject_digests
from projections import shapes

__all__ = ["erasure_record", "list_erasures"]

_COLUMNS = (
    'tenant, erasure_id, subject_digest, requested_at, applied_at, topic, "partition", "offset", first_offset, '
    "records, sealed_records, clear_records, key_ids, key_fingerprints, purged, search_documents, search_purged_at"
)


def _shape(row: dict[str, Any]) -> shapes.ErasureRecord:
    """The API's body of one record: times in RFC 3339, the ledger range and the stores grouped."""
    purged = dict(row["purged"] or {})
    purged["elasticsearch"] = {
        "documents": row["search_documents"],
        "purged_at": rfc3339(row["search_purged_at"]) if row["search_purged_at"] else None,
    }
    return {
        "erasure_id": row["erasure_id"],
        "tenant": row["tenant"],
        "subject_digest": row["subject_digest"],
        "requested_at": rfc3339(row["requested_at"]),
        "applied_at": rfc3339(row["applied_at"]),
        "ledger": {
            "topic": row["topic"],
            "partition": row["partition"],
            "first_offset": row["first_offset"],
            "erasure_offset": row["offset"],
        },
        "records": {"total": row["records"], "sealed": row["sealed_records"], "clear": row["clear_records"]},
        "keys": [{"key_id": k, "fingerprint": f} for k, f in zip(row["key_ids"], row["key_fingerprints"], strict=True)],
        "purged": purged,
        "complete": row["search_purged_at"] is not None,
    }


async def _exists(conn: psycopg.AsyncConnection, schema: str, table: str = "erasures") -> bool:
    cur = await conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, table).as_string(conn),))
    row = await cur.fetchone()
    return row is not None and row[0] is not None


async def _digests(
    conn: psycopg.AsyncConnection, schema: str, tenant: str, subject: str, keks: KeyEncryption | None
) -> list[str]:
    """Every digest the tenant's records of `subject` may hold (KekError: its digest key needs a KEK not given)."""
    key = None
    if await _exists(conn, schema, "digest_keys"):
        cur = await conn.execute(
            sql.SQL("SELECT kek_id, secret FROM {} WHERE tenant = %s").format(sql.Identifier(schema, "digest_keys")),
            (tenant,),
        )
        row = await cur.fetchone()
        key = open_digest_key(tenant, row[0], row[1], keks) if row is not None else None
    return subject_digests(key, tenant, subject)


async def list_erasures(
    conn: psycopg.AsyncConnection,
    schema: str,
    tenant: str,
    *,
    subject: str | None = None,
    keks: KeyEncryption | None = None,
    limit: int = 50,
    past: tuple[datetime, str] | None = None,
) -> tuple[list[shapes.ErasureRecord], bool]:
    """The tenant's erasure records, newest first (of one subject when `subject` is given), at most `limit` of them
    and whether there are more; `past`: only those after that (applied_at, erasure_id) in this order (where the
    page before ended).

    `keks`: the KEKs that open the tenant's digest key when one wraps it (KekError if they do not).
    """
    if not await _exists(conn, schema):
        return [], False
    where = sql.SQL("tenant = %(t)s")
    params: dict[str, Any] = {"t": tenant, "n": limit + 1}
    if subject is not None:
        where = sql.SQL("tenant = %(t)s AND subject_digest = ANY(%(d)s)")
        params["d"] = await _digests(conn, schema, tenant, subject, keks)
    if past is not None:  # newest first, ties by id: the next page starts strictly past the last one shown
        where += sql.SQL(" AND (applied_at < %(pt)s OR (applied_at = %(pt)s AND erasure_id > %(pid)s))")
        params |= {"pt": past[0], "pid": past[1]}
    query = sql.SQL("SELECT {c} FROM {t} WHERE {w} ORDER BY applied_at DESC, erasure_id LIMIT %(n)s").format(
        c=sql.SQL(_COLUMNS), t=sql.Identifier(schema, "erasures"), w=where
    )
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        rows = await cur.fetchall()
    return [_shape(r) for r in rows[:limit]], len(rows) > limit


async def erasure_record(
    conn: psycopg.AsyncConnection, schema: str, tenant: str, erasure_id: str
) -> shapes.ErasureRecord | None:
    """One erasure record by its erasure event's id, None if the tenant has none of that id (yet)."""
    if not await _exists(conn, schema):
        return None
    query = sql.SQL("SELECT {c} FROM {t} WHERE tenant = %s AND erasure_id = %s").format(
        c=sql.SQL(_COLUMNS), t=sql.Identifier(schema, "erasures")
    )
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, (tenant, erasure_id))
        row = await cur.fetchone()
    return None if row is None else _shape(row)
