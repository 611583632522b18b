"""Error responses: every 4xx names the field at fault, in one shape.

`{"detail": [{"field": "events.0.tenant", "code": "missing", "message": "Field required"}]}`
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


def _field(loc: tuple) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    return ".".join(parts)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [
        {"field": _field(tuple(err.get("loc", ()))), "code": err.get("type", "invalid"), "message": err.get("msg", "")}
        for err in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
