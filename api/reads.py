"""The read side of the API as functions: facts, the audit replay, history, recall and the context block.

Each takes the process's Resources, the tenants the caller's key may use and validated parameters, checks the
tenant first and returns the route's body (or raises `ApiError`); the HTTP routes and the MCP tools both call
these, so both front ends serve the same answers from the same code. Recall "as known at" re-reads each hit as the
ledger knew it at `known_at`; `after` waits for a write first (api.consistency).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api import receipts
from api.access import caller_of
from api.consistency import Stage, check_applied, recall_stage, wait_after
from api.context import ContextBlock, build_context
from api.deps import check_tenant, cursor_place
from api.errors import ApiError
from api.limits import CONTEXT_SLOTS
from api.requests import ContextBody, RecallBody
from api.resources import Resources
from api.tokens import token_counter
from producers.contract import parse_rfc3339, rfc3339
from projections import shapes
from projections.postgres import receipts as receipt_store
from projections.postgres.queries import (
    current_facts,
    fact_history,
    facts_page,
    history_page,
    one_snapshot,
    subject_events,
    subject_versions,
)
from projections.search.recall import RecallFilters, RecallQuery

__all__ = ["context", "history", "recall", "subject_facts", "subject_log"]


async def subject_facts(
    res: Resources,
    tenants: frozenset[str],
    tenant: str,
    subject: str,
    as_of: datetime | None = None,
    known_at: datetime | None = None,
    after: str | None = None,
    *,
    offset: int = 0,
    limit: int | None = None,
    below: dict[int, int] | None = None,
    receipt: bool = True,
) -> shapes.FactsResponse:
    """The subject's facts at valid time `as_of` (default now), optionally only from events observed by `known_at`
    (and logged below the positions `below`: a receipt's replay); `offset`/`limit`: one page of them (_page)."""
    check_tenant(tenant, tenants)
    seen = await _after(res, tenant, after, "projection")
    t = as_of or datetime.now(UTC)
    signed = receipt and res.settings.receipts
    refolded = known_at is not None or below is not None
    basis = receipts.basis(res.settings) if signed else None
    async with res.pool.connection() as conn, _snapshot(conn, signed and refolded):
        if offset == 0 and limit is None:
            rows, page = await current_facts(conn, tenant, subject, t, known_at, below, basis), {}
        else:
            rows, total = await facts_page(conn, tenant, subject, t, offset, limit, known_at, below, basis)
            page = _page(offset, limit, total)
        ids = [r["event_id"] for r in rows]
        if signed and refolded:
            basis = await _basis(res, conn, tenant, ids)
    out = shapes.FactsResponse(tenant=tenant, subject=subject, as_of=rfc3339(t), facts=rows)
    if known_at is not None:  # a view as known then says so, receipt or not
        out["known_at"] = rfc3339(known_at)
    out |= page | seen
    asked = {"subject": subject, "as_of": as_of, "known_at": known_at, "offset": offset, "limit": limit}
    await _sign(res, signed, "facts", tenant, out, asked, ids, as_of=t, known_at=known_at, basis=basis)
    return out


def _snapshot(conn: psycopg.AsyncConnection, signed: bool) -> contextlib.AbstractAsyncContextManager[Any]:
    """An answer with a receipt is read in one snapshot with the positions its receipt names (`_basis`): a write
    committed between the two would be below the positions and not in the answer, and its replay would differ. (A
    read of the current facts or a chain reads them in its own statement, `receipts.basis`, and needs none.)"""
    return one_snapshot(conn) if signed else contextlib.nullcontext()


async def _basis(
    res: Resources, conn: psycopg.AsyncConnection, tenant: str, event_ids: Sequence[str]
) -> receipt_store.Basis:
    """What the receipt of an answer showing `event_ids` is made of, read on `conn` (in the answer's snapshot)."""
    consumer, topic = res.settings.processor_group, res.settings.topic
    ids = list(dict.fromkeys(event_ids))
    salt, positions, found = await receipt_store.receipt_rows(conn, consumer, topic, tenant, ids)
    return receipt_store.Basis(consumer, topic, salt, positions, found)


def _page(offset: int, limit: int | None, total: int) -> dict[str, shapes.Page]:
    """`{"page": ...}`: which part of the list of `total` an answer holds. A page is cut in the list's order
    (projections.postgres.queries.facts_page, history_page), as deterministic as the list (a receipt's replay
    re-derives the same page), and it bounds what is read as well as the answer's size on its way out, which is
    what holds a front end's event loop (the MCP SDK walks its whole answer)."""
    end = total if limit is None else offset + limit
    return {"page": shapes.Page(offset=offset, limit=limit, total=total, next_offset=end if end < total else None)}


async def _sign(
    res: Resources,
    want: bool,
    answer: receipts.Answer,
    tenant: str,
    out: Any,  # the answer (its shapes TypedDict), given its `receipt` here
    asked: BaseModel | Mapping[str, Any],
    event_ids: Sequence[str],
    **how: Any,
) -> None:
    """`out["receipt"]` (api.receipts.issue, `how` its keywords) when `want`ed and receipts are on
    (`LEDGER_RECEIPTS`); `asked`: the parameters that define the answer."""
    if want and res.settings.receipts:
        fields = receipts.request_fields(answer, asked)
        out["receipt"] = await receipts.issue(res, answer, tenant, out, fields, event_ids, **how)


async def _after(res: Resources, tenant: str, after: str | None, stage: Stage) -> dict[str, shapes.Consistency]:
    """`{"consistency": ...}` once `stage` has the write `after` names (api.consistency), `{}` without a token."""
    return {} if after is None else {"consistency": await wait_after(res, tenant, after, stage)}


async def subject_log(
    res: Resources,
    tenants: frozenset[str],
    tenant: str,
    subject: str,
    from_: datetime | None = None,
    to: datetime | None = None,
    limit: int = 10_000,
    after: str | None = None,
    *,
    cursor: str | None = None,
    below: dict[int, int] | None = None,
    receipt: bool = True,
) -> shapes.EventsResponse:
    """The subject's events in ledger order (partition, offset), each with its partition, offset and effect (only
    those logged below the positions `below`, with their effects then: a receipt's replay). A page ends at `limit`
    events; its `next_cursor` (the last one's place) is where the next page starts, `cursor`: a position, not a
    count, so the events logged or erased meanwhile move no page boundary."""
    check_tenant(tenant, tenants)
    if from_ is not None and to is not None and to < from_:
        raise ApiError(422, "invalid_range", "to is before from", "to")
    seen = await _after(res, tenant, after, "projection")
    signed = receipt and res.settings.receipts
    past = None if cursor is None else cursor_place(cursor)
    async with res.pool.connection() as conn, _snapshot(conn, signed):
        if past is not None:
            await check_applied(res, conn, past, "cursor")
        rows, more = await subject_events(conn, tenant, subject, from_, to, limit, below, past)
        ids = [r["event_id"] for r in rows]
        basis = await _basis(res, conn, tenant, ids) if signed else None
    next_cursor = f"{rows[-1]['partition']}:{rows[-1]['offset']}" if more else None
    out = shapes.EventsResponse(tenant=tenant, subject=subject, events=rows, more=more, next_cursor=next_cursor)
    out |= seen
    asked = {"subject": subject, "from": from_, "to": to, "limit": limit, "cursor": cursor}
    await _sign(res, signed, "events", tenant, out, asked, ids, as_of=None, basis=basis)
    return out


async def history(
    res: Resources,
    tenants: frozenset[str],
    tenant: str,
    memory_id: str,
    after: str | None = None,
    *,
    offset: int = 0,
    limit: int | None = None,
    below: dict[int, int] | None = None,
    receipt: bool = True,
) -> shapes.HistoryResponse:
    """A fact's version chain, oldest first; 404 naming memory_id if the tenant has no such fact (re-folded from
    the events logged below the positions `below`: a receipt's replay); `offset`/`limit`: one page of it (_page)."""
    check_tenant(tenant, tenants)
    seen = await _after(res, tenant, after, "projection")
    signed = receipt and res.settings.receipts
    basis = receipts.basis(res.settings) if signed else None
    async with res.pool.connection() as conn, _snapshot(conn, signed and below is not None):
        if offset == 0 and limit is None:
            versions = await fact_history(conn, tenant, memory_id, below, basis)
            total, page = len(versions), {}
        else:
            versions, total = await history_page(conn, tenant, memory_id, offset, limit, below, basis)
            page = _page(offset, limit, total)
        ids = [v["event_id"] for v in versions]
        if signed and below is not None and total:
            basis = await _basis(res, conn, tenant, ids)
    if not total:
        raise ApiError(404, "not_found", f"no fact {memory_id!r} in tenant {tenant!r}", "memory_id")
    out = shapes.HistoryResponse(memory_id=memory_id, tenant=tenant, versions=versions) | page | seen
    asked = {"memory_id": memory_id, "offset": offset, "limit": limit}
    await _sign(res, signed, "history", tenant, out, asked, ids, as_of=None, basis=basis)
    return out


async def recall(
    res: Resources,
    tenants: frozenset[str],
    body: RecallBody,
    *,
    receipt: bool = True,
    record: bool = True,
    below: dict[int, int] | None = None,
    served: dict[str, float] | None = None,
) -> shapes.RecallResponse:
    """`POST /v1/recall`: hits (exact first, then keyword/semantic), the query's cues and a per-stage trace (and
    its receipt; `record`: the hits count as served, which a receipt's replay does not; `below`: with known_at, each
    hit re-read from the events logged below those positions too, as a replay does; `served`: with known_at, the
    access signals a receipt says ordered its ties, by which a replay orders them)."""
    check_tenant(body.tenant, tenants)
    seen = await _after(res, body.tenant, body.after, recall_stage(body.mode))
    query = RecallQuery(
        tenant=body.tenant,
        query=body.query,
        subject=body.subject,
        top_k=body.top_k,
        as_of=body.as_of,
        mode=body.mode,
        filters=body.filters.to_engine() if body.filters else RecallFilters(),
        explain=body.explain,
        rerank=body.rerank,
        context_turns=body.context_turns,
        known_at=body.known_at,
        below=below if body.known_at is not None else None,
        served=served if body.known_at is not None else None,
    )
    signed = receipt and body.receipt and res.settings.receipts
    # the receipt's rows are read by the engine's verification, in its statement (none of their own)
    basis = receipts.basis(res.settings) if signed else None
    # a store that fails is a 503 naming it (api.errors), never a guessed answer
    answer = await res.recall.recall(query, basis)
    if body.known_at is not None:
        # the fold is read again, after the verification: of the records below the positions that read saw (those
        # its receipt names), so that nothing applied since shows in an answer its receipt says it predates (no
        # positions: rows no projector of this consumer wrote, whose place nothing records; unsigned, the latest)
        seen_below = below if below is not None or basis is None else basis.positions or None
        answer = await _as_known(res, body.tenant, answer, body.known_at, seen_below)
    if seen:  # the trace says which positions the answer reflects
        answer = {**answer, "trace": {**answer["trace"], **seen}}
    if record:
        res.access.served(body.tenant, caller_of(tenants), answer["hits"])  # queued, sent off the request path
    cited, as_of = [h["event_id"] for h in answer["hits"]], answer["trace"]["as_of"]
    how = {"as_of": as_of, "known_at": body.known_at, "ranked": True, "basis": basis}
    await _sign(res, signed, "recall", body.tenant, answer, body, cited, **how)
    return answer


_VERSION_FIELDS = ("version_id", "event_id", "version", "value", "content", "kind", "status", "valid_from")
_VERSION_FIELDS += ("observed_at", "source")


# a replay's known_at: whenever observed, so its positions alone decide what was known
WHENEVER_OBSERVED = datetime.max.replace(tzinfo=UTC)


async def _as_known(
    res: Resources,
    tenant: str,
    answer: shapes.RecallResponse,
    known_at: datetime,
    below: dict[int, int] | None = None,
) -> shapes.RecallResponse:
    """The hits as the ledger knew them at `known_at` (see the module docstring)."""
    at = parse_rfc3339(answer["trace"]["as_of"])
    known: dict[str, shapes.FactVersion] = {}
    async with res.pool.connection() as conn:
        for subject in sorted({h["subject"] for h in answer["hits"]}):
            for row in await current_facts(conn, tenant, subject, at, known_at, below):
                known[row["memory_id"]] = row
    hits = []
    for h in answer["hits"]:
        row = known.get(h["memory_id"])
        if row is None:
            continue
        # the engine verified the version the ledger knew then (recall.verify); a re-fold below a receipt's
        # positions may know an earlier one, which then stands for it
        candidate = h["match"]["verified"]["candidate"]
        verified = {"candidate": candidate} | (
            {"replaced_by": row["version_id"]} if candidate != row["version_id"] else {}
        )
        ends = [t for t in (row["valid_to"], row["superseded_at"]) if t is not None]
        h = {
            **h,
            **{k: row[k] for k in _VERSION_FIELDS},  # status and end as known then, not as known now
            "valid_to": min(ends, key=parse_rfc3339) if ends else None,
            "match": {**h["match"], "verified": verified},
        }
        hits.append(h)
    when = None if known_at == WHENEVER_OBSERVED else rfc3339(known_at)  # None: whatever was logged below the positions
    trace = {**answer["trace"], "known_at": when, "known_at_left_out": len(answer["hits"]) - len(hits)}
    return {**answer, "hits": hits, "trace": trace}


async def context(res: Resources, tenants: frozenset[str], body: ContextBody) -> ContextBlock:
    """`POST /v1/context`: the subject's facts (and, asked, their history) with the recall hits for the question
    first, as one block within the token budget (api.context builds it; this only gathers the rows)."""
    check_tenant(body.tenant, tenants)
    # a question is recalled (its mode's stage); the block's facts are the projection's
    seen = await _after(res, body.tenant, body.after, recall_stage(body.mode) if body.question else "projection")
    t = body.as_of or datetime.now(UTC)

    async def rows() -> tuple[list[shapes.FactVersion], list[shapes.FactVersion]]:
        async with res.pool.connection() as conn:
            facts = await current_facts(conn, body.tenant, body.subject, t)
            versions = await subject_versions(conn, body.tenant, body.subject) if body.include_history else []
        return facts, versions

    async def hits() -> list[shapes.RecallHit]:
        if body.question is None:
            return []
        ask = RecallBody(
            tenant=body.tenant, subject=body.subject, query=body.question, top_k=body.top_k, as_of=t, mode=body.mode
        )
        return (await recall(res, tenants, ask, receipt=False))["hits"]

    # one block of a tenant at a time (api.limits): its rows are held and its tokens counted, never a whole pool's
    async with CONTEXT_SLOTS.slot(body.tenant):
        # the rows and the recall at once (gather, not a TaskGroup: a store failure stays itself, the 503 naming it)
        (facts, versions), found = await asyncio.gather(rows(), hits())
        counter = token_counter(res.settings.model_dir)
        # counting tokens is CPU work bounded by the budget (api.context): in a worker thread, off the event loop
        block = await run_in_threadpool(
            build_context,
            body,
            facts=facts,
            hits=found,
            versions=versions,
            at=t,
            count=counter.count,
            tokenizer=res.settings.embed_model,
        )
    block.doc.update(seen)  # the json form says which positions it reflects (the text block is only the block)
    made_by = {r["version_id"]: r["event_id"] for r in (*versions, *facts, *found)}
    cited = [made_by[line["version_id"]] for line in block.doc["lines"] if line["version_id"] in made_by]
    await _sign(res, True, "context", body.tenant, block.doc, body, cited, as_of=t, ranked=body.question is not None)
    return block
