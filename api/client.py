"""The client of the ledger's HTTP API: `LedgerClient` (sync) and `AsyncLedgerClient` (async), on httpx.

    from api.client import LedgerClient, LedgerError

    with LedgerClient("http://127.0.0.1:8000", api_key="dev-key", tenant="demo") as ledger:
        for hit in ledger.recall("P1 的后端服务地址是什么").hits:
            print(hit.value, hit.match.stage, hit.source)
        profile = ledger.facts("project:P1", as_of="2026-01-01T00:00:00Z")
        chain = ledger.history(profile.facts[0].memory_id)

Beside the producer SDK (producers.sdk, which writes to Kafka), this reads what the projections
hold: recall, the prompt-ready context block, a subject's facts (as of a valid time, as known at a
transaction time), a fact's history, a subject's events in ledger order (audit replay), stats and the
consistency recount, health, the event schema, the key's tenants, a tenant's subjects by prefix, its erasure
records, and what became of an event by its id (`event_status`: for a producer that writes to Kafka itself, the
way to learn whether its event was applied or dead-lettered); it verifies and replays the receipts every answer
carries; and it serves an operator's dead letters: list them, open one, re-drive it with a corrected event or
discard it with a reason (the client's only writes; each is an event through the API's door, so nothing is
deleted). Publishing and erasing are the SDK's; the data-key routes are the key provider's (producers.keys).
`AsyncLedgerClient` has the same methods as coroutines.

Results are the API's own response models (api.schemas: `RecallResponse`, `FactsResponse`, ...),
never a second definition of a shape; they keep fields this client does not know (the models
allow extra fields), so a newer server never breaks an older client.

Validation is the server's: an argument left as None is not sent (the server's default applies)
and a bad one (a naive datetime, `top_k=0`, no tenant at all) comes back as the API's 422 naming
the field. Every failure raises one exception type, `LedgerError`: `.status` (None when the API
did not answer), `.detail` (the API's `{"detail": [{code, field, message}]}` items), `.code`,
`.field`, `.message` of the first item, and `.store` (postgres, elasticsearch or kafka) for a 503
`store_unavailable`. `health()` is the exception: a 503 there is an answer (`status: degraded`).

Read-your-writes: every read takes `after=`, the `consistency_token` a write answered (the SDK's `.token`,
`POST /v1/events`, MCP remember): the API answers once it has that write, waiting up to 2 s, else a `LedgerError`
503 `not_yet` (retry). The answer's `consistency` (recall: `trace.consistency`) says which positions it reflects.

Configuration: whatever is not given as an argument comes from `settings`, the client's own
(`producers.settings.ClientSettings`: `LEDGER_CLIENT_URL`, default http://127.0.0.1:8000,
`LEDGER_CLIENT_API_KEY`, `LEDGER_CLIENT_TIMEOUT_S`), never the server's: a client must work on a machine
where the server's settings would not load (no LEDGER_DEVELOPMENT, no database). With url, api_key and
timeout all given nothing is read. `http=` lends the client an httpx client of yours (proxies, TLS,
event hooks); it is then yours to close.

Import cost: httpx, pydantic and our pure modules only (no FastAPI, no store client);
tests/test_client.py checks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from api.schemas import (
    ConsistencyResponse,
    ContextResponse,
    DeadLetterAction,
    DeadLetterRecord,
    DeadLettersResponse,
    ErasureRecord,
    ErasuresResponse,
    ErrorBody,
    ErrorItem,
    EventSchemaDocument,
    EventsResponse,
    EventStatus,
    FactsResponse,
    HealthResponse,
    HistoryResponse,
    RecallResponse,
    ReceiptReplay,
    ReceiptVerification,
    StatsResponse,
    SubjectsResponse,
    TenantsResponse,
)
from producers.contract import rfc3339
from producers.settings import ClientSettings

__all__ = ["AsyncLedgerClient", "LedgerClient", "LedgerError"]

STORES = ("postgres", "elasticsearch", "kafka")
Time = datetime | str
Filters = Mapping[str, str | Sequence[str]]


class LedgerError(Exception):
    """The API refused a request (or could not be reached): its status and its error items."""

    def __init__(self, status: int | None, detail: Sequence[ErrorItem]) -> None:
        self.status = status
        self.detail = list(detail) or [ErrorItem(code="error", field=None, message="no detail")]
        first = self.detail[0]
        self.code, self.field, self.message = first.code, first.field, first.message
        super().__init__(
            f"{status if status is not None else 'no answer'}: "
            + "; ".join(f"{i.code}" + (f" ({i.field})" if i.field else "") + f": {i.message}" for i in self.detail)
        )

    @property
    def store(self) -> str | None:
        """The store a 503 names (`postgres: database unavailable (...)` -> postgres), else None."""
        for item in self.detail:
            name = item.message.split(":", 1)[0]
            if item.code == "store_unavailable" and name in STORES:
                return name
        return None

    def as_dict(self) -> dict[str, Any]:
        """The API's error body: `{"detail": [{code, field, message}, ...]}`."""
        return ErrorBody(detail=self.detail).model_dump(mode="json")


# -- what each method asks: one description, sent by either client ---------------------------------------------


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    model: type[BaseModel]
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    answers: tuple[int, ...] = (200,)  # statuses whose body is `model` (health: 503 too)


def _segment(text: str) -> str:
    """A path segment: every reserved character escaped (a subject's `/` included; the API reads `%2F` as `/`)."""
    return quote(text, safe="")


def _time(value: Time) -> str:
    """An aware datetime in the API's spelling; anything else as it is, for the server to judge (and name)."""
    if isinstance(value, datetime):
        return rfc3339(value) if value.utcoffset() is not None else value.isoformat()
    return str(value)


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _times(**values: Time | None) -> dict[str, str]:
    return {k: _time(v) for k, v in values.items() if v is not None}


def _recall(
    tenant: str | None,
    query: str,
    subject: str | None,
    top_k: int | None,
    as_of: Time | None,
    mode: str | None,
    filters: Filters | None,
    after: str | None = None,
) -> _Call:
    body = _given(
        tenant=tenant, query=query, subject=subject, top_k=top_k, mode=mode, after=after, **_times(as_of=as_of)
    )
    if filters is not None:
        body["filters"] = {k: (v if isinstance(v, str) else list(v)) for k, v in filters.items()}
    return _Call("POST", "/v1/recall", RecallResponse, body=body)


def _context(
    tenant: str | None,
    subject: str,
    question: str | None,
    budget_tokens: int | None,
    include_history: bool | None,
    as_of: Time | None,
    top_k: int | None,
    mode: str | None,
    after: str | None = None,
) -> _Call:
    body = _given(
        tenant=tenant,
        subject=subject,
        question=question,
        budget_tokens=budget_tokens,
        include_history=include_history,
        top_k=top_k,
        mode=mode,
        after=after,
        **_times(as_of=as_of),
    )
    return _Call("POST", "/v1/context", ContextResponse, body={**body, "format": "json"})  # .text: the text form


def _facts(
    tenant: str | None, subject: str, as_of: Time | None, known_at: Time | None, after: str | None = None
) -> _Call:
    params = _given(tenant=tenant, after=after, **_times(as_of=as_of, known_at=known_at))
    return _Call("GET", f"/v1/subjects/{_segment(subject)}/facts", FactsResponse, params=params)


def _history(tenant: str | None, memory_id: str, after: str | None = None) -> _Call:
    params = _given(tenant=tenant, after=after)
    return _Call("GET", f"/v1/facts/{_segment(memory_id)}/history", HistoryResponse, params=params)


def _events(
    tenant: str | None,
    subject: str,
    from_: Time | None,
    to: Time | None,
    limit: int | None,
    after: str | None = None,
) -> _Call:
    params = {**_given(tenant=tenant, limit=limit, after=after), **_times(**{"from": from_, "to": to})}
    return _Call("GET", f"/v1/subjects/{_segment(subject)}/events", EventsResponse, params=params)


def _event_status(tenant: str | None, event_id: str) -> _Call:
    return _Call("GET", f"/v1/events/{_segment(event_id)}", EventStatus, params=_given(tenant=tenant))


def _stats(tenant: str | None) -> _Call:
    return _Call("GET", "/v1/stats", StatsResponse, params=_given(tenant=tenant))


def _consistency(tenant: str | None) -> _Call:
    return _Call("GET", "/v1/stats/consistency", ConsistencyResponse, params=_given(tenant=tenant))


def _subjects(tenant: str | None, prefix: str | None, limit: int | None) -> _Call:
    return _Call("GET", "/v1/subjects", SubjectsResponse, params=_given(tenant=tenant, prefix=prefix, limit=limit))


def _erasures(tenant: str | None, subject: str | None, limit: int | None) -> _Call:
    return _Call("GET", "/v1/erasures", ErasuresResponse, params=_given(tenant=tenant, subject=subject, limit=limit))


def _erasure(tenant: str | None, erasure_id: str) -> _Call:
    return _Call("GET", f"/v1/erasures/{_segment(erasure_id)}", ErasureRecord, params=_given(tenant=tenant))


def _dead_letters(tenant: str | None, state: str | None, after: str | None, limit: int | None) -> _Call:
    params = _given(tenant=tenant, state=state, after=after, limit=limit)
    return _Call("GET", "/v1/dead-letters", DeadLettersResponse, params=params)


def _dead_letter(tenant: str | None, partition: int, offset: int) -> _Call:
    path = f"/v1/dead-letters/{_segment(str(partition))}/{_segment(str(offset))}"
    return _Call("GET", path, DeadLetterRecord, params=_given(tenant=tenant))


def _redrive(tenant: str | None, partition: int, offset: int, event: Mapping[str, Any]) -> _Call:
    body = _given(tenant=tenant, partition=partition, offset=offset, event=dict(event))
    return _Call("POST", "/v1/dead-letters/redrive", DeadLetterAction, body=body)


def _discard(tenant: str | None, partition: int, offset: int, reason: str) -> _Call:
    body = _given(tenant=tenant, partition=partition, offset=offset, reason=reason)
    return _Call("POST", "/v1/dead-letters/discard", DeadLetterAction, body=body)


def _json_of(value: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """A receipt or an answer as the server sent it: a response model of this client gives back its JSON (every
    field it came with), so the signature and the digests hold over it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return dict(value)


def _verify_receipt(
    tenant: str | None, receipt: Mapping[str, Any] | BaseModel, answer: Mapping[str, Any] | BaseModel | None
) -> _Call:
    sent = _json_of(receipt)
    body = _given(tenant=tenant or sent.get("tenant"), receipt=sent)
    if answer is not None:
        body["answer"] = _json_of(answer)  # its receipt, consistency and trace are no part of its digest
    return _Call("POST", "/v1/receipts/verify", ReceiptVerification, body=body)


def _replay_receipt(tenant: str | None, receipt: Mapping[str, Any] | BaseModel, request: Mapping[str, Any]) -> _Call:
    sent = _json_of(receipt)
    body = _given(tenant=tenant or sent.get("tenant"), receipt=sent, request=dict(request))
    return _Call("POST", "/v1/receipts/replay", ReceiptReplay, body=body)


_HEALTH = _Call("GET", "/v1/health", HealthResponse, answers=(200, 503))
_EVENT_SCHEMA = _Call("GET", "/v1/schema/event", EventSchemaDocument)
_TENANTS = _Call("GET", "/v1/tenants", TenantsResponse)


# -- what each answer means: one reading, for either client --------------------------------------------------------


def _result(call: _Call, response: httpx.Response) -> Any:
    if response.status_code in call.answers:
        try:
            return call.model.model_validate_json(response.content)
        except ValidationError as exc:
            if response.status_code == 200:  # the server answered, but not with the shape it documents
                item = ErrorItem(code="bad_response", field=None, message=f"not a {call.model.__name__}: {exc}"[:500])
                raise LedgerError(200, [item]) from exc
            # a 503 that is not a health body (a proxy's page): an error like any other
    raise _error(response)


def _error(response: httpx.Response) -> LedgerError:
    try:
        return LedgerError(response.status_code, ErrorBody.model_validate_json(response.content).detail)
    except ValidationError:  # not the API's error shape (a proxy's page, a server of another kind)
        text = response.text.strip()[:300] or response.reason_phrase
        return LedgerError(
            response.status_code, [ErrorItem(code=f"http_{response.status_code}", field=None, message=text)]
        )


def _unreachable(url: str, exc: httpx.TransportError) -> LedgerError:
    code = "api_timeout" if isinstance(exc, httpx.TimeoutException) else "api_unreachable"
    message = f"api: no answer from {url} ({type(exc).__name__}: {exc})"[:500]
    return LedgerError(None, [ErrorItem(code=code, field=None, message=message)])


@dataclass(frozen=True)
class _Config:
    url: str
    headers: dict[str, str]
    timeout: float


def _config(url: str | None, api_key: str | None, timeout: float | None, settings: ClientSettings | None) -> _Config:
    if url is None or api_key is None or timeout is None:
        s = settings or ClientSettings()
        url = url or s.url
        api_key = api_key if api_key is not None else s.api_key
        timeout = timeout if timeout is not None else s.timeout_s
    return _Config(url.rstrip("/"), {"X-API-Key": api_key} if api_key else {}, timeout)


class _Base:
    def __init__(self, config: _Config, tenant: str | None) -> None:
        self.url, self.tenant, self.timeout = config.url, tenant, config.timeout
        self._headers = config.headers

    def _tenant(self, tenant: str | None) -> str | None:
        return tenant if tenant is not None else self.tenant

    def _request(self, call: _Call) -> dict[str, Any]:
        return {
            "method": call.method,
            "url": self.url + call.path,
            "params": call.params,
            "json": call.body,
            "headers": self._headers,
            "timeout": self.timeout,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, tenant={self.tenant!r})"


class LedgerClient(_Base):
    """The sync client; a context manager (closes its httpx client, unless it was lent one)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        tenant: str | None = None,
        timeout: float | None = None,
        settings: ClientSettings | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        super().__init__(_config(url, api_key, timeout, settings), tenant)
        self._owned = http is None
        self._http = http if http is not None else httpx.Client()

    def _send(self, call: _Call) -> Any:
        try:
            response = self._http.request(**self._request(call))
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from exc
        return _result(call, response)

    def recall(
        self,
        query: str,
        *,
        tenant: str | None = None,
        subject: str | None = None,
        top_k: int | None = None,
        as_of: Time | None = None,
        mode: str | None = None,
        filters: Filters | None = None,
        after: str | None = None,
    ) -> RecallResponse:
        """POST /v1/recall: exact cues first, then keywords and vectors; each hit says which stage found it and why."""
        return self._send(_recall(self._tenant(tenant), query, subject, top_k, as_of, mode, filters, after))

    def context(
        self,
        subject: str,
        question: str | None = None,
        *,
        tenant: str | None = None,
        budget_tokens: int | None = None,
        include_history: bool | None = None,
        as_of: Time | None = None,
        top_k: int | None = None,
        mode: str | None = None,
        after: str | None = None,
    ) -> ContextResponse:
        """POST /v1/context: the prompt-ready block for a subject (and a question); `.text` is what to paste."""
        return self._send(
            _context(self._tenant(tenant), subject, question, budget_tokens, include_history, as_of, top_k, mode, after)
        )

    def facts(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        as_of: Time | None = None,
        known_at: Time | None = None,
        after: str | None = None,
    ) -> FactsResponse:
        """GET /v1/subjects/{subject}/facts: the facts holding at valid time `as_of` (now), as known at `known_at`."""
        return self._send(_facts(self._tenant(tenant), subject, as_of, known_at, after))

    def history(self, memory_id: str, *, tenant: str | None = None, after: str | None = None) -> HistoryResponse:
        """GET /v1/facts/{memory_id}/history: the fact's version chain, oldest first."""
        return self._send(_history(self._tenant(tenant), memory_id, after))

    def events(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        from_: Time | None = None,
        to: Time | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> EventsResponse:
        """GET /v1/subjects/{subject}/events: the audit replay, in ledger order, each event with its effect."""
        return self._send(_events(self._tenant(tenant), subject, from_, to, limit, after))

    def event_status(self, event_id: str, *, tenant: str | None = None) -> EventStatus:
        """GET /v1/events/{event_id}: what became of an event (pending, applied, duplicate, dead_lettered, unknown)."""
        return self._send(_event_status(self._tenant(tenant), event_id))

    def stats(self, *, tenant: str | None = None) -> StatsResponse:
        """GET /v1/stats: invariant counters (0 when healthy), lag per partition, dead letters, search orphans."""
        return self._send(_stats(self._tenant(tenant)))

    def health(self) -> HealthResponse:
        """GET /v1/health: every part's state; `status` is `degraded` (not an exception) while a store is down."""
        return self._send(_HEALTH)

    def consistency(self, *, tenant: str | None = None) -> ConsistencyResponse:
        """GET /v1/stats/consistency: the tenant's projections recounted against the ledger (a scan: 429 when
        another is running for the tenant)."""
        return self._send(_consistency(self._tenant(tenant)))

    def tenants(self) -> TenantsResponse:
        """GET /v1/tenants: the tenants this API key may use."""
        return self._send(_TENANTS)

    def subjects(
        self, prefix: str | None = None, *, tenant: str | None = None, limit: int | None = None
    ) -> SubjectsResponse:
        """GET /v1/subjects: the tenant's subjects starting with `prefix`, in code point order; `.more` when cut."""
        return self._send(_subjects(self._tenant(tenant), prefix, limit))

    def erasures(
        self, *, tenant: str | None = None, subject: str | None = None, limit: int | None = None
    ) -> ErasuresResponse:
        """GET /v1/erasures: the tenant's erasure records, newest first (of one subject with `subject`)."""
        return self._send(_erasures(self._tenant(tenant), subject, limit))

    def erasure(self, erasure_id: str, *, tenant: str | None = None) -> ErasureRecord:
        """GET /v1/erasures/{erasure_id}: one erasure record (a 404 until the worker has applied it)."""
        return self._send(_erasure(self._tenant(tenant), erasure_id))

    def event_schema(self) -> EventSchemaDocument:
        """GET /v1/schema/event: the event contract's JSON Schema (`.model_dump(by_alias=True)`: the document)."""
        return self._send(_EVENT_SCHEMA)

    def dead_letters(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> DeadLettersResponse:
        """GET /v1/dead-letters: the records the worker refused, in ledger order, each with its reason and state
        (`open`, `redriven`, `discarded`; `state=` keeps one); `.next` is the `after=` of the next page."""
        return self._send(_dead_letters(self._tenant(tenant), state, after, limit))

    def dead_letter(self, partition: int, offset: int, *, tenant: str | None = None) -> DeadLetterRecord:
        """GET /v1/dead-letters/{partition}/{offset}: one dead letter and its record's fields, as far as they decode."""
        return self._send(_dead_letter(self._tenant(tenant), partition, offset))

    def redrive_dead_letter(
        self, partition: int, offset: int, event: Mapping[str, Any], *, tenant: str | None = None
    ) -> DeadLetterAction:
        """POST /v1/dead-letters/redrive: publish the corrected `event` (its tenant defaults to the call's) linked to
        the letter, which reads `redriven` once the worker applied it; a letter resolved already is a 409
        `dead_letter_resolved`."""
        return self._send(_redrive(self._tenant(tenant), partition, offset, event))

    def discard_dead_letter(
        self, partition: int, offset: int, reason: str, *, tenant: str | None = None
    ) -> DeadLetterAction:
        """POST /v1/dead-letters/discard: close the letter without a correction (a `deadletter.discarded` event with
        the reason; nothing is deleted); it reads `discarded` once the worker applied it."""
        return self._send(_discard(self._tenant(tenant), partition, offset, reason))

    def verify_receipt(
        self,
        receipt: Mapping[str, Any] | BaseModel,
        *,
        answer: Mapping[str, Any] | BaseModel | None = None,
        tenant: str | None = None,
    ) -> ReceiptVerification:
        """POST /v1/receipts/verify: the receipt's signature, and each cited version held in the ledger where the
        receipt says (or erased since); with `answer` (the response it came with), that its digest holds. The tenant
        defaults to the client's, else the receipt's."""
        return self._send(_verify_receipt(self._tenant(tenant), receipt, answer))

    def replay_receipt(
        self, receipt: Mapping[str, Any] | BaseModel, request: Mapping[str, Any], *, tenant: str | None = None
    ) -> ReceiptReplay:
        """POST /v1/receipts/replay: the answer re-derived as known at the receipt's positions, and whether it is the
        same; `request` holds the read's parameters as sent (facts: subject, as_of, known_at; recall: its body)."""
        return self._send(_replay_receipt(self._tenant(tenant), receipt, request))

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLedgerClient(_Base):
    """The async client: LedgerClient's methods as coroutines; an async context manager."""

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        tenant: str | None = None,
        timeout: float | None = None,
        settings: ClientSettings | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(_config(url, api_key, timeout, settings), tenant)
        self._owned = http is None
        self._http = http if http is not None else httpx.AsyncClient()

    async def _send(self, call: _Call) -> Any:
        try:
            response = await self._http.request(**self._request(call))
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from exc
        return _result(call, response)

    async def recall(
        self,
        query: str,
        *,
        tenant: str | None = None,
        subject: str | None = None,
        top_k: int | None = None,
        as_of: Time | None = None,
        mode: str | None = None,
        filters: Filters | None = None,
        after: str | None = None,
    ) -> RecallResponse:
        """POST /v1/recall: exact cues first, then keywords and vectors; each hit says which stage found it and why."""
        return await self._send(_recall(self._tenant(tenant), query, subject, top_k, as_of, mode, filters, after))

    async def context(
        self,
        subject: str,
        question: str | None = None,
        *,
        tenant: str | None = None,
        budget_tokens: int | None = None,
        include_history: bool | None = None,
        as_of: Time | None = None,
        top_k: int | None = None,
        mode: str | None = None,
        after: str | None = None,
    ) -> ContextResponse:
        """POST /v1/context: the prompt-ready block for a subject (and a question); `.text` is what to paste."""
        return await self._send(
            _context(self._tenant(tenant), subject, question, budget_tokens, include_history, as_of, top_k, mode, after)
        )

    async def facts(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        as_of: Time | None = None,
        known_at: Time | None = None,
        after: str | None = None,
    ) -> FactsResponse:
        """GET /v1/subjects/{subject}/facts: the facts holding at valid time `as_of` (now), as known at `known_at`."""
        return await self._send(_facts(self._tenant(tenant), subject, as_of, known_at, after))

    async def history(self, memory_id: str, *, tenant: str | None = None, after: str | None = None) -> HistoryResponse:
        """GET /v1/facts/{memory_id}/history: the fact's version chain, oldest first."""
        return await self._send(_history(self._tenant(tenant), memory_id, after))

    async def events(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        from_: Time | None = None,
        to: Time | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> EventsResponse:
        """GET /v1/subjects/{subject}/events: the audit replay, in ledger order, each event with its effect."""
        return await self._send(_events(self._tenant(tenant), subject, from_, to, limit, after))

    async def event_status(self, event_id: str, *, tenant: str | None = None) -> EventStatus:
        """GET /v1/events/{event_id}: what became of an event (pending, applied, duplicate, dead_lettered, unknown)."""
        return await self._send(_event_status(self._tenant(tenant), event_id))

    async def stats(self, *, tenant: str | None = None) -> StatsResponse:
        """GET /v1/stats: invariant counters (0 when healthy), lag per partition, dead letters, search orphans."""
        return await self._send(_stats(self._tenant(tenant)))

    async def health(self) -> HealthResponse:
        """GET /v1/health: every part's state; `status` is `degraded` (not an exception) while a store is down."""
        return await self._send(_HEALTH)

    async def consistency(self, *, tenant: str | None = None) -> ConsistencyResponse:
        """GET /v1/stats/consistency: the tenant's projections recounted against the ledger (a scan: 429 when
        another is running for the tenant)."""
        return await self._send(_consistency(self._tenant(tenant)))

    async def tenants(self) -> TenantsResponse:
        """GET /v1/tenants: the tenants this API key may use."""
        return await self._send(_TENANTS)

    async def subjects(
        self, prefix: str | None = None, *, tenant: str | None = None, limit: int | None = None
    ) -> SubjectsResponse:
        """GET /v1/subjects: the tenant's subjects starting with `prefix`, in code point order; `.more` when cut."""
        return await self._send(_subjects(self._tenant(tenant), prefix, limit))

    async def erasures(
        self, *, tenant: str | None = None, subject: str | None = None, limit: int | None = None
    ) -> ErasuresResponse:
        """GET /v1/erasures: the tenant's erasure records, newest first (of one subject with `subject`)."""
        return await self._send(_erasures(self._tenant(tenant), subject, limit))

    async def erasure(self, erasure_id: str, *, tenant: str | None = None) -> ErasureRecord:
        """GET /v1/erasures/{erasure_id}: one erasure record (a 404 until the worker has applied it)."""
        return await self._send(_erasure(self._tenant(tenant), erasure_id))

    async def event_schema(self) -> EventSchemaDocument:
        """GET /v1/schema/event: the event contract's JSON Schema (`.model_dump(by_alias=True)`: the document)."""
        return await self._send(_EVENT_SCHEMA)

    async def dead_letters(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> DeadLettersResponse:
        """GET /v1/dead-letters: the records the worker refused, in ledger order, each with its reason and state
        (`open`, `redriven`, `discarded`; `state=` keeps one); `.next` is the `after=` of the next page."""
        return await self._send(_dead_letters(self._tenant(tenant), state, after, limit))

    async def dead_letter(self, partition: int, offset: int, *, tenant: str | None = None) -> DeadLetterRecord:
        """GET /v1/dead-letters/{partition}/{offset}: one dead letter and its record's fields, as far as they decode."""
        return await self._send(_dead_letter(self._tenant(tenant), partition, offset))

    async def redrive_dead_letter(
        self, partition: int, offset: int, event: Mapping[str, Any], *, tenant: str | None = None
    ) -> DeadLetterAction:
        """POST /v1/dead-letters/redrive: publish the corrected `event` (its tenant defaults to the call's) linked to
        the letter, which reads `redriven` once the worker applied it; a letter resolved already is a 409
        `dead_letter_resolved`."""
        return await self._send(_redrive(self._tenant(tenant), partition, offset, event))

    async def discard_dead_letter(
        self, partition: int, offset: int, reason: str, *, tenant: str | None = None
    ) -> DeadLetterAction:
        """POST /v1/dead-letters/discard: close the letter without a correction (a `deadletter.discarded` event with
        the reason; nothing is deleted); it reads `discarded` once the worker applied it."""
        return await self._send(_discard(self._tenant(tenant), partition, offset, reason))

    async def verify_receipt(
        self,
        receipt: Mapping[str, Any] | BaseModel,
        *,
        answer: Mapping[str, Any] | BaseModel | None = None,
        tenant: str | None = None,
    ) -> ReceiptVerification:
        """POST /v1/receipts/verify: the receipt's signature, and each cited version held in the ledger where the
        receipt says (or erased since); with `answer` (the response it came with), that its digest holds. The tenant
        defaults to the client's, else the receipt's."""
        return await self._send(_verify_receipt(self._tenant(tenant), receipt, answer))

    async def replay_receipt(
        self, receipt: Mapping[str, Any] | BaseModel, request: Mapping[str, Any], *, tenant: str | None = None
    ) -> ReceiptReplay:
        """POST /v1/receipts/replay: the answer re-derived as known at the receipt's positions, and whether it is the
        same; `request` holds the read's parameters as sent (facts: subject, as_of, known_at; recall: its body)."""
        return await self._send(_replay_receipt(self._tenant(tenant), receipt, request))

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
