"""Error responses: one shape for every status, with a stable code and the field at fault.

    {"detail": [{"code": "missing", "field": "events.0.tenant", "message": "Field required"}]}

`field` is a dotted path into the request (`events.2.tenant`, `as_of`, `subject`), the header
name for authentication (`X-API-Key`), `body` for a body that is not JSON, and null when no
single field is at fault (a store that is down, an unknown route). Routes raise `ApiError`;
the handlers below also normalize FastAPI/Starlette `HTTPException` (string or dict detail),
request validation, store failures (503 naming the store) and anything unexpected (500), so a
client needs one parser for every error.

Store failures: a PostgreSQL, Elasticsearch or Kafka failure in any route is a prompt 503
`store_unavailable` whose message starts with the store's name (`postgres: ...`): retrying later
is safe. The waits are bounded by settings (`pg_pool_timeout_s`, `api_kafka_timeout_s`, the ES
request timeout), so no request hangs on a dead store.
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

from api.schemas import ErrorBody, ErrorItem  # the shape is defined with the other bodies (light: the read client)
from producers.sdk import PublishError

__all__ = [
    "ERROR_RESPONSES",
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
    401: _doc("no API key, or an unknown one (field X-API-Key)"),
    403: _doc("the API key may not use the tenant named (field names where)"),
    404: _doc("no such resource for this tenant"),
    405: _doc("the path exists, the method does not"),
    422: _doc("the request is invalid; each item names a field"),
    500: _doc("an unexpected server error (a bug: it is logged)"),
    503: _doc("a store (postgres, elasticsearch or kafka) failed; the message names it; retrying later is safe"),
}

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

    def item(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message}


def error_body(*items: dict[str, Any]) -> dict[str, Any]:
    """`{"detail": [...]}` with every item having exactly code, field and message."""
    return {
        "detail": [
            {"code": str(i.get("code") or "invalid"), "field": i.get("field"), "message": str(i.get("message") or "")}
            for i in items
        ]
    }


def _json(status: int, *items: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(*items), status_code=status, headers=headers)


_STORE_ROLE = {"postgres": "database", "elasticsearch": "search index", "kafka": "broker"}


def store_unavailable(store: str, exc: BaseException | str) -> ApiError:
    """503 naming the store first (`elasticsearch: search index unavailable (...)`), never a stack trace."""
    reason = exc if isinstance(exc, str) else (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    role = _STORE_ROLE.get(store, "store")
    return ApiError(503, "store_unavailable", f"{store}: {role} unavailable ({reason})"[:500])


# -- request validation --------------------------------------------------------------------------


def _field(loc: tuple) -> str | None:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
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


def validation_items(errors: Iterable[Any], body: Any = None) -> list[dict[str, Any]]:
    """pydantic's errors as error items (code = the error type, field = the dotted path, `body`/`query` left out).

    The one mapping for a request FastAPI validated and for an MCP tool's arguments (api.mcp)."""
    items = []
    for err in errors:
        if err.get("type") == "json_invalid":
            items.append(_json_position(err, body))
            continue
        message = err.get("msg", "") or "invalid"
        items.append(
            {
                "code": err.get("type", "invalid"),
                "field": _field(tuple(err.get("loc", ()))),
                "message": message.removeprefix("Value error, "),
            }
        )
    return items


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return _json(422, *validation_items(exc.errors(), exc.body))


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


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's 404/405 and any HTTPException still raised somewhere, in the one shape."""
    if exc.status_code == 400 and exc.__cause__ is not None and exc.detail == _FASTAPI_BODY_ERROR:
        # FastAPI could not read the body at all (not UTF-8, nested past the JSON parser's recursion limit)
        cause = type(exc.__cause__).__name__
        return _json(422, {"code": "bad_json", "field": "body", "message": f"the body is not readable JSON ({cause})"})
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
        return store_unavailable("kafka", exc.reason)
    if isinstance(exc, kafka_errors.KafkaError):
        return store_unavailable("kafka", exc)
    return None


async def _store_down(_: Request, exc: Exception) -> JSONResponse:
    error = store_failure(exc)
    if error is None:
        return await _internal_error(_, exc)
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
