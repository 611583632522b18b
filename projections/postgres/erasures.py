"""Read the erasure records (issue 13) the recorder writes into the key store's schema (`Settings.keys_schema`).

A record names its subject by digest only (`contract.subject_digest_for`): whoever knows the subject id can find and
check its erasure, the record itself holds no personal data. Pages are ordered by application time, newest first.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from producers.contract import rfc3339, subject_digest_for

__all__ = ["erasure_record", "list_erasures"]

_COLUMNS = (
    'tenant, erasure_id, subject_digest, requested_at, applied_at, topic, "partition", "offset", first_offset, '
    "records, sealed_records, clear_records, key_ids, key_fingerprints, purged, search_documents, search_purged_at"
)


def _shape(row: dict[str, Any]) -> dict[str, Any]:
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


async def _exists(conn: psycopg.AsyncConnection, schema: str) -> bool:
    cur = await conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, "erasures").as_string(conn),))
    row = await cur.fetchone()
    return row is not None and row[0] is not None


async def list_erasures(
    conn: psycopg.AsyncConnection, schema: str, tenant: str, *, subject: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """The tenant's erasure records, newest first (of one subject when `subject` is given)."""
    if not await _exists(conn, schema):
        return []
    where = sql.SQL("tenant = %(t)s")
    params: dict[str, Any] = {"t": tenant, "n": limit}
    if subject is not None:
        where = sql.SQL("tenant = %(t)s AND subject_digest = %(d)s")
        params["d"] = subject_digest_for(tenant, subject)
    query = sql.SQL("SELECT {c} FROM {t} WHERE {w} ORDER BY applied_at DESC, erasure_id LIMIT %(n)s").format(
        c=sql.SQL(_COLUMNS), t=sql.Identifier(schema, "erasures"), w=where
    )
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return [_shape(r) for r in await cur.fetchall()]


async def erasure_record(conn: psycopg.AsyncConnection, schema: str, tenant: str, erasure_id: str) -> dict | None:
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
