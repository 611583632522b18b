"""Read-your-writes: a read given a write's consistency token (`after`) answers once what it reads has it.

A read looks in PostgreSQL cheaply on the event loop until the stage it reads from has the token's positions:
again at each commit the projection or an indexer announces (the recall engine's `CommitListener`), and at a
backing-off poll if none is heard. It then says which positions it reflects; past `AFTER_WAIT_S` it answers 503
`not_yet`, so it never misses the write nor hangs on a stopped worker. Stages: `projection` (stored positions),
`documents` (also the tenant's outbox drained and the index refreshed) and `vectors` (also the embed queue, for
semantic recall only, as waiting for vectors would add the embedding's time to every other read). Only the reader's
tenant's rows are looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Query
from pydantic import AfterValidator, Field

from api.errors import ApiError, store_unavailable
from producers.consistency import MAX_TOKEN_CHARS, decode_token, encode_token
from projections import shapes
from projections.postgres.positions import reached_async, search_pending_async

if TYPE_CHECKING:  # the request models import this module: no store clients on their import path
    import psycopg

    from api.resources import Resources

__all__ = [
    "AFTER_NOTE",
    "AFTER_WAIT_S",
    "After",
    "AfterQuery",
    "Stage",
    "check_after",
    "check_applied",
    "recall_stage",
    "wait_after",
]

AFTER_WAIT_S = 2.0  # the longest a read waits for its token; the projection is typically there in under a second
AFTER_NOTE = (
    "a consistency_token a write answered: answer only once that write is readable here (waits up to "
    f"{AFTER_WAIT_S:g} s, then 503 not_yet)"
)

Stage = Literal["projection", "documents", "vectors"]
_POLL_FIRST_S, _POLL_MAX_S = 0.005, 0.05


def check_after(value: str | None) -> str | None:
    """A token as a write answers it, else ValueError (a 422 naming `after` at every door)."""
    if value is not None:
        _written(value)
    return value


def _written(token: str) -> dict[int, int]:
    """The positions of a write's token, else ValueError: a write's token names the offset after each record it
    wrote, never 0 (a partition at 0 would be read as reached at once, in a topic that may not even have it)."""
    positions = decode_token(token)
    if 0 in positions.values():
        raise ValueError("not a consistency token of a write: a write's names the offset after its record, never 0")
    return positions


# the request models' field (api.requests) and the GET routes' query parameter, one rule
After = Annotated[
    str | None,
    Field(min_length=1, max_length=MAX_TOKEN_CHARS, description=AFTER_NOTE),
    AfterValidator(check_after),
]
AfterQuery = Annotated[
    str | None, Query(min_length=1, max_length=MAX_TOKEN_CHARS, description=AFTER_NOTE), AfterValidator(check_after)
]


def recall_stage(mode: str) -> Stage:
    """What recall in this mode needs of a write to find it: its document, or (semantic only) its vectors too."""
    return "vectors" if mode == "semantic" else "documents"


async def wait_after(res: Resources, tenant: str, after: str, stage: Stage) -> shapes.Consistency:
    """Wait until `stage` has reached the token `after` for `tenant`'s reads; what the answer reflects.

    `{"after", "reflects" (the projection's positions, a token), "stage", "waited_ms"}`; ApiError 503 `not_yet`
    past AFTER_WAIT_S, 422 naming `after` for a token that is not one."""
    try:
        targets = _written(after)
    except ValueError as exc:
        raise ApiError(422, "invalid_value", str(exc), "after") from None
    settings = res.settings
    started = time.monotonic()
    deadline, delay = started + AFTER_WAIT_S, _POLL_FIRST_S
    applied, indexed = False, stage == "projection"
    stored: dict[int, int] = {}
    listener = res.recall.commits()
    while True:
        changed = listener.changed()  # taken before looking: a commit heard meanwhile is not missed
        async with res.pool.connection() as conn:
            if not applied:
                applied, stored = await reached_async(conn, settings.processor_group, settings.topic, targets)
            # the write's queued rows are in the transaction that advanced the positions past it: looked for after
            if applied and not indexed:
                indexed = not await search_pending_async(conn, stage, tenant, targets)
        if applied and indexed:
            break
        if time.monotonic() + delay > deadline:
            await _check_within_log(res, targets)
            if applied:  # waiting on the index: a search index that is down is said so, not "retry"
                await _check_index_up(res)
            raise _not_yet(stage, applied, targets, stored)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), delay)
        delay = min(delay * 2, _POLL_MAX_S)
    if stage != "projection":  # the documents are written; searchable once the index is refreshed after that
        await _refreshed(res, time.monotonic())
    return {
        "after": after,
        "reflects": encode_token(stored),
        "stage": stage,
        "waited_ms": round((time.monotonic() - started) * 1000, 1),
    }


_LOG_END_WAIT_S = 1.0  # how long a read that timed out asks the broker for the log's end (else: not_yet, as before)


async def _check_within_log(res: Resources, targets: dict[int, int]) -> None:
    """422 naming `after` for a token past the ledger topic's end (a partition it does not have, an offset not
    written yet): no write answered it, so waiting again could never help. Asked only of a read about to answer
    `not_yet`, and only as long as `_LOG_END_WAIT_S`: a broker that cannot say leaves the answer `not_yet`."""
    try:
        ends = await asyncio.wait_for(asyncio.to_thread(res.offsets.read), _LOG_END_WAIT_S)
    except Exception:  # noqa: BLE001 - no answer from the broker: the token may be good, so not_yet stands
        return
    beyond = {p: o for p, o in targets.items() if p not in ends or o > ends[p]}
    if beyond and ends:
        raise ApiError(
            422,
            "invalid_value",
            f"names {_spelled(beyond)} (partition:next_offset), past the end of the ledger topic "
            f"({_spelled(ends)}): no write of this ledger answered it",
            "after",
        )


def _spelled(positions: dict[int, int]) -> str:
    return ", ".join(f"{p}:{o}" for p, o in sorted(positions.items())) or "none"


_INDEX_PING_S = 1.0  # how long a read that timed out waiting on the index asks Elasticsearch whether it is up


async def _check_index_up(res: Resources) -> None:
    """503 naming elasticsearch when it does not answer: the indexer cannot catch up while it is down."""
    try:  # the cluster's health, as /v1/health asks it (`GET /` may be closed to the client)
        await res.es.options(request_timeout=_INDEX_PING_S).cluster.health(timeout="1s")
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the index not being there
        raise store_unavailable("elasticsearch", exc) from None


def _not_yet(stage: Stage, applied: bool, targets: dict[int, int], stored: dict[int, int]) -> ApiError:
    if not applied:
        where = "the projection has not applied the write yet"
    else:
        where = "the projection applied it; the search index has not caught up yet"
    reached = {p: stored.get(p, 0) for p in targets}
    message = (
        f"not_yet: {where} after {AFTER_WAIT_S:g} s (stage {stage}; partition:next_offset reached {_spelled(reached)} "
        f"of {_spelled(targets)}, reflects {encode_token(stored) if stored else 'nothing'}); retry the same read"
    )
    return ApiError(503, "not_yet", message, "after", headers={"Retry-After": "1"})


class _Refresher:
    """One index refresh at a time per Elasticsearch client, shared by every read that needs one started after
    its documents were written (a burst of reads costs a refresh or two, not one each)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.task: asyncio.Future[Any] | None = None

    async def after(self, since: float, res: Resources) -> None:
        while True:
            task = self.task
            if task is not None and self.started >= since:
                await asyncio.shield(task)
                return
            if task is not None and not task.done():  # began before our documents were written: the next one
                await asyncio.wait([task])
                continue
            self.started = time.monotonic()
            self.task = asyncio.ensure_future(
                res.es.indices.refresh(index=res.settings.es_index, ignore_unavailable=True)
            )


_REFRESHERS: weakref.WeakKeyDictionary[Any, _Refresher] = weakref.WeakKeyDictionary()


async def _refreshed(res: Resources, since: float) -> None:
    refresher = _REFRESHERS.get(res.es)
    if refresher is None:
        refresher = _REFRESHERS[res.es] = _Refresher()
    await refresher.after(since, res)


async def check_applied(res: Resources, conn: psycopg.AsyncConnection, place: tuple[int, int], field: str) -> None:
    """422 naming `field` for a page cursor past what the projection has applied (a partition it never took a record
    of, an offset beyond its position): no page gave it, and the page after it would read as the log's end."""
    settings = res.settings
    reached, stored = await reached_async(conn, settings.processor_group, settings.topic, {place[0]: place[1] + 1})
    if not reached:
        applied = ", ".join(f"{p}:{o}" for p, o in sorted(stored.items())) or "none"
        raise ApiError(
            422,
            "invalid_value",
            f"names {place[0]}:{place[1]}, past what the projection has applied (partition:next_offset {applied}): "
            "no page of this ledger gave it",
            field,
        )
