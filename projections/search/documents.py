"""Fact-version rows (PostgreSQL) -> search documents, and the SQL that reads those rows.

A document is a pure function of the *current* row of its version, so writing it twice gives the
same document: redelivery and crash-redo are harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from projections.postgres.queries import EFFECTIVE_TO, OVERRIDE, RETRACTION_ENDED
from projections.postgres.recorder import VERSION_COLUMNS
from projections.search.cues import (
    canonical,
    embedding_text,
    event_types_in,
    key_phrases,
    normalize_entity,
    subject_ids,
)
from projections.search.stemming import STEM_FIELD, stem_text

__all__ = ["ENDED_BY_COLUMNS", "ROW_COLUMNS", "build_doc", "embedding_text_for", "rows_sql", "status_fields"]

# every column of `f` (the recorder's one list), its end (`effective_to`: the document's valid_to) and whether
# it is an override
ROW_COLUMNS = sql.SQL(", ").join(
    [
        *(sql.Identifier("f", c) for c in VERSION_COLUMNS),
        sql.SQL(EFFECTIVE_TO + " AS effective_to"),
        sql.SQL(OVERRIDE + " AS override"),
    ]
)


# when and where the ledger logged what ended a version: its successor (`s`), and the retraction (`rt`) that ended
# it, if that one ended it whatever else the ledger knew (by its id, or by its time where no override's window
# holds that time); a recall as known at a time leaves out the versions whose end it knew by then
# (index._in_force), since they can no longer speak for their fact
ENDED_BY_COLUMNS = sql.SQL(
    's.observed_at AS successor_observed_at, s."partition" AS successor_partition, s."offset" AS successor_offset, '
    'rt.observed_at AS retraction_observed_at, rt."partition" AS retraction_partition, '
    'rt."offset" AS retraction_offset'
)
_ENDED_BY = (
    "LEFT JOIN fact_versions s ON s.version_id = f.superseded_by "
    'LEFT JOIN LATERAL (SELECT r.observed_at, r."partition", r."offset" FROM events r WHERE '
    + RETRACTION_ENDED
    + ' ORDER BY r."partition", r."offset" LIMIT 1) rt ON true'
)


def rows_sql(where: sql.Composable, extra: sql.Composable | None = None) -> sql.Composed:
    """SELECT the ROW_COLUMNS (and `extra` columns before them) of the fact_versions rows `f` matching `where`,
    with what ended them: ENDED_BY_COLUMNS."""
    cols = ROW_COLUMNS if extra is None else sql.SQL("{}{}").format(extra, sql.SQL(", ") + ROW_COLUMNS)
    return sql.SQL("SELECT {cols}, {ended} FROM fact_versions f " + _ENDED_BY + " WHERE {where}").format(
        cols=cols, ended=ENDED_BY_COLUMNS, where=where
    )


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _source_type(source: Any) -> str | None:
    return source.get("type") if isinstance(source, dict) else None


def status_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The fields that change after a version is written (supersession, retraction, late history); `superseded_at`
    and the successor's `successor_*` (rows_sql) only where a successor is known, `retracted_at` and the
    retraction's `retraction_*` only where a retraction ended it (rows_sql's rule)."""
    out = {
        "status": row["status"],
        "superseded_by": row["superseded_by"],
        "valid_to": _iso(row["effective_to"]),
        "version": row["version"],
    }
    if row["superseded_by"] is not None and row.get("successor_observed_at") is not None:
        out |= {
            "superseded_at": _iso(row["superseded_at"]),
            "successor_observed_at": _iso(row["successor_observed_at"]),
            "successor_partition": row["successor_partition"],
            "successor_offset": row["successor_offset"],
        }
    if row["status"] == "retracted" and row.get("retraction_observed_at") is not None:
        out |= {
            "retracted_at": _iso(row["valid_to"]),
            "retraction_observed_at": _iso(row["retraction_observed_at"]),
            "retraction_partition": row["retraction_partition"],
            "retraction_offset": row["retraction_offset"],
        }
    return out


def embedding_text_for(row: dict[str, Any]) -> str:
    return embedding_text(row["content"], row["key"], row["aliases"] or ())


def vectors_doc(vectors: Sequence[tuple[str, str, list[float]]]) -> dict[str, Any]:
    """A document's vectors, (field, model, vector) each, and `embed_model`: the models that made them
    (projections.languages; a search asks only for vectors of the model it embedded the question with)."""
    return {**{f: v for f, _, v in vectors}, "embed_model": [m for _, m, _ in vectors]}


def build_doc(
    row: dict[str, Any], vector: list[float] | None, *, vectors: Sequence[tuple[str, str, list[float]]] = ()
) -> dict[str, Any]:
    """The whole document of one version; `vector` None (and no `vectors`) leaves the embedding out (partial
    update). `vectors`: (field, model, vector) per model (Embedders.vectors), recorded with their models."""
    aliases = row["aliases"] or []
    tags = row["tags"] or []
    key = row["key"]
    doc = {
        "version_id": row["version_id"],
        "memory_id": row["memory_id"],
        "tenant": row["tenant"],
        "subject": row["subject"],
        "subject_ids": subject_ids(row["subject"]),
        "key": key,
        "key_text": " ".join(key_phrases(key)[:1]) or None,
        "scope": row["scope"] or "",
        "kind": row["kind"],
        "source_type": _source_type(row["source"]),
        "event_type": event_types_in(" ".join([row["content"] or "", *key_phrases(key), *tags, *aliases])),
        "entities": sorted({normalize_entity(e) for e in row["entities"] or []}),
        "aliases": sorted({canonical(a) for a in aliases if canonical(a)}),
        "aliases_text": " ; ".join(aliases) or None,
        "tags": list(tags),
        "content": row["content"],
        STEM_FIELD: stem_text(row["content"]),  # English stems: the server has no stemmer (mapping)
        "valid_from": _iso(row["valid_from"]),
        "observed_at": _iso(row["observed_at"]),
        # its end as its own event asserted it (a recall as known then leaves out a version already ended by it)
        "asserted_valid_to": _iso(row["asserted_valid_to"]),
        "partition": row["partition"],  # where it was logged: a replay reads only what was below its positions
        "offset": row["offset"],
        "confidence": row["confidence"],
        "importance": row["importance"],
        **status_fields(row),
    }
    if row.get("episode_group"):  # a near-duplicate episode's group (projections.search.duplicates)
        doc["episode_group"] = row["episode_group"]
    if vector is not None:
        doc["embedding"] = vector
    if vectors:
        doc.update(vectors_doc(vectors))
    return doc
