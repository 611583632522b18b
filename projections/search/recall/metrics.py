"""Recall's metric (docs/metrics.md): the latency of each stage, fed by the trace's `observe` hook (trace.py).

`observe_stage` is RecallEngine's default observer: every section a recall times (`trace.timed`) is one
observation of `ledger_recall_stage_duration_seconds{stage}`, in the process that runs the engine (the API).
Stage names come from the code (cues, exact, keyword, embed, semantic, fusion, verify_exact, verify_fuzzy,
rerank, cross_encoder), never from the request, so the family has a handful of series.
"""

from __future__ import annotations

from prometheus_client import Histogram

from producers.metrics import STAGE_BUCKETS, histogram

__all__ = ["observe_stage"]

RECALL_STAGE_SECONDS = histogram(
    "recall_stage_duration_seconds",
    "Time of one stage of a recall, less the sections nested in it (`semantic` is the search alone, `embed` apart)",
    ("stage",),
    buckets=STAGE_BUCKETS,
)
_stages: dict[str, Histogram] = {}


def observe_stage(stage: str, ms: float) -> None:
    """The trace's observer (stage, milliseconds): about a microsecond, the stage's series looked up once."""
    child = _stages.get(stage)
    if child is None:
        child = _stages[stage] = RECALL_STAGE_SECONDS.labels(stage)
    child.observe(ms / 1000)
