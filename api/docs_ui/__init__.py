"""`/docs` without the internet: FastAPI's Swagger UI page, its JavaScript, CSS and icon served from this package.

FastAPI's own `/docs` loads Swagger UI from a CDN (and its icon from fastapi.tiangolo.com), so it is a
blank page on a machine without internet. `install_docs(app)` serves the same page with every asset
under `/docs/static/` (`static/`: swagger-ui-dist 5.35.0 from npm, files unchanged, with its LICENSE
and NOTICE; see static/README.md) and the online validator badge off. ReDoc is not offered (its
bundle would be a second copy of a UI we have): create the app with `docs_url=None, redoc_url=None`.
Swagger UI 5 is needed, not 4: FastAPI writes OpenAPI 3.1, which Swagger UI 4 refuses to render.

The spec's security schemes (api.deps: `ApiKeyAuth` = X-API-Key, `BearerAuth`) give the page its
Authorize button. A key typed there stays in the page until it is left or reloaded: Swagger UI's
`persistAuthorization` would keep it in the origin's localStorage, readable by any page of the origin and kept
after the browser closes.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["DOCS_PATH", "STATIC_DIR", "install_docs"]

DOCS_PATH = "/docs"
STATIC_DIR = Path(__file__).parent / "static"
_STATIC = f"{DOCS_PATH}/static"
_PARAMETERS = {"validatorUrl": None, "persistAuthorization": False, "displayRequestDuration": True}


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at /docs with its assets from STATIC_DIR (nothing fetched from outside the service)."""
    if not app.openapi_url:
        return

    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + app.openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{_STATIC}/favicon-32x32.png",
            swagger_ui_parameters=_PARAMETERS,
        )

    app.add_route(DOCS_PATH, docs, include_in_schema=False)
    app.mount(_STATIC, StaticFiles(directory=STATIC_DIR), name="docs-static")
