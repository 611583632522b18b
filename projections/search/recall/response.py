"""A scored hit as `POST /v1/recall` returns it: the whole fact as PostgreSQL holds it, its score, its explanation."""

from __future__ import annotations

from typing import Any

from projections import shapes
from projections.search.recall.scoring import Scored
from projections.search.recall.trace import iso

__all__ = ["hit"]


def hit(s: Scored) -> shapes.RecallHit:
    row, m = s.row, s.match
    scores = {**m.scores, "prior": round(s.prior, 4), "overlap": round(s.overlap, 4)}
    if s.access:  # the access signal inside the prior (scoring.access_signal), for a fact served before
        scores["access"] = round(s.access, 4)
    if s.factor != 1.0:  # not about the subject the question names (recall.prefer)
        scores["preference"] = s.factor
    match: dict[str, Any] = {"stage": m.stage, "cues": s.cues, "scores": scores}
    if s.preferred:
        match["preferred"] = list(s.preferred)
    if s.duplicates:  # the same thing said again: one hit for the group (recall.groups)
        match["duplicates"] = list(s.duplicates)
    if row["version_id"] != m.version_id:
        match["verified"] = {"candidate": m.version_id, "replaced_by": row["version_id"]}
    else:
        match["verified"] = {"candidate": m.version_id}
    return {
        "memory_id": row["memory_id"],
        "version_id": row["version_id"],
        "event_id": row["event_id"],  # the producer's id of the assertion, beside the tenant-scoped version_id
        "version": row["version"],
        "subject": row["subject"],
        "key": row["key"],
        "scope": row["scope"],
        "value": row["value"],
        "content": row["content"],
        "kind": row["kind"],
        "status": "active",  # a hit holds at the recall's as_of (verified), whatever its chain says of later
        "valid_from": iso(row["valid_from"]),
        "valid_to": iso(row["effective_to"]),
        "observed_at": iso(row["observed_at"]),
        "source": row["source"],
        "score": s.score,
        "match": match,
    }
