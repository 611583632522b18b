"""The client of the ledger's HTTP API: `LedgerClient` (sync) and `AsyncLedgerClient` (async), on httpx.

    from api.client import LedgerClient, LedgerError

    with LedgerClient("http://127.0.0.1:8000", api_key="dev-key", tenant="demo") as ledger:
        for hit in ledger.recall("P1 的后端服务地址是什么").hits:
            print(hit.value, hit.match.stage, hit.source)

It reads what the projections hold (publishing and erasing are the SDK's, producers.sdk). Results are the API's
own response models (api.schemas), which keep unknown fields, so a newer server never breaks an older client.
Validation is the server's; every failure raises `LedgerError`. Settings are the client's own (ClientSettings),
never the server's, so a client works where the server's would not load. docs/client.md.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload
from urllib.parse import quote

import anyio
import httpx
import orjson
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
P = ParamSpec("P")
Answer = TypeVar("Answer", bound=BaseModel)
Http = TypeVar("Http", httpx.Client, httpx.AsyncClient)
Client = TypeVar("Client", bound="_Base[Any]")


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
class _Call(Generic[Answer]):
    method: str
    path: str
    model: type[Answer]
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    answers: tuple[int, ...] = (200,)  # statuses whose body is `model` (health: 503 too)


class _Route(Generic[P, Answer]):
    """A route's method, written once as the call it asks for: `_sending_routes` gives each client class a method
    of its name, signature and docstring that sends that call (the async client's awaits it)."""

    def __init__(self, ask: Callable[Concatenate[Any, P], _Call[Answer]]) -> None:
        self.ask = ask

    # What a type checker (an IDE) sees on a client: the method returning the answer (awaitable on the async one).
    @overload
    def __get__(self, client: None, owner: type | None = None) -> _Route[P, Answer]: ...
    @overload
    def __get__(self, client: AsyncLedgerClient, owner: type | None = None) -> Callable[P, Awaitable[Answer]]: ...
    @overload
    def __get__(self, client: LedgerClient, owner: type | None = None) -> Callable[P, Answer]: ...
    def __get__(self, client: Any, owner: type | None = None) -> Any:
        return self if client is None else MethodType(self.ask, client)  # a client's own method shadows this

    def method(self, asynchronous: bool) -> Callable[..., Any]:
        ask, signature = self.ask, inspect.signature(self.ask)
        # the text parameters, and whether each is required (annotations are text here: postponed)
        kinds = {n: p.annotation for n, p in signature.parameters.items()}
        texts = {n: kind == "str" for n, kind in kinds.items() if kind in ("str", "str | None")}

        def call(client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call[Any]:
            for name, value in signature.bind(client, *args, **kwargs).arguments.items():
                if name in texts and not isinstance(value, str) and (value is not None or texts[name]):  # no text
                    raise _local(name, f"must be text, not {type(value).__name__}", "wrong_type")
                # a lone surrogate has no UTF-8 bytes for a URL or a body to carry: refused as the API refuses one
                if _lone_surrogate_in(value):
                    raise _local(name, "contains a lone surrogate, which is not valid Unicode text", "unstorable_text")
                if _non_finite_in(value):  # JSON has no NaN nor infinity: httpx raised ValueError
                    raise _local(name, "holds a number that is not finite (NaN or infinity), which JSON has not")
            try:
                return ask(client, *args, **kwargs)
            except (TypeError, ValueError, AttributeError) as exc:  # an argument of a shape the call cannot read
                raise _local(None, f"the call cannot be made of these arguments: {exc}") from None

        def sent(client: Any, /, *args: Any, **kwargs: Any) -> Any:
            return client._send(call(client, args, kwargs))

        async def awaited(client: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await client._send(call(client, args, kwargs))

        method: Any = functools.update_wrapper(awaited if asynchronous else sent, ask)
        # annotations are text here (postponed): the method answers the X of the call's `_Call[X]`
        answer = ask.__annotations__["return"].removeprefix("_Call[").removesuffix("]")
        method.__annotations__ = {**ask.__annotations__, "return": answer}
        method.__signature__ = inspect.signature(ask).replace(return_annotation=answer)
        return method


def path_segment(text: str, safe: str = "") -> str:
    """`text` as one path segment: every reserved character but `safe` escaped (a subject's `/` too by default; the
    API reads `%2F` as `/`), and `.` or `..` spelled `%2E`: a client (httpx, curl, a browser) would resolve those as
    the path's dot segments and ask for another path."""
    return "%2E" * len(text) if text in (".", "..") else quote(text, safe=safe)


def _time(value: Time) -> str:
    """An aware datetime in the API's spelling; anything else as it is, for the server to judge (and name)."""
    if isinstance(value, datetime):
        return rfc3339(value) if value.utcoffset() is not None else value.isoformat()
    return str(value)


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _times(**values: Time | None) -> dict[str, str]:
    return {k: _time(v) for k, v in values.items() if v is not None}


def _json_of(value: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """A receipt or an answer as the server sent it: a response model of this client gives back its JSON (every
    field it came with), so the signature and the digests hold over it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return dict(value)


# -- what each answer means: one reading, for either client --------------------------------------------------------


def _result(call: _Call[Answer], response: httpx.Response, content: bytes) -> Answer:
    """The answer's model from its `content` (the body as read), else the LedgerError it is."""
    if response.status_code in call.answers:
        try:
            return call.model.model_validate_json(content)
        except ValidationError as exc:
            if response.status_code == 200:  # the server answered, but not with the shape it documents
                item = ErrorItem(code="bad_response", field=None, message=f"not a {call.model.__name__}: {exc}"[:500])
                raise LedgerError(200, [item]) from exc
            # a 503 that is not a health body (a proxy's page): an error like any other
    raise _error(response, content)


def _error(response: httpx.Response, content: bytes) -> LedgerError:
    try:
        return LedgerError(response.status_code, ErrorBody.model_validate_json(content).detail)
    except ValidationError:  # not the API's error shape (a proxy's page, a server of another kind)
        text = content.decode(response.encoding or "utf-8", "replace").strip()[:300] or response.reason_phrase
        return LedgerError(
            response.status_code, [ErrorItem(code=f"http_{response.status_code}", field=None, message=text)]
        )


def _closed(http: httpx.Client | httpx.AsyncClient) -> None:
    """A closed client's call is a LedgerError like every other failure (httpx raises a RuntimeError)."""
    if http.is_closed:
        message = "this client is closed (a with block closes it at its end): open a new one"
        raise LedgerError(None, [ErrorItem(code="client_closed", field=None, message=message)])


_HEADER_TEXT = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")  # what an API key can be sent as


def _non_finite_in(value: Any) -> bool:
    """Whether a call's argument holds a float that is not finite anywhere (a datetime or a model is read by the
    call itself)."""
    try:
        json.dumps(value, allow_nan=False, default=str)
    except ValueError:
        return True
    return False


def _local(field: str | None, message: str, code: str = "invalid_value") -> LedgerError:
    """A call this client refuses before sending it: the API's error shape, no status (nothing was asked)."""
    return LedgerError(None, [ErrorItem(code=code, field=field, message=message)])


def _lone_surrogate_in(value: Any) -> bool:
    """Whether a call's argument holds a lone surrogate anywhere (orjson writes none; what it cannot write otherwise,
    a model or a time, is judged by the call itself)."""
    if isinstance(value, str):
        return not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value)
    try:
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)  # a number key is written as text: its value judged too
    except orjson.JSONEncodeError as exc:
        return "surrogates" in str(exc)
    return False


def _unreachable(url: str, exc: httpx.TransportError) -> LedgerError:
    code = "api_timeout" if isinstance(exc, httpx.TimeoutException) else "api_unreachable"
    message = f"api: no answer from {url} ({type(exc).__name__}: {exc})"[:500]
    return LedgerError(None, [ErrorItem(code=code, field=None, message=message)])


class _Base(Generic[Http]):
    """Either client: its configuration, and every route's method once (each client sends the calls its way)."""

    _new_http: Callable[[], Http]

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        tenant: str | None = None,
        timeout: float | None = None,
        settings: ClientSettings | None = None,
        http: Http | None = None,
    ) -> None:
        if url is None or api_key is None or timeout is None:
            s = settings or ClientSettings()
            url = url or s.url
            api_key = api_key if api_key is not None else s.api_key
            timeout = timeout if timeout is not None else s.timeout_s
        if isinstance(timeout, bool) or not (isinstance(timeout, int | float) and 0 < timeout < math.inf):
            raise _local("timeout", f"{timeout!r} is no time to wait: a number of seconds above 0")
        for name, text in (("url", url), ("api_key", api_key), ("tenant", tenant)):
            if text is not None and not isinstance(text, str):
                raise _local(name, f"must be text, not {type(text).__name__}", "wrong_type")
            if _lone_surrogate_in(text):
                raise _local(name, "contains a lone surrogate, which is not valid Unicode text", "unstorable_text")
        if api_key and not _HEADER_TEXT.fullmatch(api_key):  # httpx would refuse it at each request, as unreachable
            raise _local("api_key", "holds a character no HTTP header carries (a line break, a control, non-ASCII)")
        self.url, self.tenant, self.timeout = url.rstrip("/"), tenant, timeout
        self._headers = {"X-API-Key": api_key} if api_key else {}
        self._owned = http is None
        self._http: Http = http if http is not None else self._new_http()

    def _tenant(self, tenant: str | None) -> str | None:
        return tenant if tenant is not None else self.tenant

    def _request(self, call: _Call[Any]) -> dict[str, Any]:
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

    @_Route
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
    ) -> _Call[RecallResponse]:
        """POST /v1/recall: exact cues first, then keywords and vectors; each hit says which stage found it and why."""
        body = _given(
            tenant=self._tenant(tenant),
            query=query,
            subject=subject,
            top_k=top_k,
            mode=mode,
            after=after,
            **_times(as_of=as_of),
        )
        if filters is not None:
            body["filters"] = {k: (v if isinstance(v, str) else list(v)) for k, v in filters.items()}
        return _Call("POST", "/v1/recall", RecallResponse, body=body)

    @_Route
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
    ) -> _Call[ContextResponse]:
        """POST /v1/context: the prompt-ready block for a subject (and a question); `.text` is what to paste."""
        body = _given(
            tenant=self._tenant(tenant),
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

    @_Route
    def facts(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        as_of: Time | None = None,
        known_at: Time | None = None,
        offset: int | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> _Call[FactsResponse]:
        """GET /v1/subjects/{subject}/facts: the facts holding at valid time `as_of` (now), as known at `known_at`;
        a page of them with `offset`/`limit` (the answer's `page`)."""
        params = _given(
            tenant=self._tenant(tenant),
            offset=offset,
            limit=limit,
            after=after,
            **_times(as_of=as_of, known_at=known_at),
        )
        return _Call("GET", f"/v1/subjects/{path_segment(subject)}/facts", FactsResponse, params=params)

    @_Route
    def history(
        self,
        memory_id: str,
        *,
        tenant: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> _Call[HistoryResponse]:
        """GET /v1/facts/{memory_id}/history: the fact's version chain, oldest first (a page with `offset`/`limit`)."""
        params = _given(tenant=self._tenant(tenant), offset=offset, limit=limit, after=after)
        return _Call("GET", f"/v1/facts/{path_segment(memory_id)}/history", HistoryResponse, params=params)

    @_Route
    def events(
        self,
        subject: str,
        *,
        tenant: str | None = None,
        from_: Time | None = None,
        to: Time | None = None,
        limit: int | None = None,
        after: str | None = None,
        cursor: str | None = None,
    ) -> _Call[EventsResponse]:
        """GET /v1/subjects/{subject}/events: the audit replay, in ledger order, each event with its effect; `cursor`:
        an answer's `next_cursor`, for the events after it."""
        params = {
            **_given(tenant=self._tenant(tenant), limit=limit, after=after, cursor=cursor),
            **_times(**{"from": from_, "to": to}),
        }
        return _Call("GET", f"/v1/subjects/{path_segment(subject)}/events", EventsResponse, params=params)

    @_Route
    def event_status(self, event_id: str, *, tenant: str | None = None) -> _Call[EventStatus]:
        """GET /v1/events/{event_id}: what became of an event (pending, applied, duplicate, dead_lettered, unknown)."""
        params = _given(tenant=self._tenant(tenant))
        return _Call("GET", f"/v1/events/{path_segment(event_id)}", EventStatus, params=params)

    @_Route
    def stats(self, *, tenant: str | None = None) -> _Call[StatsResponse]:
        """GET /v1/stats: invariant counters (0 when healthy), lag per partition, dead letters, search orphans."""
        return _Call("GET", "/v1/stats", StatsResponse, params=_given(tenant=self._tenant(tenant)))

    @_Route
    def health(self) -> _Call[HealthResponse]:
        """GET /v1/health: every part's state; `status` is `degraded` (not an exception) while a store is down."""
        return _Call("GET", "/v1/health", HealthResponse, answers=(200, 503))

    @_Route
    def consistency(self, *, tenant: str | None = None) -> _Call[ConsistencyResponse]:
        """GET /v1/stats/consistency: the tenant's projections recounted against the ledger (a scan: 429 when
        another is running for the tenant)."""
        return _Call("GET", "/v1/stats/consistency", ConsistencyResponse, params=_given(tenant=self._tenant(tenant)))

    @_Route
    def tenants(self) -> _Call[TenantsResponse]:
        """GET /v1/tenants: the tenants this API key may use."""
        return _Call("GET", "/v1/tenants", TenantsResponse)

    @_Route
    def subjects(
        self,
        prefix: str | None = None,
        *,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _Call[SubjectsResponse]:
        """GET /v1/subjects: the tenant's subjects starting with `prefix`, in code point order; `.more` when cut,
        and `cursor`: an answer's `next_cursor`, for the subjects after it."""
        params = _given(tenant=self._tenant(tenant), prefix=prefix, limit=limit, cursor=cursor)
        return _Call("GET", "/v1/subjects", SubjectsResponse, params=params)

    @_Route
    def erasures(
        self,
        *,
        tenant: str | None = None,
        subject: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _Call[ErasuresResponse]:
        """GET /v1/erasures: the tenant's erasure records, newest first (of one subject with `subject`); `cursor`: an
        answer's `next_cursor`, for the records after it."""
        params = _given(tenant=self._tenant(tenant), subject=subject, limit=limit, cursor=cursor)
        return _Call("GET", "/v1/erasures", ErasuresResponse, params=params)

    @_Route
    def erasure(self, erasure_id: str, *, tenant: str | None = None) -> _Call[ErasureRecord]:
        """GET /v1/erasures/{erasure_id}: one erasure record (a 404 until the worker has applied it)."""
        path = f"/v1/erasures/{path_segment(erasure_id)}"
        return _Call("GET", path, ErasureRecord, params=_given(tenant=self._tenant(tenant)))

    @_Route
    def event_schema(self) -> _Call[EventSchemaDocument]:
        """GET /v1/schema/event: the event contract's JSON Schema (`.model_dump(by_alias=True)`: the document)."""
        return _Call("GET", "/v1/schema/event", EventSchemaDocument)

    @_Route
    def dead_letters(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> _Call[DeadLettersResponse]:
        """GET /v1/dead-letters: the records the worker refused, in ledger order, each with its reason and state
        (`open`, `redriven`, `discarded`; `state=` keeps one); `.next` is the `after=` of the next page."""
        params = _given(tenant=self._tenant(tenant), state=state, after=after, limit=limit)
        return _Call("GET", "/v1/dead-letters", DeadLettersResponse, params=params)

    @_Route
    def dead_letter(self, partition: int, offset: int, *, tenant: str | None = None) -> _Call[DeadLetterRecord]:
        """GET /v1/dead-letters/{partition}/{offset}: one dead letter and its record's fields, as far as they decode."""
        path = f"/v1/dead-letters/{path_segment(str(partition))}/{path_segment(str(offset))}"
        return _Call("GET", path, DeadLetterRecord, params=_given(tenant=self._tenant(tenant)))

    @_Route
    def redrive_dead_letter(
        self, partition: int, offset: int, event: Mapping[str, Any], *, tenant: str | None = None
    ) -> _Call[DeadLetterAction]:
        """POST /v1/dead-letters/redrive: publish the corrected `event` (its tenant defaults to the call's) linked to
        the letter, which reads `redriven` once the worker applied it; a letter resolved already is a 409
        `dead_letter_resolved`."""
        body = _given(tenant=self._tenant(tenant), partition=partition, offset=offset, event=dict(event))
        return _Call("POST", "/v1/dead-letters/redrive", DeadLetterAction, body=body)

    @_Route
    def discard_dead_letter(
        self, partition: int, offset: int, reason: str, *, tenant: str | None = None
    ) -> _Call[DeadLetterAction]:
        """POST /v1/dead-letters/discard: close the letter without a correction (a `deadletter.discarded` event with
        the reason; nothing is deleted); it reads `discarded` once the worker applied it."""
        body = _given(tenant=self._tenant(tenant), partition=partition, offset=offset, reason=reason)
        return _Call("POST", "/v1/dead-letters/discard", DeadLetterAction, body=body)

    @_Route
    def verify_receipt(
        self,
        receipt: Mapping[str, Any] | BaseModel,
        *,
        answer: Mapping[str, Any] | BaseModel | None = None,
        tenant: str | None = None,
    ) -> _Call[ReceiptVerification]:
        """POST /v1/receipts/verify: the receipt's signature, and each cited version held in the ledger where the
        receipt says (or erased since); with `answer` (the response it came with), that its digest holds. The tenant
        defaults to the client's, else the receipt's."""
        sent = _json_of(receipt)
        body = _given(tenant=self._tenant(tenant) or sent.get("tenant"), receipt=sent)
        if answer is not None:
            body["answer"] = _json_of(answer)  # its receipt, consistency and trace are no part of its digest
        return _Call("POST", "/v1/receipts/verify", ReceiptVerification, body=body)

    @_Route
    def replay_receipt(
        self, receipt: Mapping[str, Any] | BaseModel, request: Mapping[str, Any], *, tenant: str | None = None
    ) -> _Call[ReceiptReplay]:
        """POST /v1/receipts/replay: the answer re-derived as known at the receipt's positions, and whether it is the
        same; `request` holds the read's parameters as sent (facts: subject, as_of, known_at; recall: its body)."""
        sent = _json_of(receipt)
        body = _given(tenant=self._tenant(tenant) or sent.get("tenant"), receipt=sent, request=dict(request))
        return _Call("POST", "/v1/receipts/replay", ReceiptReplay, body=body)


def _sending_routes(cls: type[Client]) -> type[Client]:
    """Each of _Base's routes as a method of `cls` (its own: `vars(cls)` lists it) that sends the call with
    `cls._send`, awaited where that is a coroutine function."""
    asynchronous = inspect.iscoroutinefunction(cls._send)  # type: ignore[attr-defined]
    for name, route in vars(_Base).items():
        if isinstance(route, _Route):
            method = route.method(asynchronous)
            method.__qualname__ = f"{cls.__name__}.{name}"
            setattr(cls, name, method)
    return cls


@_sending_routes
class LedgerClient(_Base[httpx.Client]):
    """The sync client; a context manager (closes its httpx client, unless it was lent one)."""

    _new_http = httpx.Client

    def _send(self, call: _Call[Answer]) -> Answer:
        _closed(self._http)
        deadline = time.monotonic() + self.timeout  # httpx bounds each read, not the answer: a trickle would not end
        try:
            with self._http.stream(**self._request(call)) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout(f"the answer took longer than the client's timeout ({self.timeout} s)")
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from exc
        except httpx.InvalidURL as exc:  # a path or query longer than a URL may be
            raise _local("url", f"the request cannot be sent: {exc}") from None
        return _result(call, response, b"".join(chunks))

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@_sending_routes
class AsyncLedgerClient(_Base[httpx.AsyncClient]):
    """The async client: LedgerClient's methods as coroutines; an async context manager."""

    _new_http = httpx.AsyncClient

    async def _send(self, call: _Call[Answer]) -> Answer:
        _closed(self._http)
        try:
            with anyio.fail_after(self.timeout):  # the whole answer (httpx bounds each read: a trickle would not end)
                response = await self._http.request(**self._request(call))
        except TimeoutError as exc:
            message = f"the answer took longer than the client's timeout ({self.timeout} s)"
            raise _unreachable(self.url, httpx.ReadTimeout(message)) from exc
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from exc
        except httpx.InvalidURL as exc:  # a path or query longer than a URL may be
            raise _local("url", f"the request cannot be sent: {exc}") from None
        return _result(call, response, response.content)

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
