"""The audit console at `/console`: a static page (HTML, CSS, vanilla JS in `static/`) over the `/v1` API.

Everything it shows comes from the `/v1` routes with the API key the operator types in (kept in
the tab's sessionStorage, sent as `X-API-Key`), so the console can see exactly what that key may
see and nothing more: the page itself holds no data and needs no key. Its one kind of write, acting
on a dead letter in the Operations view, goes through the same routes as any client's. Every asset ships in this
package (no CDN, no web font, no build step), so it works on a machine without internet.

Memories are hostile input: the script writes every value with `textContent` / text nodes, never
as HTML, and the page is served with a Content-Security-Policy that allows only this service's own
scripts, styles and API (no inline script, no other origin), so a value that slipped through as
markup still could not run. docs/console.md describes the views.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response
from starlette.types import Scope

__all__ = ["CONSOLE_PATH", "CSP", "STATIC_DIR", "install_console"]

CONSOLE_PATH = "/console"
STATIC_DIR = Path(__file__).parent / "static"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate (ETag): an upgraded service never runs a stale script
}


class _ConsoleStatic(StaticFiles):
    """The console's assets with the page's security headers. The page itself is served at /console only: its
    asset links are relative to that place, so under /console/static/ it was a blank page."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path == "index.html":
            return RedirectResponse(CONSOLE_PATH, 308, headers=_HEADERS)
        response = await super().get_response(path, scope)
        response.headers.update(_HEADERS)
        return response


def install_console(app: FastAPI) -> None:
    """Serve the console page at /console and its assets under /console/static/ (not in the OpenAPI spec)."""

    async def console() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=_HEADERS)

    app.add_api_route(CONSOLE_PATH, console, methods=["GET"], include_in_schema=False)
    app.mount(f"{CONSOLE_PATH}/static", _ConsoleStatic(directory=STATIC_DIR), name="console-static")
