"""orjson responses for the read routes (FIELD-NOTES: ORJSONResponse is deprecated in FastAPI 0.165)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")
