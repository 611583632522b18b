"""A version's stored vectors (`version_vectors`): how they are packed, read with the row, and stored.

The embedder computes a version's vectors once and keeps them in PostgreSQL beside the version (an erasure
deletes them with it); every document write reads them with the row in one statement, so a document holds the
vectors of its own version only, and a reindex copies them instead of embedding again. Storing vectors draws
the version a new document revision (`rev`), so the document written next carries them whichever indexer
writes last.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from producers.settings import Settings
from projections.languages import vector_plan
from projections.postgres.counts import EMBED
from projections.search.documents import embedding_text_for

__all__ = [
    "VECTOR_COLUMNS",
    "Vectors",
    "attached",
    "lacking",
    "pack",
    "queue_for_vectors",
    "store_vectors",
    "unpack",
]

Vectors = list[tuple[str, str, list[float]]]  # (field, model, vector) of one version

# the version's stored vectors as three arrays in field order, read in the same statement (snapshot) as its row
VECTOR_COLUMNS = sql.SQL(
    "ARRAY(SELECT v.field FROM version_vectors v WHERE v.version_id = f.version_id ORDER BY v.field) AS vec_fields, "
    "ARRAY(SELECT v.model FROM version_vectors v WHERE v.version_id = f.version_id ORDER BY v.field) AS vec_models, "
    "ARRAY(SELECT v.vec FROM version_vectors v WHERE v.version_id = f.version_id ORDER BY v.field) AS vec_data"
)


def pack(vector: Sequence[float]) -> bytes:
    """float32, little-endian: 1.5 KB for 384 dimensions (a float8[] would take twice that and parse slower)."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(data: bytes) -> list[float]:
    return np.frombuffer(data, dtype="<f4").tolist()


def attached(settings: Settings, row: dict[str, Any]) -> Vectors:
    """The stored vectors of `row` that the configured models would make for its text, in plan order; a vector of
    another model (a switched model, before its reindex) is left out."""
    stored = {(f, m): d for f, m, d in zip(row["vec_fields"], row["vec_models"], row["vec_data"], strict=True)}
    return [
        (f, m, unpack(stored[(f, m)])) for f, m in vector_plan(settings, embedding_text_for(row)) if (f, m) in stored
    ]


def lacking(settings: Settings, row: dict[str, Any]) -> bool:
    """Whether a configured model's vector of the version is not stored yet (it goes to the embed queue)."""
    stored = set(zip(row["vec_fields"], row["vec_models"], strict=True))
    return any(fm not in stored for fm in vector_plan(settings, embedding_text_for(row)))


def store_vectors(cur: psycopg.Cursor, made: Iterable[tuple[str, Vectors]]) -> list[str]:
    """Store each version's vectors (replacing a field's vector of another model) and draw its next document
    revision; the version ids stored. The caller holds the versions' rows locked (FOR NO KEY UPDATE), so a
    concurrent erasure waits for this transaction and then deletes the vectors with the version."""
    ids, fields, models, vecs = [], [], [], []
    for vid, vectors in made:
        for f, m, v in vectors:
            ids.append(vid)
            fields.append(f)
            models.append(m)
            vecs.append(pack(v))
    if not ids:
        return []
    cur.execute(
        "INSERT INTO version_vectors (version_id, field, model, vec) "
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bytea[]) "
        "ON CONFLICT (version_id, field) DO UPDATE SET model = excluded.model, vec = excluded.vec",
        (ids, fields, models, vecs),
    )
    stored = sorted(set(ids))
    cur.execute("UPDATE fact_versions SET rev = nextval('doc_rev') WHERE version_id = ANY(%s)", (stored,))
    return stored


def queue_for_vectors(cur: psycopg.Cursor | psycopg.Connection, items: Sequence[tuple[str, str, Any]]) -> Counter:
    """Queue (version id, tenant, since) for the embedders, in the order given (their ids, which the embedders
    take oldest first, follow it); a version queued already stays as it is. The `embed_queue` counter deltas of
    what was new. `since` None: now. Under the batch's finishing lock (projections.search.claims.finish), like
    every statement that moves a shared counter."""
    if not items:
        return Counter()
    queued = cur.execute(  # at its version's place in the log (api.consistency waits for a write's rows by it)
        'INSERT INTO embed_queue (version_id, tenant, since, "partition", "offset") '
        'SELECT v, t, coalesce(s, now()), f."partition", f."offset" '
        "FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) WITH ORDINALITY AS x(v, t, s, n) "
        "LEFT JOIN fact_versions f ON f.version_id = x.v ORDER BY n "
        "ON CONFLICT (version_id) DO NOTHING RETURNING tenant",
        ([v for v, _, _ in items], [t for _, t, _ in items], [c for _, _, c in items]),
    ).fetchall()
    return Counter((tenant, EMBED) for (tenant,) in queued)
