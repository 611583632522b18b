"""One router per resource; this module only includes them (and documents the one error shape on each).

`events`, `erasure`, `facts`, `subjects`, `stats`, `recall`, `context`, `schema`, `health`, `tenants`,
`subject_search`, `keys`, `dead_letters`, `receipts`: one module each; `_json`: their one way to answer JSON;
`_paths`: the `text` path convertor (a parameter that holds `/` and line feeds), registered before any route.
"""

from typing import Any

from fastapi import APIRouter

from api.errors import ERROR_RESPONSES
from api.routes import (  # _paths first: the routes declare `text` parameters
    _paths,  # noqa: F401
    context,
    dead_letters,
    erasure,
    events,
    facts,
    health,
    keys,
    recall,
    receipts,
    schema,
    stats,
    subject_search,
    subjects,
    tenants,
)

# health needs no key and reads no request fields: only a server error or a store that is down
_HEALTH_ERRORS = {k: ERROR_RESPONSES[k] for k in (500, 503)}
# the event contract's JSON Schema: public (no key, no store), so only a server error (api/routes/schema.py says why)
_SCHEMA_ERRORS = {500: ERROR_RESPONSES[500]}

# every router, in the order its routes are matched, with the error responses it documents
ROUTERS: list[tuple[APIRouter, dict[int | str, dict[str, Any]]]] = [
    (health.router, _HEALTH_ERRORS),
    (schema.router, _SCHEMA_ERRORS),
    (events.router, ERROR_RESPONSES),
    (facts.router, ERROR_RESPONSES),
    (subjects.router, ERROR_RESPONSES),
    (stats.router, ERROR_RESPONSES),
    (erasure.router, ERROR_RESPONSES),
    (recall.router, ERROR_RESPONSES),
    (context.router, ERROR_RESPONSES),  # the prompt-ready memory block
    (receipts.router, ERROR_RESPONSES),  # check an answer's receipt, re-derive its answer
    (tenants.router, ERROR_RESPONSES),  # the audit console's finders
    (subject_search.router, ERROR_RESPONSES),
    (keys.router, ERROR_RESPONSES),  # data keys for producers, erasure records
    (dead_letters.router, ERROR_RESPONSES),  # the dead-letter workflow: list, open, re-drive, discard
]

api_router = APIRouter()
for _router, _responses in ROUTERS:
    api_router.include_router(_router, responses=_responses)
