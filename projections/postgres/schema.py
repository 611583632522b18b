"""Create the projection's tables in a schema, idempotently (`schema.sql`), and fill once what a newer column needs.

A schema of an older layout (events keyed by event_id alone, no fingerprints,
no erased_events) is refused with `SchemaOutdated` instead of half-working: `ledger rebuild`
replays the ledger into a fresh schema of the current layout and switches over.
"""

from __future__ import annotations

from importlib.resources import files

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from projections.search.cues import about_entries

__all__ = [
    "LAYOUT",
    "SchemaOutdated",
    "continue_revisions",
    "copy_erasure_salt",
    "copy_idempotency",
    "copy_vectors",
    "create_schema",
    "drop_schema",
    "schema_sql",
]

LAYOUT = "2"


class SchemaOutdated(RuntimeError):
    """The schema holds a projection of an older layout: run `ledger rebuild`."""


def schema_sql() -> str:
    return files("projections.postgres").joinpath("schema.sql").read_text()


def _outdated(conn: psycopg.Connection, schema: str) -> bool:
    """The schema has an events table but not the current layout's columns (meta, fingerprint)."""
    has = conn.execute(
        "SELECT count(*) FILTER (WHERE table_name = 'events'), "
        "count(*) FILTER (WHERE table_name = 'events' AND column_name = 'fingerprint') "
        "FROM information_schema.columns WHERE table_schema = %s",
        (schema,),
    ).fetchone()
    assert has is not None
    return has[0] > 0 and has[1] == 0


def create_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create `schema` and its tables unless they exist; safe to run any number of times, concurrently."""
    with conn.transaction():
        # two processes starting together must not race on CREATE ... IF NOT EXISTS
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"schema:{schema}",))
        if _outdated(conn, schema):
            raise SchemaOutdated(
                f"schema {schema!r} holds a projection of an older layout (before layout {LAYOUT}); "
                "run `ledger rebuild` to replay the ledger into the current one"
            )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(schema_sql())
        _fill_about(conn)


_FILL_ROWS = 5000  # rows per statement of the one-time fill


def _fill_about(conn: psycopg.Connection) -> None:
    """Once per schema, in its creator's transaction: the `about` of rows written before the column (schema.sql),
    computed as the recorder computes it (in Python: SQL has no casefold)."""
    if conn.execute("SELECT 1 FROM meta WHERE name = 'version_about'").fetchone():
        return
    last = ""
    while rows := conn.execute(
        "SELECT version_id, subject, entities, key FROM fact_versions WHERE about IS NULL AND version_id > %s "
        "ORDER BY version_id LIMIT %s",
        (last, _FILL_ROWS),
    ).fetchall():
        conn.execute(
            "UPDATE fact_versions f SET about = ARRAY(SELECT jsonb_array_elements_text(x.value)) "
            "FROM jsonb_each(%s) AS x WHERE f.version_id = x.key",
            (Jsonb({vid: about_entries(subject, entities, key) for vid, subject, entities, key in rows}),),
        )
        last = rows[-1][0]
    conn.execute("INSERT INTO meta (name, value) VALUES ('version_about', 'filled at ' || now())")


def copy_erasure_salt(conn: psycopg.Connection, source: str, target: str) -> bool:
    """Give `target` the erasure salt of `source` (a rebuild keeps erased_events row for row).

    Only before `target` has erased anything; False if `source` has no salt (older layout, or none).
    """
    with conn.transaction():
        if not _has(conn, source, "meta"):
            return False
        row = conn.execute(
            sql.SQL("SELECT value FROM {} WHERE name = 'erasure_salt'").format(sql.Identifier(source, "meta"))
        ).fetchone()
        if row is None:
            return False
        erased = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(target, "erased_events")))
        if erased.fetchone()[0]:  # type: ignore[index]
            raise RuntimeError(f"{target} already erased events under its own salt")
        conn.execute(
            sql.SQL("UPDATE {} SET value = %s WHERE name = 'erasure_salt'").format(sql.Identifier(target, "meta")),
            (row[0],),
        )
        return True


def drop_schema(conn: psycopg.Connection, schema: str) -> None:
    """Drop a schema and everything in it (tests and rebuild clean-up)."""
    with conn.transaction():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


REV_JUMP = 2**40  # a rebuilt schema's document revisions start this far past the live one's


def _has(conn: psycopg.Connection, schema: str, name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, name).as_string(conn),)).fetchone()
    return row is not None and row[0] is not None


def continue_revisions(conn: psycopg.Connection, source: str, target: str) -> bool:
    """Start `target`'s document revisions past `source`'s, before anything is replayed into it.

    The search index keeps a document's highest revision (external versions): the rebuilt schema's documents must
    win over the live schema's, including those the live indexers write while the rebuild replays. False if
    `source` has no revisions (an older layout, or none)."""
    with conn.transaction():
        if not _has(conn, source, "doc_rev"):
            return False
        last = conn.execute(sql.SQL("SELECT last_value FROM {}").format(sql.Identifier(source, "doc_rev"))).fetchone()
        conn.execute("SELECT setval(%s, %s)", (sql.Identifier(target, "doc_rev").as_string(conn), last[0] + REV_JUMP))  # type: ignore[index]
    return True


def copy_idempotency(conn: psycopg.Connection, source: str, target: str) -> int:
    """Copy `source`'s idempotency keys that `target` lacks: the doors' claims (projections.postgres.idempotency),
    so an id published through a door and not applied yet keeps its one content, and the erased ids (when both
    schemas have the same erasure salt), so an id whose sealed events a replay could no longer open (their keys
    were shredded) stays erased; how many rows. In the caller's transaction (`ledger rebuild`: under the switch's
    lock, after the replay, whose erasures already dropped the claims of erased ids on both sides)."""
    copied = _copy_rows(conn, source, target, "event_claims", _COPY_CLAIMS)
    if _has(conn, source, "meta"):  # where the two erasure salts are
        fp = "fp_hash" if _has_column(conn, source, "erased_events", "fp_hash") else "NULL::bytea"
        salts = {"sm": sql.Identifier(source, "meta"), "tm": sql.Identifier(target, "meta"), "fp": sql.SQL(fp)}
        copied += _copy_rows(conn, source, target, "erased_events", _COPY_ERASED, **salts)
    return copied


_COPY_CLAIMS = (
    "INSERT INTO {t} (tenant, event_id, fingerprint, claimed_at) "
    "SELECT tenant, event_id, fingerprint, claimed_at FROM {s} ON CONFLICT DO NOTHING"
)
_COPY_ERASED = (
    "INSERT INTO {t} (tenant, id_hash, fp_hash) SELECT tenant, id_hash, {fp} FROM {s} "
    "WHERE (SELECT value FROM {sm} WHERE name = 'erasure_salt') "
    "= (SELECT value FROM {tm} WHERE name = 'erasure_salt') ON CONFLICT DO NOTHING"
)
_COPY_VECTORS = (
    "INSERT INTO {t} (version_id, field, model, vec) SELECT v.version_id, v.field, v.model, v.vec FROM {s} v "
    "JOIN {f} f ON f.version_id = v.version_id "
    "WHERE NOT EXISTS (SELECT 1 FROM {t} w WHERE w.version_id = v.version_id AND w.field = v.field) "
    "ON CONFLICT DO NOTHING"
)


def _copy_rows(
    conn: psycopg.Connection, source: str, target: str, table: str, insert: str, **names: sql.Composable
) -> int:
    """Run `insert` (an INSERT INTO {t} ... FROM {s}) with {t} the `target` schema's `table` and {s} the `source`
    schema's; how many rows it wrote (0 when `source` has no such table: an older layout)."""
    if not _has(conn, source, table):
        return 0
    statement = sql.SQL(insert).format(t=sql.Identifier(target, table), s=sql.Identifier(source, table), **names)
    return conn.execute(statement).rowcount


def _has_column(conn: psycopg.Connection, schema: str, table: str, column: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s AND column_name = %s",
        (schema, table, column),
    ).fetchone()
    return row is not None


def copy_vectors(conn: psycopg.Connection, source: str, target: str) -> int:
    """Copy `source`'s stored vectors of the versions `target` has and lacks (a version's text comes from its event,
    so its vectors are the same), so a rebuild embeds nothing again; how many. In the caller's transaction."""
    fact_versions = sql.Identifier(target, "fact_versions")
    return _copy_rows(conn, source, target, "version_vectors", _COPY_VECTORS, f=fact_versions)
