"""The per-request trace of a recall: `with trace.timed("exact"): ...` is the one way a step is timed.

Each section reports its own time in milliseconds under `stages_ms[name]`, not counting sections nested in it
(the semantic stage's `embed` is reported on its own, `semantic` is the search alone). An `observe(stage, ms)`
callback, if given, sees every section as it ends (the hook for metrics).

Sections may run side by side (a tier's stages are asked at once): which section is open is kept per asyncio task
(a context variable), and a section nests only in one its own task opened, so time spent in tasks that run beside
a section is never taken off its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar, Token
from datetime import datetime
from time import perf_counter
from types import TracebackType
from typing import Any

from producers.contract import rfc3339
from projections import shapes

__all__ = ["Observer", "Trace"]

Observer = Callable[[str, float], None]  # (stage, milliseconds)
EXPLAIN_LIMIT = 20  # candidates listed per stage when a request asks to explain (the rest are counted only)


def iso(t: datetime | None) -> str | None:
    """A time as every response spells it (producers.contract.rfc3339: UTC, microseconds, `Z`)."""
    return None if t is None else rfc3339(t)


def _task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: a section timed in plain code
        return None


class _Section:
    __slots__ = ("trace", "name", "t0", "nested", "outer", "token", "task")

    def __init__(self, trace: Trace, name: str) -> None:
        self.trace, self.name, self.nested = trace, name, 0.0

    def __enter__(self) -> _Section:
        outer, self.task = _OPEN.get(), _task()
        # a task started inside a section sees it open, but runs beside it: its sections nest in their own task only
        self.outer = outer if outer is not None and outer.trace is self.trace and outer.task is self.task else None
        self.token: Token[_Section | None] = _OPEN.set(self)
        self.t0 = perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        elapsed = perf_counter() - self.t0
        trace, outer = self.trace, self.outer
        _OPEN.reset(self.token)
        if outer is not None:
            outer.nested += elapsed
        if exc_type is None:
            ms = round((elapsed - self.nested) * 1000, 3)
            trace.stages[self.name] = ms
            if trace.observe is not None:
                trace.observe(self.name, ms)


# the section open in this task (asyncio copies the context into each task it starts)
_OPEN: ContextVar[_Section | None] = ContextVar("recall_trace_open", default=None)


class Trace:
    """What `POST /v1/recall` returns as `trace`: per-stage times, candidate counts, whether it embedded."""

    __slots__ = (
        "mode",
        "stages",
        "candidates",
        "listed",
        "embedding_computed",
        "embedding_models",
        "rerank",
        "observe",
        "_t0",
    )

    def __init__(self, mode: str, observe: Observer | None = None) -> None:
        self._t0 = perf_counter()
        self.mode = mode
        self.stages: dict[str, float] = {}
        self.candidates: dict[str, int] = {}  # "<tier>_candidates" -> how many its stages found
        self.listed: dict[str, list[dict[str, Any]]] | None = None  # explain: stage -> its candidates, best first
        self.embedding_computed = False
        self.embedding_models: list[str] = []  # the models the semantic stage embedded the query with
        self.rerank: dict[str, Any] | None = None  # the rerank stage's account (recall.rerank), if it ran
        self.observe = observe

    def list_candidates(self, stage: str, found: list[Any]) -> None:
        """Keep what `stage` found (explain only): version and memory ids and the stage's own score, best first."""
        if self.listed is None:
            self.listed = {}
        self.listed[stage] = [
            {"rank": i + 1, "version_id": c.version_id, "memory_id": c.memory_id, "score": c.score}
            for i, c in enumerate(found[:EXPLAIN_LIMIT])
        ]

    def timed(self, stage: str) -> _Section:
        """A context manager: the time spent inside it (less nested sections) is `stages_ms[stage]`."""
        return _Section(self, stage)

    def as_dict(self, as_of: datetime) -> shapes.RecallTrace:
        out: dict[str, Any] = {"stages_ms": self.stages, "embedding_computed": self.embedding_computed}
        if self.embedding_models:
            out["embedding_models"] = self.embedding_models
        out["mode"] = self.mode
        out.update(self.candidates)
        out["total_ms"] = round((perf_counter() - self._t0) * 1000, 3)
        out["as_of"] = iso(as_of)
        if self.listed is not None:
            out["candidates"] = self.listed
        if self.rerank is not None:
            out["rerank"] = self.rerank
        return out
