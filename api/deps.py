"""Dependencies every route declares: settings, resources, the caller's tenants, request strings that can be stored.

Routes get the parts of the app's one `Resources` (`PoolDep`, `EsDep`, `ResourcesDep`) and never create or cache
one. Each dependency costs FastAPI time on every request, so the hot routes declare one resource alias beside
`TenantsDep` and these read the app state from the request. The API key comes as `X-API-Key` or a bearer token,
binding the tenants a request may name (403 for any other); the schemes do not raise themselves, so a 401 comes
in the one error shape.
"""

from __future__ import annotations

import base64
import re
from datetime import datetime
from typing import Annotated, Any

import orjson
from elasticsearch import AsyncElasticsearch
from fastapi import Depends, Query, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool
from pydantic import AfterValidator, BeforeValidator, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError
from starlette.datastructures import Headers

from api.access import CallerTenants, caller_id
from api.errors import ApiError
from api.resources import Resources
from producers.contract import TENANT_MAX, TENANT_PATTERN, InvalidEvent, Rfc3339, check_storable
from producers.settings import Settings

API_KEY_HEADER = "X-API-Key"
api_key_scheme = APIKeyHeader(
    name=API_KEY_HEADER, scheme_name="ApiKeyAuth", auto_error=False, description="an API key bound to tenants"
)
bearer_scheme = HTTPBearer(scheme_name="BearerAuth", auto_error=False, description="the same API key as a bearer token")


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


# async (not def): FastAPI would run a plain function in a worker thread, a hop the hot paths must not pay
async def get_resources(request: Request) -> Resources:
    resources = request.app.state.resources
    if resources is None:
        raise RuntimeError("the app's resources are closed (requests after its lifespan ended)")
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


async def get_pool(request: Request) -> AsyncConnectionPool:
    return (await get_resources(request)).pool


async def get_es(request: Request) -> AsyncElasticsearch:
    return (await get_resources(request)).es


PoolDep = Annotated[AsyncConnectionPool, Depends(get_pool)]
EsDep = Annotated[AsyncElasticsearch, Depends(get_es)]


AUTHORIZATION_HEADER = "Authorization"


def _unauthorized(message: str, header: str = API_KEY_HEADER) -> ApiError:
    return ApiError(401, "unauthorized", message, header, headers={"WWW-Authenticate": "Bearer"})


async def caller_tenants(
    request: Request,  # not SettingsDep: each dependency costs FastAPI time per request, on every route
    x_api_key: Annotated[str | None, Security(api_key_scheme)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)] = None,
) -> frozenset[str]:
    """The tenants the presented API key may use; 401 without a known key, naming the header the caller used, and
    when the request presents two (a header twice, or X-API-Key and Authorization naming different keys): which
    one a proxy or a client library meant is not for the server to guess."""
    refused = two_keys(request.headers)
    if refused is not None:
        raise refused
    if x_api_key:
        return tenants_for_key(request.app.state.settings, x_api_key)
    if bearer is not None:
        return tenants_for_key(request.app.state.settings, bearer.credentials.strip(), AUTHORIZATION_HEADER)
    if AUTHORIZATION_HEADER in request.headers:  # another scheme (Basic, a bare key): say which one is read
        raise _unauthorized("send the API key as Authorization: Bearer <key> (or X-API-Key)", AUTHORIZATION_HEADER)
    return tenants_for_key(request.app.state.settings, None)


def two_keys(headers: Headers) -> ApiError | None:
    """The 401 for a request that presents two API keys (a header twice, or X-API-Key and Authorization naming
    different keys), naming the header; None for one key. The rule of every front end (the API, the MCP server)."""
    for name in (API_KEY_HEADER, AUTHORIZATION_HEADER):
        if len(headers.getlist(name)) > 1:
            return _unauthorized(f"{name} is sent more than once: send one API key", name)
    key, sent = headers.get(API_KEY_HEADER), headers.get(AUTHORIZATION_HEADER)
    if key and sent is not None:
        scheme, _, token = sent.strip().partition(" ")
        if scheme.lower() != "bearer" or token.strip() != key:
            message = "X-API-Key and Authorization name different keys: send one API key"
            return _unauthorized(message, AUTHORIZATION_HEADER)
    return None


def tenants_for_key(settings: Settings, key: str | None, header: str = API_KEY_HEADER) -> frozenset[str]:
    """The tenants `key` may use (`settings.api_keys`); 401 naming `header` (the one the key came in) when it is
    missing or unknown.

    The one rule for every front end: the HTTP API (`caller_tenants`) and the MCP server (api.mcp.auth).
    """
    if not key:
        if header not in (API_KEY_HEADER, AUTHORIZATION_HEADER):  # a process's own key (`ledger mcp` over stdio)
            raise _unauthorized(f"missing API key: start the server with {header} (or --api-key)", header)
        raise _unauthorized("missing API key: send X-API-Key or Authorization: Bearer", header)
    tenants = settings.api_keys.get(key)
    if tenants is None:
        raise _unauthorized(f"unknown API key (sent in {header})", header)
    return CallerTenants(tenants, caller_id(key))  # a frozenset that also names the caller (api.access)


TenantsDep = Annotated[frozenset[str], Depends(caller_tenants)]


def check_tenant(tenant: str, allowed: frozenset[str], field: str = "tenant") -> str:
    """Return tenant if the caller may use it, else 403 naming the field."""
    if tenant not in allowed:
        raise ApiError(403, "forbidden_tenant", f"this API key may not use tenant {tenant!r}", field)
    return tenant


def storable(value: str) -> str:
    """A path or query string PostgreSQL can store and compare (no NUL, no lone surrogate): else 422."""
    try:
        return check_storable(value, "")
    except InvalidEvent as exc:
        raise PydanticCustomError(exc.code, exc.message) from None


def not_blank(value: str) -> str:
    """A path or query string that is not only white space (a write's contract refuses such an id): else 422."""
    if not value.strip():
        raise ValueError("must not be blank")
    return value


# a path or query string: 422 `unstorable_text` naming the parameter, never a 500 from the database
Storable = Annotated[str, AfterValidator(storable)]
# the name of something stored (a subject, a memory, event or erasure id, a key): never only white space, as the
# write's contract refuses such a name, so a read or an erasure of one could only ever find nothing
Named = Annotated[Storable, AfterValidator(not_blank)]


TenantQuery = Annotated[
    Storable,
    Query(
        min_length=1, max_length=TENANT_MAX, pattern=TENANT_PATTERN, description="the tenant (one the API key may use)"
    ),
]


def _invalid_time(value: Any, handler: ValidatorFunctionWrapHandler) -> datetime:
    try:
        return handler(value)
    except ValidationError as exc:
        message = exc.errors()[0].get("msg", "invalid").removeprefix("Value error, ")
        raise PydanticCustomError("invalid_time", message) from None


# a request time (query parameter or body field): the contract's strict RFC 3339, refused as `invalid_time`
Time = Annotated[Rfc3339, WrapValidator(_invalid_time)]


_CURSOR = re.compile(r"([0-9]+):([0-9]+)")  # ASCII digits: int() would also read other scripts' digits
_WHOLE_NUMBER = re.compile(r"(?!-0+\Z)-?[0-9]+")  # not "-0": zero is written without a sign


def _whole_number(value: Any) -> Any:
    """A query parameter's integer written in ASCII digits only: pydantic would read `1.0`, `+1`, `-0`, ` 1`, `1_0`
    and other scripts' digits as numbers, where a body's numbers are strict (`wrong_type`, as `1e3` already is)."""
    if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value) is None:
        raise PydanticCustomError("wrong_type", "Input should be a whole number written in digits (0-9)")
    return value


# after the Query/Path of an integer parameter (`Annotated[int, Query(ge=1), DIGITS]`): placed before it, the
# validator would make the OpenAPI bounds `ge`/`le` instead of `minimum`/`maximum`
DIGITS = BeforeValidator(_whole_number)
MAX_PARTITION, MAX_OFFSET = 2**31 - 1, 2**63 - 1  # Kafka's int32 partition and int64 offset
CURSOR_NOTE = "continue an audit replay after the page whose next_cursor this is ('<partition>:<offset>')"


def cursor_place(value: str) -> tuple[int, int]:
    """The (partition, offset) a page cursor names (an audit replay's `next_cursor`, the dead letters' `next`),
    else ValueError (a 422 naming the parameter)."""
    found = _CURSOR.fullmatch(value)
    if found is None:
        raise ValueError("must be PARTITION:OFFSET in ASCII digits, as the previous page gave it")
    if len(found[1]) > 10 or len(found[2]) > 19:  # longer than any partition or offset Kafka holds: int() not asked
        raise ValueError("names a partition or offset past what Kafka holds")
    place = int(found[1]), int(found[2])
    if place[0] > MAX_PARTITION or place[1] > MAX_OFFSET:
        raise ValueError("names a partition or offset past what Kafka holds")
    return place


def check_cursor(value: str | None) -> str | None:
    if value is not None:
        cursor_place(value)
    return value


# a list cursor's length: base64 of the JSON of a subject (at most 256 characters) or of a time and an erasure id (at
# most 128), each character at most 6 bytes there (`\u0001`): about 2,100 at most; what is longer was never given
MAX_LIST_CURSOR = 4096
ListCursorQuery = Annotated[
    str | None,
    Query(max_length=MAX_LIST_CURSOR, description="the previous page's next_cursor: the items after its last one"),
]


def list_cursor(*texts: str) -> str:
    """Where a page of a list ordered by text ended (the erasure records, the subjects), opaque: base64url of the
    JSON of the last item's sort key (a subject or an id may hold any character a separator would be)."""
    return base64.urlsafe_b64encode(orjson.dumps(list(texts))).decode().rstrip("=")


def list_place(cursor: str, parts: int) -> list[str]:
    """The `parts` texts a `list_cursor` names, else 422 naming `cursor`."""
    try:
        texts = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(texts, list) or len(texts) != parts or not all(isinstance(t, str) for t in texts):
            raise ValueError("not a place")
        return [check_storable(t, "cursor") for t in texts]
    except (ValueError, InvalidEvent):  # orjson's and base64's errors are ValueErrors
        raise ApiError(422, "invalid_value", "is not a next_cursor this route gave", "cursor") from None


# the route's query parameter and the request model's field (api.requests.EventsParams), one rule
Cursor = Annotated[str | None, AfterValidator(check_cursor)]
CursorQuery = Annotated[str | None, Query(max_length=32, description=CURSOR_NOTE), AfterValidator(check_cursor)]
