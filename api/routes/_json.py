"""The routes' one way to answer JSON: orjson bytes in a plain Response (FastAPI's ORJSONResponse is deprecated).

A route that returns a Response is not validated against its `response_model` by FastAPI: the
models in api.schemas document the bodies, tests/test_api_schema.py checks them.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")
