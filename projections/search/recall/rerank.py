"""The rerank stage: an offline cross-encoder reorders the first fuzzy hits of the pool, never above an exact one.

The first `rerank_candidates` fuzzy hits are scored head first, one pair a call by default (the int8 model
quantizes a batch together, so a pair's score must not depend on its neighbours), by `rerank_threads` threads at
once, each taking the next pair, under the `rerank_budget_ms` deadline: the unbroken head scored by then trades
places and scores, the rest keeps its fused place, so the answer is never late. The model is English: other
questions are not reranked, and non-English hits keep their places. A model still loading is skipped, never
waited for. docs/INTERNALS.md, "Rerank".
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cache, partial
from time import perf_counter
from typing import Any

from producers.settings import Settings
from projections.languages import text_slot
from projections.reranker import CrossEncoder, load_cross_encoder
from projections.search.recall.model import RecallQuery
from projections.search.recall.scoring import BAND, Scored
from projections.search.recall.trace import Trace

__all__ = ["Batches", "Reranker", "ScoredBatch", "head_scored", "reorder", "rerank_key", "score_within"]

FUZZY_STAGES = frozenset({"keyword", "semantic", "hybrid"})


@cache
def rerank_executor(threads: int) -> ThreadPoolExecutor:
    """The cross-encoder's own threads, at the normal priority (not the embedders' lowered one, recall.workers): its
    work is bounded by the budget, and at a lowered priority on a busy host each pair takes longer, so the budget
    buys fewer pairs. onnxruntime releases the GIL, so each thread scores on a core of its own; concurrent reranks
    queue, and the wait counts against their budgets."""
    return ThreadPoolExecutor(threads, thread_name_prefix="recall-rerank")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def rerank_key(ce: float, strength: float, weight: float) -> float:
    """The order of a scored candidate (higher first): the cross-encoder's probability blended with its strength."""
    return weight * _sigmoid(ce) + (1.0 - weight) * strength


def reorder(
    strengths: Sequence[float], ce: Sequence[float], weight: float, factors: Sequence[float] | None = None
) -> list[int]:
    """The new order of the first len(ce) candidates (indices into them), best first; ties keep the order before.

    `strengths`: each candidate's strength before, in [0, 1], in their order before; `ce`: the cross-encoder
    scores of the first len(ce) of them (a budget may have stopped it early: the rest are not reordered);
    `factors`: each one's preference factor (recall.prefer: an episode about none of the subjects the question
    names), which multiplies its key, so the preference holds through the rerank (None: all 1).
    """
    n = len(ce)
    f = factors or [1.0] * n
    return sorted(range(n), key=lambda i: (-f[i] * rerank_key(ce[i], strengths[i], weight), i))


@dataclass(frozen=True)
class ScoredBatch:
    """What `score_within` did: the scores of the first candidates, and why it stopped short (None: it did not)."""

    scores: list[float]
    stopped: str | None


class Batches:
    """One rerank's texts cut in batches, handed head first to whichever thread asks next (thread-safe)."""

    def __init__(self, total: int, batch: int) -> None:
        self.total, self.batch = total, batch
        self._starts = iter(range(0, total, batch))
        self._lock = threading.Lock()

    def next(self) -> range | None:
        with self._lock:
            i = next(self._starts, None)
        return None if i is None else range(i, min(i + self.batch, self.total))


def head_scored(scores: dict[int, float]) -> list[float]:
    """The scores of the first texts with none missing between them (threads finish their batches in any order)."""
    out: list[float] = []
    while len(out) in scores:
        out.append(scores[len(out)])
    return out


def score_within(
    score: Callable[[list[str]], list[float]],
    texts: Sequence[str],
    batch: int,
    budget_ms: float,
    clock: Callable[[], float] = perf_counter,
    start: float | None = None,
    cancelled: threading.Event | None = None,
    out: dict[int, float] | None = None,
    batches: Batches | None = None,
) -> ScoredBatch:
    """Score `texts` in batches while the budget lasts: a batch starts only if its projected time fits.

    The projection is this thread's mean time per text so far (not the slowest: one preempted batch on a busy host
    would stop the stage for good); its first batch always runs unless the budget was spent before it could start:
    `start` (the clock when the stage began, default now) counts the wait for the thread. The loop may so overrun
    the budget by about one batch; the caller stops waiting at the deadline and sets `cancelled`, and no batch
    starts after that. Runs in a worker thread (onnxruntime releases the GIL); threads sharing `batches` and `out`
    (text index -> score, a whole batch at a time) score one list together, so a caller that stopped waiting reads
    the batches done (a thread returns the head scored when it stopped; the others may still be finishing theirs).
    """
    out = {} if out is None else out
    batches = batches or Batches(len(texts), batch)
    t0 = clock() if start is None else start
    waited, mine = 0.0, 0  # the time it queued for the thread (spent, but no measure of a pair); texts it scored
    while True:
        spent = (clock() - t0) * 1000
        if (cancelled is not None and cancelled.is_set()) or spent >= budget_ms:
            return ScoredBatch(head_scored(out), "budget")
        if mine and spent + (spent - waited) / mine * batch > budget_ms:
            return ScoredBatch(head_scored(out), "budget")
        part = batches.next()
        if part is None:
            return ScoredBatch(head_scored(out), None)
        if not mine:
            waited = spent
        out.update(zip(part, score([texts[i] for i in part]), strict=True))
        mine += len(part)


class Reranker:
    """The rerank stage of one RecallEngine: the cross-encoder (loaded once, in the background) and its bounds."""

    def __init__(self, settings: Settings, model: CrossEncoder | None = None) -> None:
        self.settings = settings
        self.enabled = settings.rerank_enabled
        self.candidates, self.budget_ms = settings.rerank_candidates, settings.rerank_budget_ms
        self.batch, self.weight = settings.rerank_batch_size, settings.rerank_weight
        self.executor = rerank_executor(settings.rerank_threads)
        self._model = model
        self._loading: asyncio.Future[CrossEncoder] | None = None

    def wanted(self, q: RecallQuery) -> bool:
        """The request's flag wins; without one, the setting. Never for mode `exact` (it has no fuzzy tier)."""
        return q.mode != "exact" and (q.rerank if q.rerank is not None else self.enabled)

    async def model(self) -> CrossEncoder:
        """Load the model (once, in the embedding workers); the API's warm-up awaits this."""
        if self._model is None:
            if self._loading is None:
                loop = asyncio.get_running_loop()
                self._loading = loop.run_in_executor(self.executor, load_cross_encoder, self.settings)
            self._model = await self._loading
        return self._model

    async def rerank(self, q: RecallQuery, hits: list[Scored], trace: Trace) -> list[Scored]:
        """`hits` (sorted, exact first) with their first fuzzy hits reordered by the cross-encoder."""
        start = next((i for i, h in enumerate(hits) if h.match.stage in FUZZY_STAGES and h.score < BAND), None)
        info: dict[str, Any] = {"computed": False, "candidates": 0, "scored": 0, "budget_ms": self.budget_ms}
        trace.rerank = info
        if start is None:
            return hits  # nothing fuzzy: an exact answer (or none) is never reranked
        head = hits[start : start + self.candidates]
        info["candidates"] = len(head)
        if self._model is None:
            if self._loading is None:  # nobody warmed it up (tests, the CLI): load it now, for the next query
                self._loading = asyncio.get_running_loop().run_in_executor(
                    self.executor, load_cross_encoder, self.settings
                )
            if self._loading.done() and self._loading.exception() is None:
                self._model = self._loading.result()
            else:
                info["stopped"] = "unavailable" if self._loading.done() else "loading"
                return hits
        if text_slot(q.query) != "en":  # an English model: on Chinese it reorders at random (tests/test_eval.py)
            info["stopped"] = "language"
            return hits
        english = [i for i, h in enumerate(head) if text_slot(h.row["content"] or "") == "en"]
        if len(english) < len(head):
            info["not_english"] = len(head) - len(english)  # those keep their places
        model = self._model
        texts = [head[i].row["content"] for i in english]  # head first: what the deadline leaves is the best
        cancelled, scored, batches = threading.Event(), dict[int, float](), Batches(len(texts), self.batch)
        with trace.timed("cross_encoder"):
            t0 = perf_counter()
            loop = asyncio.get_running_loop()
            lane = partial(score_within, start=t0, cancelled=cancelled, out=scored, batches=batches)
            lanes = [
                loop.run_in_executor(
                    self.executor, lane, lambda part: model.score(q.query, part), texts, self.batch, self.budget_ms
                )
                for _ in range(min(self.settings.rerank_threads, len(texts)))
            ]
            try:  # the deadline: the answer is never late, whatever the threads are doing
                await asyncio.wait_for(asyncio.gather(*lanes), max(0.0, self.budget_ms / 1000 - (perf_counter() - t0)))
            except TimeoutError:
                cancelled.set()  # the threads start no further batch
            ready = head_scored(dict(scored))  # the unbroken head scored in time (a batch lands whole)
            done = ScoredBatch(ready, None if len(ready) == len(texts) else "budget")
        k = len(done.scores)
        info.update(computed=bool(k), scored=k, stopped=done.stopped)
        if k < 2:
            info["reranked"] = False  # nothing to trade places: the fused order stands
            return hits
        info["reranked"] = True if k == len(texts) else "partial"
        slots = english[:k]  # the places of the scored hits, best first: they trade places
        ce = dict(zip(slots, (round(x, 4) for x in done.scores[:k]), strict=True))
        factors = [head[i].factor for i in slots]
        order = reorder([head[i].score for i in slots], [ce[i] for i in slots], self.weight, factors)
        out = list(head)
        for place, j in zip(slots, order, strict=True):
            h, s = head[slots[j]], head[place].score
            h.match.scores["rerank"] = ce[slots[j]]
            h.match.scores["rank_before_rerank"] = slots[j] + 1
            out[place] = replace(h, score=s, order=(-s, *h.order[1:]))
        return hits[:start] + out + hits[start + len(head) :]
