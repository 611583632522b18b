"""`DELETE /v1/subjects/{subject}?tenant=`: erase a subject (right to be forgotten).

Publishes one `subject.erased` event and answers 202 `pending`: the projections purge when they apply it, so a
rebuild from the log erases the subject again. The subject is the rest of the path, `/` included, as the GET
routes read it. Erasing twice publishes two tombstones and purges nothing more.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api import writes
from api.deps import ResourcesDep, Storable, TenantQuery, TenantsDep
from api.routes._json import OrjsonBodyRoute, json_response
from api.routes.subjects import Subject
from api.schemas import ErasureResponse

router = APIRouter(tags=["erasure"], route_class=OrjsonBodyRoute)

REASON_NOTE = "why, kept readable for good (an erasure is never sealed): say why, never who"


@router.delete(
    "/subjects/{subject:path}",
    status_code=202,
    response_model=ErasureResponse,
    responses={202: {"description": "subject.erased published; the projections purge the subject when they apply it"}},
)
async def erase_subject(
    res: ResourcesDep,
    tenants: TenantsDep,
    subject: Subject,
    tenant: TenantQuery,
    reason: Annotated[Storable | None, Query(max_length=1024, description=REASON_NOTE)] = None,
) -> Response:
    """Publish `subject.erased` for (tenant, subject); 202 with its event_id, partition and offset."""
    return json_response(await writes.erase_subject(res, tenants, tenant, subject, reason), 202)
