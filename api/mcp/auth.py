"""Who calls a tool: the ledger API key (a bearer token over HTTP, the process's key over stdio) and its tenants.

Over Streamable HTTP the SDK's bearer middleware asks `KeyVerifier` about the `Authorization: Bearer`
token: a key of `settings.api_keys` passes, anything else is a 401 before any tool runs. Over stdio
there is no request to carry a key: the server acts with the key it was started with
(`LEDGER_MCP_API_KEY` or `ledger mcp --api-key`). Either way the tenants are
`api.deps.tenants_for_key(settings, key)`, the rule of the HTTP API.

A key bound to one tenant may leave `tenant` out of a call; a key bound to several names one per call
(422 `missing_field` on `tenant` otherwise), and a tenant the key may not use is 403 `forbidden_tenant`
(checked by api.reads / api.writes, as for the HTTP routes).
"""

from __future__ import annotations

import hashlib
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from api.deps import AUTHORIZATION_HEADER, tenants_for_key
from api.errors import ApiError
from producers.settings import Settings

__all__ = ["STDIO_KEY", "KeyVerifier", "caller_tenants", "check_admin", "with_tenant"]


class KeyVerifier:
    """The SDK's TokenVerifier for ledger API keys (no OAuth server: the key is the token)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def verify_token(self, token: str) -> AccessToken | None:
        key = token.strip()
        try:
            tenants_for_key(self.settings, key)
        except ApiError:
            return None
        # the principal is the key, named by a digest (never the key itself) for the SDK's session checks
        client_id = "ledger-key-" + hashlib.sha256(key.encode()).hexdigest()[:16]
        return AccessToken(token=key, client_id=client_id, scopes=[])


STDIO_KEY = "LEDGER_MCP_API_KEY"  # where a stdio server's key comes from (or `--api-key`): what a refusal names


def caller_tenants(settings: Settings, stdio_key: str | None) -> frozenset[str]:
    """The tenants of this call's key: the bearer token of the HTTP request, else the stdio server's key."""
    token = get_access_token()
    if token is not None:
        return tenants_for_key(settings, token.token, AUTHORIZATION_HEADER)
    return tenants_for_key(settings, stdio_key, STDIO_KEY)


def check_admin(settings: Settings, stdio_key: str | None) -> None:
    """An operator tool's gate: the call's key must be one of `settings.mcp_admin_keys`, else 403 `forbidden`
    (nothing else is said: the tool exists, this key may not use it)."""
    token = get_access_token()
    key = token.token if token is not None else stdio_key
    if key is None or key not in settings.mcp_admin_keys:
        # the message reaches the model: it names no server setting, which the model cannot change
        raise ApiError(403, "forbidden", "this API key may not use the operator tools (the server's operator keys may)")


def with_tenant(arguments: dict[str, Any], tenants: frozenset[str]) -> dict[str, Any]:
    """The arguments with a tenant: as given, or the key's only tenant; 422 naming tenant for a key of several.

    A given tenant is judged where the HTTP API judges it: the request model validates it, then the function the
    tool runs (api.reads, api.writes) refuses one the key may not use (403 `forbidden_tenant`, field `tenant`).
    """
    if arguments.get("tenant") is not None:
        return arguments
    if len(tenants) != 1:  # how many, never the list itself: a key may be bound to thousands
        message = f"this API key may use {len(tenants)} tenants: name one (GET /v1/tenants lists them)"
        raise ApiError(422, "missing_field", message, "tenant")
    return {**arguments, "tenant": next(iter(tenants))}
