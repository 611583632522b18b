"""The FastAPI app: `uvicorn api.main:app` (or `ledger serve`).

Only assembles: settings, the lifespan that opens the API's resources (api.resources: the pool,
the Elasticsearch client, the producer, the recall engine, in one place), the error handlers
(api.errors: one error shape, store failures as 503 naming the store) and one router per resource.
`GET /` names where to go (a new user's first request should not be a bare 404).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import fastapi.routing
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.console import install_console
from api.docs_ui import install_docs
from api.errors import install_error_handlers
from api.metrics import install as install_metrics
from api.request_guard import install as install_request_guard
from api.request_id import install as install_request_id
from api.resources import Resources
from api.routes import api_router
from producers.settings import Settings, get_settings


def operation_id(route: APIRoute) -> str:
    """A route's operationId is its function's name (`recall`, not FastAPI's `recall_v1_recall_post`): the method
    name in a generated client. Route functions are named apart (tests/test_openapi_names.py checks)."""
    return route.name


def build_routes(app: FastAPI) -> None:
    """Build before serving what FastAPI otherwise builds on the event loop at a route's first request: each
    included router's route table with its validators, each endpoint's source location (read from its file), the
    OpenAPI document. Built lazily, the first caller of a route stalls every other tenant's request for as long.

    The route tables and the endpoint locations are FastAPI internals, looked up by name: with a FastAPI that has
    none, nothing is built here and nothing breaks (tests/test_availability.py then shows the stall).
    """

    def walk(routes: Any) -> None:
        for route in routes:
            if callable(low := getattr(route, "effective_low_priority_routes", None)):
                low()
            if callable(candidates := getattr(route, "effective_candidates", None)):
                walk(candidates())
            if callable(locate) and isinstance(endpoint := getattr(route, "endpoint", None), Callable):
                locate(endpoint)
            if (original := getattr(route, "original_route", None)) is not None and callable(locate):
                locate(original.endpoint)

    locate = getattr(fastapi.routing, "_extract_endpoint_context", None)
    walk(app.router.routes)
    app.openapi()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with Resources.open(settings) as res:
            app.state.resources = res
            build_routes(app)
            # read-only aliases for tests that predate Resources (tests/test_recall*.py); nothing in api/ reads them
            app.state.pg, app.state.es, app.state.recall_engine = res.pool, res.es, res.recall
            try:
                yield
            finally:
                app.state.resources = None

    # /docs is served offline by api.docs_ui (FastAPI's own loads Swagger UI from a CDN); no ReDoc
    app = FastAPI(
        title="memory-ledger",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    install_error_handlers(app)
    install_request_guard(app, settings)  # body size, and path and query as UTF-8, before any route reads them
    install_request_id(app)  # X-Request-ID on the response and on every log line of the request
    app.include_router(api_router, prefix="/v1")
    install_docs(app)
    install_console(app)
    install_metrics(app, settings)  # HTTP metrics by route template, GET /metrics (api.metrics, docs/metrics.md)
    install_answer_headers(app)

    @app.get("/", include_in_schema=False)
    async def index() -> dict[str, Any]:
        """What this server serves (no key, no store asked)."""
        return {"service": "memory-ledger", "version": app.version, "links": INDEX_LINKS}

    return app


def install_answer_headers(app: FastAPI) -> None:
    """`AnswerHeaders` outside every other layer, Starlette's error middleware too, so that a 500 says them as well."""
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: AnswerHeaders(build())  # type: ignore[method-assign]


class AnswerHeaders:
    """Headers every answer carries unless it sets its own: `nosniff`, no framing (the docs page holds a typed key),
    and under /v1 `no-store`, since an answer there is a tenant's data read with a key, which no cache or proxy
    should keep (the console's own page and assets set theirs: api.console)."""

    _EVERY = ((b"x-content-type-options", b"nosniff"), (b"content-security-policy", b"frame-ancestors 'none'"))
    _API = (*_EVERY, (b"cache-control", b"no-store"))

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self._API if scope["path"].startswith("/v1/") else self._EVERY

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                have = {name.lower() for name, _ in headers}
                message["headers"] = headers + [(name, value) for name, value in extra if name not in have]
            await send(message)

        await self.app(scope, receive, sending)


INDEX_LINKS = {
    "docs": "/docs",
    "openapi": "/openapi.json",
    "console": "/console",
    "health": "/v1/health",
    "event_schema": "/v1/schema/event",
}


app = create_app()
