"""`/docs` works without the internet: Swagger UI's assets come from the service itself.

The API runs as a real server (`uvicorn api.main:app`, private settings). Over HTTP: the page names
no URL of another host, every asset it names loads, ReDoc (a CDN bundle) is not offered, and the
spec declares the API key schemes on every operation that needs a key. In Debian's Chromium with
every request to another origin aborted: Swagger UI renders every operation of the spec, nothing
outside the service is even asked for, and its Authorize button works (the same call is 401 before
and 200 after the key is entered).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser

from tests.conftest import unique
from tests.support import cleanup
from tests.support.browser import ApiServer, OfflinePage

KEY, TENANT = "docs-key", "docs-tenant"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "options", "head"}


@pytest.fixture(scope="module")
def server(base_settings) -> Iterator[ApiServer]:
    settings = base_settings.private(unique("docs"), api_keys={KEY: [TENANT]})
    try:
        with ApiServer(settings) as api:
            api.wait_ready()
            yield api
    finally:
        cleanup(settings)


@pytest.fixture(scope="module")
def spec(server: ApiServer) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def operations(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops if m in HTTP_METHODS}


def test_the_docs_page_names_only_the_service_and_its_assets_load(server: ApiServer) -> None:
    page = httpx.get(f"{server.url}/docs", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    absolute = re.findall(r"(?:https?:)?//[^\s'\"<>)]+", page.text)
    assert absolute == [], "the docs page names another host"
    assets = re.findall(r"""(?:src|href)="([^"]+)"|url: '([^']+)'""", page.text)
    assets = [a or b for a, b in assets]
    assert {"/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/openapi.json"} <= set(assets)
    kinds = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}
    for asset in assets:
        r = httpx.get(server.url + asset, timeout=30)
        assert r.status_code == 200, asset
        assert kinds[asset[asset.rindex(".") :]] in r.headers["content-type"], (asset, r.headers["content-type"])
    for text in ("LICENSE", "NOTICE"):  # the vendored files' licence ships with them
        assert httpx.get(f"{server.url}/docs/static/{text}", timeout=30).status_code == 200
    assert httpx.get(f"{server.url}/redoc", timeout=30).status_code == 404  # its bundle would come from a CDN


def test_the_spec_declares_the_api_key_exactly_where_a_key_is_needed(server: ApiServer, spec: dict[str, Any]) -> None:
    """Each operation that declares the schemes answers 401 without a key; each that does not, answers without one."""
    schemes = spec["components"]["securitySchemes"]
    assert {k: v for k, v in schemes["ApiKeyAuth"].items() if k != "description"} == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
    }
    assert (schemes["BearerAuth"]["type"], schemes["BearerAuth"]["scheme"]) == ("http", "bearer")
    keyed = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method not in HTTP_METHODS:
                continue
            declared = {name for requirement in op.get("security", []) for name in requirement}
            assert declared in (set(), {"ApiKeyAuth", "BearerAuth"}), (method, path, declared)
            url = server.url + re.sub(r"\{[^}]+\}", "x", path)
            r = httpx.request(method.upper(), url, json={} if method in ("post", "put", "patch") else None, timeout=30)
            if declared:
                keyed += 1
                assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
                assert r.json()["detail"][0]["field"] == "X-API-Key"
            else:
                assert r.status_code != 401, (method, path)
    assert keyed >= 8 and spec["paths"]["/v1/health"]["get"].get("security") is None  # health needs no key


def test_swagger_ui_renders_every_operation_offline_and_authorize_works(
    server: ApiServer, spec: dict[str, Any], browser: Browser
) -> None:
    with OfflinePage(browser, server.url) as tab:
        page = tab.page
        page.set_default_timeout(60_000)
        page.goto("/docs")
        page.wait_for_selector(".opblock")
        shown = page.eval_on_selector_all(
            ".opblock",
            """bs => bs.map(b => [b.querySelector('.opblock-summary-method').textContent,
                                  b.querySelector('.opblock-summary-path').dataset.path])""",
        )
        assert {(m, p) for m, p in shown} == operations(spec)
        assert len(shown) == len(operations(spec))

        def execute_tenants() -> str:
            """Try GET /v1/tenants from the page; the status code Swagger UI shows."""
            block = page.locator(".opblock", has=page.locator('.opblock-summary-path[data-path="/v1/tenants"]'))
            if not block.locator(".execute").is_visible():
                if not block.locator(".try-out__btn").is_visible():
                    block.locator(".opblock-summary").click()
                block.locator(".try-out__btn").click()
            with page.expect_response(lambda r: r.url.endswith("/v1/tenants")):
                block.locator(".execute").click()
            status = block.locator(".live-responses-table .response .response-col_status")
            status.first.wait_for()
            return status.first.inner_text().strip()

        assert execute_tenants() == "401"
        page.click(".btn.authorize")
        auth = page.locator(".auth-container", has=page.locator("h4", has_text="ApiKeyAuth"))
        auth.locator("input").fill(KEY)
        auth.locator("button.authorize").click()
        page.click(".btn-done, button.close-modal")
        assert execute_tenants() == "200"
        body = page.locator(".live-responses-table .response-col_description pre").first.inner_text()
        assert TENANT in body

        # the key lives in the page only: nothing the origin's other pages could read, nothing kept after the tab
        stored = page.evaluate("() => JSON.stringify([{...localStorage}, {...sessionStorage}, document.cookie])")
        assert KEY not in stored, stored
        page.reload()
        page.wait_for_selector(".opblock")
        assert execute_tenants() == "401"

        assert tab.blocked == [], "the docs asked for something outside the service"
        assert tab.errors == [], "the docs page threw"


def test_every_answer_says_not_to_sniff_frame_or_keep_it(server: ApiServer) -> None:
    """The docs page holds a key once it is typed: no other origin may frame it. An answer under /v1 is a tenant's
    data read with a key: no cache or proxy may keep it. None is read as another content type than it says. The
    console's page keeps its own, stricter policy."""
    answers = {
        "/docs": httpx.get(f"{server.url}/docs"),
        "/": httpx.get(f"{server.url}/"),
        "/v1/tenants": httpx.get(f"{server.url}/v1/tenants", headers={"X-API-Key": KEY}),
        "/v1/tenants (no key)": httpx.get(f"{server.url}/v1/tenants"),
        "/v1/subjects?bad": httpx.get(f"{server.url}/v1/subjects", params={"tenant": TENANT, "x": 1},
                                      headers={"X-API-Key": KEY}),
    }  # fmt: skip
    for what, r in answers.items():
        assert r.status_code in (200, 401, 422), (what, r.status_code)
        assert r.headers.get("x-content-type-options") == "nosniff", (what, r.headers)
        assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", ""), (what, r.headers)
        if what.startswith("/v1"):
            assert r.headers.get("cache-control") == "no-store", (what, r.headers)
    console = httpx.get(f"{server.url}/console")
    assert (
        console.headers["cache-control"] == "no-cache"
        and "script-src 'self'" in console.headers["content-security-policy"]
    )
