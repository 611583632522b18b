"""`X-Request-ID`: every HTTP request has an id, on its response and on every log line written while it runs.

asgi-correlation-id's middleware reads, checks, makes and echoes the id: a caller's `X-Request-ID` is kept when
it is a plausible id (1-128 of `A-Z a-z 0-9 . _ : / + = @ -`), so a trace across services keeps one id; anything
else, or none, gets a fresh one (producers.logs.new_id; the library logs a warning when it replaces a caller's).

`LogRequestId`, just inside it, binds the id (producers.logs.bind_ids) for the whole request, so uvicorn's access
line, the error handlers' lines and anything a route logs carry `request_id`. The library keeps the id in a
contextvar of its own, which producers.logs does not read: the worker and the indexer would import an HTTP
library for it. When the app raises, the id stays bound on the way out: the request's own task ends right after,
and the 500 handler outside these middlewares still logs it.
"""

from __future__ import annotations

import re

from asgi_correlation_id import CorrelationIdMiddleware, correlation_id
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from producers.logs import bind_ids, new_id, unbind_ids

__all__ = ["HEADER", "LogRequestId", "install", "plausible"]

HEADER = "X-Request-ID"
_PLAUSIBLE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def plausible(value: str) -> bool:
    """Whether a caller's X-Request-ID is kept (else a fresh id replaces it)."""
    return _PLAUSIBLE.fullmatch(value) is not None


class LogRequestId:
    """Binds the request's id (set by CorrelationIdMiddleware outside) to every log line of the request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = correlation_id.get()
        if rid is None:  # the lifespan: no request
            await self.app(scope, receive, send)
            return
        token = bind_ids(request_id=rid)
        await self.app(scope, receive, send)
        unbind_ids(token)  # not in a finally: when the app raises, the 500 handler outside still logs the id


def install(app: FastAPI) -> None:
    """Both middlewares; the one added last runs first, so the id is set before it is bound."""
    app.add_middleware(LogRequestId)
    app.add_middleware(CorrelationIdMiddleware, header_name=HEADER, generator=new_id, validator=plausible)
