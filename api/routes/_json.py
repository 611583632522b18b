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

from producers.contract import read_json


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


_INLINE_BYTES = 256 * 1024  # a larger body is parsed in a worker thread (below)


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        # a large body in a worker thread: its scan and its parse are each one call into C that holds the GIL, and
        # between them (and in the scan's loop) the event loop gets its turn to serve others
        if not hasattr(self, "_json"):
            body = await self.body()
            large = len(body) > _INLINE_BYTES
            self._json = await run_in_threadpool(read_json, body) if large else read_json(body)
        return self._json


class OrjsonBodyRoute(APIRoute):
    """The route class of every router whose routes take a body: FastAPI parses the body on the event loop with
    the standard parser, which takes several times as long as orjson on a body of megabytes."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_with_orjson(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return parse_with_orjson
