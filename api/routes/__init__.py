"""One router per resource; this module only includes them (and documents the one error shape on each)."""

from fastapi import APIRouter

from api.errors import ERROR_RESPONSES
from api.routes import erasure, events, facts, health, stats, subjects

api_router = APIRouter()
# health needs no key and reads no request fields: only a server error or a store that is down
api_router.include_router(health.router, responses={k: ERROR_RESPONSES[k] for k in (500, 503)})
for _module in (events, facts, subjects, stats, erasure):
    api_router.include_router(_module.router, responses=ERROR_RESPONSES)
from api.routes import recall  # noqa: E402

api_router.include_router(recall.router, responses=ERROR_RESPONSES)
