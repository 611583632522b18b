"""One router per resource; this module only includes them (and documents the one error shape on each)."""

from fastapi import APIRouter

from api.errors import ERROR_RESPONSES
from api.routes import erasure, events, facts, health, stats, subjects

api_router = APIRouter()
# health needs no key and reads no request fields: only a server error or a store that is down
api_router.include_router(health.router, responses={k: ERROR_RESPONSES[k] for k in (500, 503)})
from api.routes import schema  # noqa: E402

# the event contract's JSON Schema: public (no key, no store), so only a server error (api/routes/schema.py says why)
api_router.include_router(schema.router, responses={500: ERROR_RESPONSES[500]})
for _module in (events, facts, subjects, stats, erasure):
    api_router.include_router(_module.router, responses=ERROR_RESPONSES)
from api.routes import recall  # noqa: E402

api_router.include_router(recall.router, responses=ERROR_RESPONSES)
from api.routes import context  # noqa: E402  (the prompt-ready memory block, issue 16)

api_router.include_router(context.router, responses=ERROR_RESPONSES)
from api.routes import subject_search, tenants  # noqa: E402  (the audit console's finders)

for _module in (tenants, subject_search):
    api_router.include_router(_module.router, responses=ERROR_RESPONSES)
from api.routes import keys  # noqa: E402  (issue 13: data keys for producers, erasure records)

api_router.include_router(keys.router, responses=ERROR_RESPONSES)
