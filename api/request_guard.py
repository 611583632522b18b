"""What every HTTP request is checked for before any route reads it: its size, its path and query as UTF-8, no line
feed in its path but in a text parameter, and no query parameter its route does not take.

- A body over `api_max_body_bytes` is refused with 413 `too_large` (at once when its Content-Length says so, else
  as soon as more has arrived), before the key is checked: a caller without a key cannot make the process hold an
  unbounded body.
- A percent-escape that is not UTF-8 in the path or the query (`%ED%A0%80`, `%FF`) is refused with 422
  `unstorable_text` naming the parameter. The server would otherwise read it as U+FFFD and store or look up that
  other text.
- A line feed in the path (`%0A`) is read as part of a text parameter (a subject, an event id: api.routes._paths),
  and refused with 422 `invalid_value` anywhere else: after a route's last literal (`.../facts%0A`, which a route's
  pattern would read as `.../facts`), naming "path", or in a number, naming the parameter.
- A body sent with a Content-Encoding (gzip...) is refused with 415 `unsupported_media_type` naming the header:
  read as it came, a compressed body was "not UTF-8" and an uncompressed one under the header was taken.
- A query parameter the route does not take (`asof` for `as_of`, `after` on a route that reads it from its body) is
  refused with 422 `unknown_field` naming it, as a body's unknown field is, and one given twice with 422
  `invalid_value`: ignored, or the last one taken, it would answer another question than the one asked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote_to_bytes

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body
from producers.settings import Settings

__all__ = ["RequestGuard", "install", "line_feed_parameter", "query_refusal", "replay", "undecodable_parameter"]


def _escaped(raw: bytes) -> bool:
    """Whether `raw` may hold bytes that are not UTF-8 (a percent-escape, or a byte past ASCII sent as it is)."""
    return b"%" in raw or not raw.isascii()


def _not_utf8(raw: bytes) -> bool:
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def undecodable_parameter(app: ASGIApp, scope: Scope) -> str | None:
    """The name of the first path or query parameter of `scope` whose percent-escapes are not UTF-8 ("path" for
    a path no route template names, "query" for a query parameter's name); None: all are UTF-8."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
    raw_path = raw_path.split(b"?", 1)[0]
    if _escaped(raw_path) and _not_utf8(raw_path):
        return (
            _path_parameter(app, raw_path.decode("latin-1"), lambda part: _not_utf8(part.encode("latin-1"))) or "path"
        )
    query: bytes = scope.get("query_string", b"")
    if not _escaped(query):
        return None
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        if _not_utf8(name.replace(b"+", b" ")):
            return "query"
        if _not_utf8(value.replace(b"+", b" ")):
            return unquote_to_bytes(name.replace(b"+", b" ")).decode()
    return None


def line_feed_parameter(scope: Scope, cache: dict[str, Any], app: ASGIApp) -> str | None:
    """The parameter of `scope`'s path that holds a line feed its route does not read as text ("path" when no route
    of the request's method takes the whole path: the line feed stands after a literal); None: none does. `cache`:
    as query_refusal's."""
    path: str = scope["path"]
    if "\n" not in path:
        return None
    for match, operation in _matching_operations(scope, cache, app):
        for name, part in match.groupdict().items():
            if "\n" in part and name not in operation.text_path:
                return name
        return None
    return "path"


def _path_parameter(app: ASGIApp, sent: str, bad: Callable[[str], bool]) -> str | None:
    """The parameter of the app's path templates (its OpenAPI paths) whose part of the path `sent` (a subject may
    hold `/` or `%2F`) is `bad`."""
    for pattern in _templates(app):
        match = pattern.fullmatch(sent)
        if match is not None:
            for name, part in match.groupdict().items():
                if bad(part):
                    return name
            return None
    return None


def _templates(app: ASGIApp) -> list[re.Pattern[str]]:
    """The app's path templates (its OpenAPI paths, which FastAPI makes once) as patterns (`_patterns`)."""
    openapi = getattr(app, "openapi", None)
    if openapi is None:
        return []
    return [pattern for pattern, _ in _patterns(openapi().get("paths", {}))]


def _patterns(templates: Iterable[str]) -> list[tuple[re.Pattern[str], str]]:
    """Path templates as patterns whose groups are their parameters, each taking one segment or more (FastAPI's
    `path` parameters take `/`), the most literal text first, each with its template."""
    out = []
    for template in templates:
        parts = re.split(r"\{(\w+)\}", template)  # text, name, text, name, ..., text
        body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" for i, p in enumerate(parts))
        out.append((-sum(len(p) for p in parts[::2]), re.compile(body, re.DOTALL), template))
    return [(pattern, template) for _, pattern, template in sorted(out, key=lambda o: o[0])]


class _Operation(NamedTuple):
    query: set[str]  # the query parameters it takes
    reads_input: bool  # a query, or a body
    text_path: set[str]  # its path parameters that are text (a line feed is theirs)


def query_refusal(app: ASGIApp, scope: Scope, cache: dict[str, Any]) -> tuple[str, str, str] | None:
    """(code, parameter, message) for the first query parameter of `scope` that its operation (the app's OpenAPI
    spec) does not take (`unknown_field`), or that is given twice (`invalid_value`: no parameter takes a list); None
    when all are fine or no operation answers the path (the console, the docs). An operation that reads no input at
    all (health) takes any: a probe's cache-buster changes nothing. `cache` keeps the operations (made once: the
    routes do not change once the app runs)."""
    query: bytes = scope.get("query_string", b"")
    if not query:
        return None
    for _, operation in _matching_operations(scope, cache, app):
        if not operation.reads_input:
            return None
        seen: set[str] = set()
        for name, _ in parse_qsl(query.decode("utf-8", "replace"), keep_blank_values=True):
            if name not in operation.query:
                taken = operation.query
                which = f"which takes: {', '.join(sorted(taken))}" if taken else "which takes none (its body says all)"
                return "unknown_field", name, f"is not a parameter of this route, {which}"
            if name in seen:
                return "invalid_value", name, "is given more than once: no parameter takes a list, so say it once"
            seen.add(name)
        return None
    return None


def _matching_operations(
    scope: Scope, cache: dict[str, Any], app: ASGIApp
) -> Iterator[tuple[re.Match[str], _Operation]]:
    """The operations of `scope`'s method whose path template takes its whole path, most literal first, each with
    the match (its groups: the path parameters). A more literal template of another method (GET .../{subject}/facts)
    is not this method's."""
    if "operations" not in cache:
        cache["operations"] = _operations(app)
    method, path = scope["method"].lower(), scope["path"]
    for pattern, by_method in cache["operations"]:
        if method in by_method:
            match = pattern.fullmatch(path)
            if match is not None:
                yield match, by_method[method]


def _operations(app: ASGIApp) -> list[tuple[re.Pattern[str], dict[str, _Operation]]]:
    """(the path template's pattern, method -> its operation), most literal first."""
    openapi = getattr(app, "openapi", None)
    if openapi is None:
        return []
    paths = openapi().get("paths", {})
    out = []
    for pattern, template in _patterns(paths):
        by_method = {}
        for method, op in paths[template].items():
            params = op.get("parameters", [])
            taken = {p["name"] for p in params if p.get("in") == "query"}
            text = {p["name"] for p in params if p.get("in") == "path" and p.get("schema", {}).get("type") == "string"}
            by_method[method] = _Operation(taken, bool(taken) or "requestBody" in op, text)
        out.append((pattern, by_method))
    return out


class RequestGuard:
    """The checks above, as an ASGI middleware around the app."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, routes_of: ASGIApp | None = None) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.routes_of = routes_of or app
        self._operations: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        name = undecodable_parameter(self.routes_of, scope)
        if name is not None:
            message = "holds a percent-escape that is not UTF-8, so no text the ledger stores or looks up"
            await _answer(send, 422, "unstorable_text", name, message)
            return
        name = line_feed_parameter(scope, self._operations, self.routes_of)
        if name is not None:
            message = "holds a line feed (%0A) where this route reads none: nothing was read or changed"
            await _answer(send, 422, "invalid_value", name, message)
            return
        refused = query_refusal(self.routes_of, scope, self._operations)
        if refused is not None:
            await _answer(send, 422, *refused)
            return
        headers = dict(scope.get("headers") or ())
        message = encoded_body(headers)
        if message is not None:
            await _answer(send, 415, "unsupported_media_type", "Content-Encoding", message)
            return
        limit = self.max_body_bytes
        if declared_too_large(headers, limit):
            await _answer(send, 413, "too_large", "body", too_large_message(limit))
            return
        if b"content-length" not in headers:  # a chunked body: read here, at most `limit` bytes, handed on whole
            body, receive = await bounded_body(receive, limit)
            if body is None:
                await _answer(send, 413, "too_large", "body", too_large_message(limit))
                return
        # with a length, the server reads no byte past it: the declared length is the body's
        await self.app(scope, receive, send)


def declared_too_large(headers: dict[bytes, bytes], limit: int) -> bool:
    """Whether the request's Content-Length says its body is over `limit` bytes (refused before a byte is read)."""
    length = headers.get(b"content-length")
    return length is not None and length.isdigit() and int(length) > limit


# past its limit, a body is still read, and dropped, up to this much, so that its client hears the 413: an HTTP/1.1
# client still sending when the connection closes takes that as a failure, not as the answer; past it, it is closed
DRAINED_BYTES = 64 * 1024 * 1024


async def bounded_body(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The request's body read whole, but never more than `limit` bytes of it held (None: it is longer; the rest is
    read and dropped up to DRAINED_BYTES), and a receive that gives it again (or the client's leaving, as the app
    would have heard it)."""
    chunks, received = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left
            return b"".join(chunks), replay([message], receive)
        received += len(message.get("body", b""))
        if received > limit:
            while message.get("more_body", False) and received <= DRAINED_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    break
                received += len(message.get("body", b""))
            return None, receive
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    return whole["body"], replay([whole], receive)


def encoded_body(headers: dict[bytes, bytes]) -> str | None:
    """Why a request's Content-Encoding is refused (None: it has none, or `identity`): the body is read as it came,
    so a gzip body was "not UTF-8" and a plain one under the header was taken. The MCP server's door asks it too."""
    coding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
    if coding in ("", "identity"):
        return None
    return f"the body is read as sent: Content-Encoding {coding!r} is not taken (send it unencoded)"


def replay(first: list[Message], receive: Receive) -> Receive:
    """A receive that gives `first`, then whatever the server sends next (a disconnect)."""

    async def replayed() -> Message:
        return first.pop(0) if first else await receive()

    return replayed


def too_large_message(limit: int) -> str:
    return f"the body is over this server's limit of {limit:,} bytes: send less per request"


async def _answer(send: Send, status: int, code: str, field: str, message: str) -> None:
    body = orjson.dumps(error_body({"code": code, "field": field, "message": message}))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, settings: Settings) -> None:
    """Outermost of the app's own middlewares but the request id's, so a refusal still carries X-Request-ID."""
    app.add_middleware(RequestGuard, max_body_bytes=settings.api_max_body_bytes, routes_of=app)
