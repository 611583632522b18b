"""Every (method, path template) the app answers, for the tests whose cases must cover each route (a new route
without a case fails them: tests/test_availability.py, tests/test_api_trust.py)."""

from __future__ import annotations

from api.main import create_app
from producers.settings import Settings


def app_routes(settings: Settings) -> set[tuple[str, str]]:
    """Every (method, template) the app answers: its OpenAPI paths, and its own routes and mounts outside the spec."""
    app = create_app(settings)
    routes = {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}
    for route in app.routes:
        path = getattr(route, "path", None)
        if path is None:  # the included /v1 routers: their routes are the spec's
            continue
        methods = getattr(route, "methods", None) or {"GET"}  # a mount serves GET
        routes |= {(m, path) for m in methods if m != "HEAD"}
    return routes
