"""The API's Prometheus metrics (docs/metrics.md): HTTP requests by route template, and `GET /metrics`.

`install(app, settings)` adds `HttpMetrics` (a plain ASGI middleware, cheap per request) and the exposition route,
which needs no API key as no label holds tenant data. Requests are labelled by route template, never the raw path,
so there is one series per route, not per subject. With several uvicorn workers (`prepare_multiprocess`) samples
go through prometheus-client's multiprocess files, so any process's scrape adds them all up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producers.metrics import LATENCY_BUCKETS, counter, histogram
from producers.settings import Settings

__all__ = ["UNMATCHED", "HttpMetrics", "install", "prepare_multiprocess", "route_template"]

UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

REQUESTS = counter(
    "http_requests_total", "HTTP requests answered, by method, route template and status", ("method", "route", "status")
)
LATENCY = histogram(
    "http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by method and route template",
    ("method", "route"),
    buckets=LATENCY_BUCKETS,
)


def route_template(scope: Scope, routes: Sequence[BaseRoute], path: str, root_path: str = "") -> str:
    """The path template of the route that answered `scope` (read after the app ran), else UNMATCHED.

    FastAPI keeps the route it selected, with the prefixes of the routers it was included through, in
    `scope["fastapi"]["effective_route_context"]` (`scope["route"]` of an included route lacks those prefixes):
    every /v1 route is found there at the cost of two lookups. Otherwise (a route or mount of the app itself:
    /metrics, /docs, `/console/static/{path}`; a path nothing matches) the app's own `routes` are matched again
    against the request's `path` and `root_path` as they arrived, as the router does (a method mismatch, 405,
    still names the route).
    """
    fastapi_scope = scope.get("fastapi")
    if isinstance(fastapi_scope, dict):
        template = getattr(fastapi_scope.get("effective_route_context"), "path_format", None)
        if template:
            return template
    probe = {"type": "http", "path": path, "root_path": root_path, "method": scope.get("method", "GET")}
    partial = None
    for route in routes:
        template = getattr(route, "path_format", None)
        if template is None:  # an included router: its routes were found above
            continue
        match, _ = route.matches(probe)
        if match is Match.FULL:
            return template
        if match is Match.PARTIAL and partial is None:
            partial = template
    return partial or UNMATCHED


class HttpMetrics:
    """Counts and times every HTTP request (see the module docstring); the status of a raised error is 500.

    `routes`: the app's route list (`app.router.routes`, read at each lookup, so routes added later count).
    """

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes
        self._series: dict[tuple[str, str, int], tuple] = {}  # (method, route, status) -> (counter, histogram)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        path, root_path = scope["path"], scope.get("root_path", "")  # as they arrived: routing rewrites the scope
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._observe(route_template(scope, self.routes, path, root_path), scope, status, perf_counter() - started)

    def _observe(self, route: str, scope: Scope, status: int, seconds: float) -> None:
        method = scope["method"] if scope["method"] in _METHODS else "other"  # a client may send any token
        key = (method, route, status)
        series = self._series.get(key)
        if series is None:  # bounded: the app's routes x a few methods x the statuses it answers
            series = self._series[key] = (REQUESTS.labels(method, route, str(status)), LATENCY.labels(method, route))
        series[0].inc()
        series[1].observe(seconds)


def _exposition(request: Request) -> Response:
    """The text format of every family of this process (of all processes in multiprocess mode)."""
    registry = REGISTRY
    if values.ValueClass is not values.MutexValue:  # PROMETHEUS_MULTIPROC_DIR was set before the import
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def install(app: FastAPI, settings: Settings) -> None:
    """The middleware and `GET <api_metrics_path>` (no API key, not in the OpenAPI spec); nothing if the path is ""."""
    if not settings.api_metrics_path:
        return
    app.add_middleware(HttpMetrics, routes=app.router.routes)
    app.add_route(settings.api_metrics_path, _exposition, methods=["GET"], include_in_schema=False)


def prepare_multiprocess(directory: Path) -> None:
    """For uvicorn with several workers: before they start, an empty `directory` for their samples.

    Emptied, so a restarted API counts from 0 like a single process; PROMETHEUS_MULTIPROC_DIR is set for the
    worker processes uvicorn spawns (they import prometheus-client afresh).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
