"""The routes' one way to answer JSON: orjson bytes in a plain Response (FastAPI's ORJSONResponse is deprecated);
and `OrjsonBodyRoute`, a route class that parses its JSON body with orjson.

A route that returns a Response is not validated against its `response_model` by FastAPI: the
models in api.schemas document the bodies, tests/test_api_schema.py checks them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool


def json_response(body: Any, status_code: int = 200) -> Response:
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:
        # an answer that echoes what a client sent and orjson will not write (a lone surrogate the standard parser
        # read from its escape, in a refused event's id): the standard encoder escapes it as the client spelled it
        content = json.dumps(body, default=_as_json, separators=(",", ":")).encode()
    return Response(content, status_code=status_code, media_type="application/json")


def _as_json(value: Any) -> Any:
    """What orjson writes of a value the standard encoder does not know (a time, a dataclass), as JSON data."""
    return orjson.loads(orjson.dumps(value))


# orjson reads an integer past 64 bits as a float (silently another number): a body with such an integer is read by
# the standard parser. Runs of 19 or more digits are found by mapping every digit to "0" and everything else to " "
# (bytes.translate runs in C, far faster than a regular expression); a run is an integer where a number may start
# (after "[", ":" or ",", spaces and a minus sign): inside a string (a hex digest often holds one) it is not
_DIGITS_AS_ZEROS = bytes(ord("0") if chr(i).isdigit() and i < 128 else ord(" ") for i in range(256))
_LONG_RUN = b"0" * 19
_NUMBER_AFTER = frozenset(b"[:,")
_RUNS_JUDGED = 10_000  # past this many runs in strings, the standard parser reads the body (slower, never wrong)
_INLINE_BYTES = 256 * 1024  # a larger body is parsed in a worker thread (below)


def _may_hold_a_long_integer(body: bytes) -> bool:
    zeros = body.translate(_DIGITS_AS_ZEROS)
    start = zeros.find(_LONG_RUN)
    for _ in range(_RUNS_JUDGED):
        if start == -1:
            return False
        # what precedes the run; 64 bytes of it are all spaces (or the body's start): judged a number, to be safe
        before = body[max(0, start - 64) : start].rstrip(b"-").rstrip(b" \t\r\n")
        if not before or before[-1] in _NUMBER_AFTER:
            return True
        end = zeros.find(b" ", start)
        start = -1 if end == -1 else zeros.find(_LONG_RUN, end)
    return True


def parse_json_body(body: bytes) -> Any:
    """The body as the standard `json.loads` reads it, by orjson where that gives the same value."""
    if not _may_hold_a_long_integer(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # what orjson refuses and the standard parser reads (NaN, 1e999, lone surrogates) is judged later
    return json.loads(body)


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        # a large body in a worker thread: its scan and its parse are each one call into C that holds the GIL, and
        # between them (and in the scan's loop) the event loop gets its turn to serve others
        if not hasattr(self, "_json"):
            body = await self.body()
            large = len(body) > _INLINE_BYTES
            self._json = await run_in_threadpool(parse_json_body, body) if large else parse_json_body(body)
        return self._json


class OrjsonBodyRoute(APIRoute):
    """The route class of every router whose routes take a body: FastAPI parses the body on the event loop with
    the standard parser, which takes several times as long as orjson on a body of megabytes."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_with_orjson(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return parse_with_orjson
