"""One router per resource; this module only includes them."""

from fastapi import APIRouter

from api.routes import erasure, events, facts, health, stats, subjects

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(events.router)
api_router.include_router(facts.router)
api_router.include_router(subjects.router)
api_router.include_router(stats.router)
api_router.include_router(erasure.router)
from api.routes import recall  # noqa: E402

api_router.include_router(recall.router)
