"""Error responses: one shape for every status, with a stable code and the field at fault.

    {"detail": [{"code": "missing_field", "field": "events.0.tenant", "message": "Field required"}]}

`code` is one of `ERROR_CODES` (the README's table is tested against it); `message` and `field` are bounded
whatever the caller sent. The handlers normalize every failure (HTTPException, validation, store failures as a
prompt 503 naming the store, anything unexpected as 500), so a client needs one parser for every error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import kafka.errors as kafka_errors
import psycopg
from elasticsearch import ApiError as EsApiError
from elasticsearch import SerializationError
from elasticsearch import TransportError as EsTransportError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.schemas import ErrorBody, ErrorItem  # the models of the shapes (projections.shapes), as all bodies'
from producers.contract import MAX_ERROR_FIELD_CHARS, MAX_ERROR_MESSAGE_CHARS, bounded, error_code
from producers.sdk import PublishError
from projections import shapes

__all__ = [
    "ERROR_CODES",
    "ERROR_RESPONSES",
    "MAX_FIELD_CHARS",
    "MAX_MESSAGE_CHARS",
    "ApiError",
    "ErrorBody",
    "ErrorItem",
    "error_body",
    "install_error_handlers",
    "store_failure",
    "store_unavailable",
    "validation_items",
]

log = logging.getLogger(__name__)


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# declared on every route (api.routes.api_router), so the OpenAPI spec documents the one shape
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _doc("no API key, or an unknown one (field: the header it came in, X-API-Key or Authorization)"),
    403: _doc("the API key may not use the tenant named (field names where)"),
    404: _doc("no such resource for this tenant"),
    405: _doc("the path exists, the method does not"),
    422: _doc("the request is invalid; each item names a field"),
    500: _doc("an unexpected server error (a bug: it is logged)"),
    429: _doc("this tenant's previous expensive request (a consistency scan) still runs: retry after Retry-After s"),
    503: _doc(
        "a store (postgres, elasticsearch or kafka) failed, the message names it; or not_yet: the read's `after` "
        "write is not readable yet; retrying later is safe"
    ),
}

# The one vocabulary: every code a route or an MCP tool answers, and when. README.md lists the same table
# (tests/test_error_vocabulary.py compares them and checks that no route or tool answers another code).
ERROR_CODES: dict[str, str] = {
    "missing_field": "a required field is missing (or null where a value is required)",
    "unknown_field": (
        "a field the request or event does not have; a query parameter the route does not take (`asof` for `as_of`; "
        "a route that reads no input, such as `/v1/health`, `/v1/tenants` or `/v1/schema/event`, takes any: a "
        "probe's cache-buster changes nothing)"
    ),
    "wrong_type": "a value of the wrong JSON type (text where a number goes, a number where a list goes)",
    "invalid_value": (
        "a value the field does not allow: out of range, too long or short, blank, a rule between fields; a line feed "
        "(`%0A`) in the path where no text parameter takes it (after a route's last word, in a number)"
    ),
    "unknown_value": "not one of the field's choices (`kind`, `format`, `mode`, `source.type`)",
    "unknown_type": "an event `type` that is not one of the contract's (`EventType`)",
    "invalid_time": (
        "not a strict RFC 3339 time (seconds and an offset; never a Unix number), or an event's `valid_to` not after "
        "its `valid_from`"
    ),
    "invalid_range": "`to` before `from`",
    "unstorable_text": (
        "U+0000 or a lone surrogate in a text, which PostgreSQL cannot store (in a time or a token, its own code "
        "refuses it); in a path or query, a percent-escape that is not UTF-8"
    ),
    "number_out_of_range": (
        "an integer outside signed 64 bits, NaN or an infinity, -0.0 in `value` (PostgreSQL's jsonb keeps 0; an "
        "`importance` or `confidence` of -0.0 is 0), a non-zero literal too small for a double (`1e-400` reads as 0)"
    ),
    "too_deep": "`value` nested deeper than 32 levels",
    "too_large": (
        "an event over 262,144 bytes encoded, or (413) a request body over the server's limit "
        "(`LEDGER_API_MAX_BODY_BYTES`)"
    ),
    "not_an_object": "an event, or an MCP tool's arguments, that is not a JSON object",
    "unsupported_schema": "a `schema_version` newer than this contract",
    "clock_skew": "`observed_at` too far in the future",
    "event_id_conflict": "the `(tenant, event_id)` already names an event with other content",
    "dead_letter_resolved": "409: the dead letter was re-driven or discarded already (the message names the event)",
    "bad_json": "the body is not JSON (the message gives line, column and character)",
    "empty": "an empty ledger record",
    "wrong_content_type": "a body sent without `Content-Type: application/json`",
    "budget_too_small": "`budget_tokens` cannot hold the context block's frame (a guard: every budget from 64 does)",
    "unauthorized": "no API key, or an unknown one (field: the header used)",
    "forbidden_tenant": "the API key may not use the tenant named",
    "not_found": "no such resource for this tenant, or no such route",
    "method_not_allowed": "the path exists, the method does not",
    "encryption_unavailable": "this API has no key-encryption key configured",
    "store_unavailable": "PostgreSQL, Elasticsearch or Kafka failed (the message starts with its name): retry later",
    "publish_unavailable": "the broker, or the store of its data key, could not be reached for this event",
    "publish_timeout": "the broker did not confirm this event in time",
    "publish_refused": "the broker, or the key endpoint asked for its data key, refused this event",
    "publish_closed": "the producer was closing",
    "bad_request": "a request the server could not read",
    "forbidden": "not allowed",
    "unsupported_media_type": "a body of a type the route does not take, or sent with a Content-Encoding",
    "invalid": "the request is invalid",
    "internal_error": "an unexpected server error (a bug: it is logged)",
    "unavailable": "the service is not available",
    "busy": "429: the tenant's previous expensive request still runs (or the server's share is taken): `Retry-After`",
    "not_yet": "503: the read's `after` write is not readable yet (the message gives the positions reached): retry",
    "error": "an error of an HTTP status without a code of its own",
}
# the contract's bounds (a message never echoes a caller's megabyte, nor lists every tenant of a key); a field
# may also carry the `events.N.` the door puts before an event's own field
MAX_MESSAGE_CHARS, MAX_FIELD_CHARS = MAX_ERROR_MESSAGE_CHARS, MAX_ERROR_FIELD_CHARS + 16

_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """An error response: status plus one item (code, field, message); `headers` go on the response."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers
        super().__init__(f"{status} {code}: {message}" + (f" (field: {field})" if field else ""))

    def item(self) -> shapes.ErrorItem:
        return {"code": self.code, "field": self.field, "message": self.message}


def error_body(*items: dict[str, Any]) -> shapes.ErrorBody:
    """`{"detail": [...]}` with every item having exactly code, field and message (both bounded)."""
    return {
        "detail": [
            {
                "code": str(i.get("code") or "invalid"),
                "field": None if i.get("field") is None else bounded(str(i["field"]), MAX_FIELD_CHARS),
                "message": bounded(str(i.get("message") or ""), MAX_MESSAGE_CHARS),
            }
            for i in items
        ]
    }


def _json(status: int, *items: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(*items), status_code=status, headers=headers)


_STORE_ROLE = {
    "postgres": "database",
    "elasticsearch": "search index",
    "kafka": "broker",
    "api": "key endpoint",  # a producer's data keys from the API (LEDGER_KEY_ENDPOINT)
    "keys": "key store",
}


def store_unavailable(store: str, exc: BaseException | str) -> ApiError:
    """503 naming the store first (`elasticsearch: search index unavailable (...)`), never a stack trace."""
    reason = exc if isinstance(exc, str) else _named(exc)
    role = _STORE_ROLE.get(store, "store")
    return ApiError(503, "store_unavailable", f"{store}: {role} unavailable ({reason})"[:500])


def _named(exc: BaseException) -> str:
    """`Class: message`, once: kafka-python's errors already begin their text with their class."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name


# -- request validation --------------------------------------------------------------------------


# the labels pydantic puts in an error's path for the member of a union it tried (`tags.str`, `tags.list[str].0`):
# no field of a request, so the path names the field as the caller wrote it (`tags`, `tags.0`)
_UNION_MEMBERS = frozenset(
    (
        "str bytes int float bool none any list dict tuple set frozenset literal nullable union tagged-union chain "
        "constrained-str constrained-int constrained-float constrained-bytes function-after function-before "
        "function-wrap function-plain json-or-python lax-or-strict is-instance datetime date time timedelta"
    ).split()
)


_LOCATIONS = ("body", "query", "path", "header", "cookie")


def _union_member(part: Any) -> bool:
    return isinstance(part, str) and part.split("[", 1)[0] in _UNION_MEMBERS


def _field(loc: tuple) -> str | None:
    # a query, path, header or cookie parameter's name is never a union member's tag, even when it reads like one
    # (a query parameter `literal`); nor is an MCP argument's (a path of one part: a tag is followed by what it
    # tried); a body may itself be a union, so its first part may be a tag
    if len(loc) == 1 and isinstance(loc[0], str) and loc[0] not in _LOCATIONS:
        return loc[0]
    kept = 2 if loc and loc[0] in _LOCATIONS[1:] else 0
    parts = [str(p) for i, p in enumerate(loc) if i < kept or not _union_member(p)]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:] or parts
    return ".".join(parts) or None


def _json_position(err: dict[str, Any], doc: Any) -> dict[str, Any]:
    """A body that is not JSON: field `body`, the message names line, column and character."""
    loc = tuple(err.get("loc", ()))
    pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    reason = (err.get("ctx") or {}).get("error") or "not valid JSON"
    if pos is None:
        where = ""
    elif isinstance(doc, str):
        decoded = json.JSONDecodeError(reason, doc, pos)
        where = f" at line {decoded.lineno}, column {decoded.colno} (char {pos})"
    else:
        where = f" at char {pos}"
    return {"code": "bad_json", "field": "body", "message": f"the body is not valid JSON{where}: {reason}"}


def _not_sent_as_json(err: dict[str, Any], content_type: str | None) -> dict[str, Any] | None:
    """The item for a body FastAPI did not parse because the request did not say it is JSON (else None): FastAPI
    only reads a body as JSON under a JSON Content-Type, and pydantic would blame the body's type instead."""
    if content_type is None or tuple(err.get("loc", ())) != ("body",) or err.get("type") == "missing":
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    got = f"Content-Type {media!r}" if media else "no Content-Type"
    message = f"send the body as JSON with Content-Type: application/json (this request had {got})"
    return {"code": "wrong_content_type", "field": "body", "message": message}


def validation_items(errors: Iterable[Any], body: Any = None, content_type: str | None = None) -> list[dict[str, Any]]:
    """pydantic's errors as error items (code = `error_code(type)` unless the type is one of ours already, field =
    the dotted path, `body`/`query` left out). `content_type`: the request's (`""` if it sent none), for a body.

    The one mapping for a request FastAPI validated and for an MCP tool's arguments (api.mcp)."""
    items = []
    for err in errors:
        if err.get("type") == "json_invalid":
            items.append(_json_position(err, body))
            continue
        not_json = _not_sent_as_json(err, content_type)
        if not_json is not None:
            items.append(not_json)
            continue
        message = err.get("msg", "") or "invalid"
        etype = str(err.get("type") or "invalid")
        message = _in_characters(etype, err, message)
        items.append(
            {
                "code": etype if etype in ERROR_CODES else error_code(etype),
                "field": _field(tuple(err.get("loc", ()))),
                "message": message.removeprefix("Value error, "),
            }
        )
    return items


def _in_characters(etype: str, err: dict[str, Any], message: str) -> str:
    """A text's length limit in characters: pydantic counts `items` when the limit is checked after a validator
    (`Storable` text with a length in its Query, Path or Field)."""
    ctx = err.get("ctx") or {}
    if etype not in ("too_long", "too_short") or not isinstance(err.get("input"), str):
        return message
    bound, word = ("max_length", "most") if etype == "too_long" else ("min_length", "least")
    return f"String should have at {word} {ctx.get(bound)} characters, not {len(err['input'])}"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _json(422, *validation_items(exc.errors(), exc.body, request.headers.get("content-type", "")))


# -- raised errors --------------------------------------------------------------------------------


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return _json(exc.status, exc.item(), headers=exc.headers)


def _http_items(status: int, detail: Any) -> list[dict[str, Any]]:
    default = _STATUS_CODES.get(status, "error")
    if isinstance(detail, dict):
        detail = [detail]
    if isinstance(detail, list) and detail and all(isinstance(d, dict) for d in detail):
        return [
            {"code": d.get("code") or default, "field": d.get("field"), "message": d.get("message")} for d in detail
        ]
    return [{"code": default, "field": None, "message": str(detail) if detail is not None else default}]


def _unreadable(cause: BaseException) -> str:
    """Why a body is not readable JSON at all, and where: the byte that is not UTF-8, or the nesting."""
    if isinstance(cause, UnicodeDecodeError):
        at = cause.start  # where the decoder the parser chose failed; a body is UTF-8 (RFC 8259): where that fails
        try:
            bytes(cause.object).decode("utf-8")
        except UnicodeDecodeError as exc:
            at = exc.start
        return f"the body is not readable JSON: it is not UTF-8 text (byte {at}: {bytes(cause.object[at : at + 1])!r})"
    if isinstance(cause, RecursionError):
        return "the body is not readable JSON: it is nested deeper than the JSON parser reads"
    return f"the body is not readable JSON ({type(cause).__name__})"


def _without_final_slash(request: Request) -> str | None:
    """The request's path without its final '/', if a route takes that path and method: Starlette does not redirect
    when another route's path parameter swallows the slash (a 405), and a 404 naming the path says why."""
    path = request.url.path
    if len(path) < 2 or not path.endswith("/"):
        return None
    bare = path.rstrip("/")
    scope = {**request.scope, "path": bare}
    routes = getattr(request.app, "routes", [])
    return bare if any(route.matches(scope)[0] == Match.FULL for route in routes) else None


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's 404/405 and any HTTPException still raised somewhere, in the one shape."""
    if exc.status_code == 400 and exc.__cause__ is not None and exc.detail == _FASTAPI_BODY_ERROR:
        # FastAPI could not read the body at all (not UTF-8, nested past the JSON parser's recursion limit)
        return _json(422, {"code": "bad_json", "field": "body", "message": _unreadable(exc.__cause__)})
    if exc.status_code in (404, 405) and (bare := _without_final_slash(request)) is not None:
        message = f"no route ends with '/': ask {request.method} {bare}"
        return _json(404, {"code": "not_found", "field": None, "message": message})
    headers = getattr(exc, "headers", None)
    return _json(exc.status_code, *_http_items(exc.status_code, exc.detail), headers=headers)


# -- store failures -------------------------------------------------------------------------------


def store_failure(exc: BaseException) -> ApiError | None:
    """The 503 naming the store for a PostgreSQL, Elasticsearch or Kafka failure; None for anything else
    (an Elasticsearch 4xx or a body it could not (de)serialize is our bug, not an outage).

    The one classification for the HTTP handlers below and for the MCP tools (api.mcp)."""
    if isinstance(exc, psycopg.errors.UndefinedTable):  # the worker has not created this projection (yet)
        return store_unavailable("postgres", "the projection's tables do not exist yet")
    if isinstance(exc, psycopg.OperationalError):  # includes psycopg_pool.PoolTimeout
        return store_unavailable("postgres", exc)
    if isinstance(exc, EsApiError):
        return store_unavailable("elasticsearch", exc) if exc.status_code >= 500 or exc.status_code == 429 else None
    if isinstance(exc, SerializationError):
        return None
    if isinstance(exc, EsTransportError):  # connection errors and timeouts
        return store_unavailable("elasticsearch", exc)
    if isinstance(exc, PublishError):
        return store_unavailable(exc.store, exc.reason)
    if isinstance(exc, kafka_errors.KafkaError):
        return store_unavailable("kafka", exc)
    return None


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    error = store_failure(exc)
    resources = getattr(request.app.state, "resources", None)
    if isinstance(exc, psycopg.OperationalError) and resources is not None:
        resources.postgres_failed()  # the other idle connections may have been ended with this one
    if error is None:
        return await _internal_error(request, exc)
    log.warning("%s", error.message)
    return _json(503, error.item())


_postgres_down = _elasticsearch_down = _kafka_down = _store_down


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: logged with its traceback, answered in the same shape (no internals leaked)."""
    log.error("unhandled %s", type(exc).__name__, exc_info=exc)
    item = {"code": "internal_error", "field": None, "message": f"internal error ({type(exc).__name__}); it is logged"}
    return _json(500, item)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(psycopg.OperationalError, _postgres_down)  # includes psycopg_pool.PoolTimeout
    app.add_exception_handler(psycopg.errors.UndefinedTable, _postgres_down)
    app.add_exception_handler(EsTransportError, _elasticsearch_down)  # connection errors and timeouts
    app.add_exception_handler(EsApiError, _elasticsearch_down)
    app.add_exception_handler(kafka_errors.KafkaError, _kafka_down)
    app.add_exception_handler(PublishError, _kafka_down)
    app.add_exception_handler(Exception, _internal_error)
