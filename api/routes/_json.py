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


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


# orjson reads an integer past 64 bits as a float (silently another number): a body with a run of 19 or more
# digits anywhere (in a string too: rare, and only slower) is read by the standard parser. Found by mapping every
# digit to "0" and everything else to " " (bytes.translate runs in C, far faster than a regular expression)
_DIGITS_AS_ZEROS = bytes(ord("0") if chr(i).isdigit() and i < 128 else ord(" ") for i in range(256))
_LONG_RUN = b"0" * 19


def parse_json_body(body: bytes) -> Any:
    """The body as the standard `json.loads` reads it, by orjson where that gives the same value."""
    if _LONG_RUN not in body.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # what orjson refuses and the standard parser reads (NaN, 1e999, lone surrogates) is judged later
    return json.loads(body)


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


class OrjsonBodyRoute(APIRoute):
    """A route whose JSON body is parsed by orjson: FastAPI parses the body on the event loop, and the
    standard parser takes several times as long on a large POST /v1/events body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_with_orjson(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return parse_with_orjson
