"""`DELETE /v1/subjects/{subject}?tenant=`: erase a subject (right to be forgotten).

Publishes one `subject.erased` event through the SDK (`LedgerProducer.erase_subject`) and answers
202 with where the ledger stored it: the purge itself is done by the projections when they apply
that event (PostgreSQL drops the subject's versions and events but the erasure tombstone; the
search indexer deletes the subject's documents), so a rebuild from the log erases it again.

Idempotent: erasing twice publishes two tombstones and purges nothing more. 401 without a known
API key, 403 for a tenant the key may not use, 503 (nothing published) if the broker failed.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep, TenantsDep, check_tenant
from api.routes.events import _producer
from producers.contract import InvalidEvent
from producers.sdk import PublishError

router = APIRouter(tags=["erasure"])


@router.delete(
    "/subjects/{subject}",
    status_code=202,
    responses={
        202: {"description": "subject.erased published; the projections purge the subject when they apply it"},
        403: {"description": "the API key may not use this tenant; nothing published"},
        503: {"description": "the broker failed; nothing published, retrying is safe"},
    },
)
async def erase_subject(
    request: Request,
    settings: SettingsDep,
    tenants: TenantsDep,
    subject: Annotated[str, Path(min_length=1, max_length=256)],
    tenant: Annotated[str, Query(min_length=1, max_length=128, description="the tenant (must be the key's)")],
    reason: Annotated[str | None, Query(max_length=1024, description="why (kept on the tombstone)")] = None,
) -> Response:
    """Publish `subject.erased` for (tenant, subject); 202 with its event_id, partition and offset."""
    check_tenant(tenant, tenants)
    producer = _producer(request.app, settings)
    try:
        result = await run_in_threadpool(producer.erase_subject, tenant, subject, reason)
    except InvalidEvent as exc:  # e.g. a blank subject: the contract names the field
        raise HTTPException(
            422, detail=[{"field": exc.field or "subject", "code": exc.code, "message": exc.message}]
        ) from exc
    except PublishError as exc:
        raise HTTPException(503, detail=exc.as_dict()) from exc
    body = {
        "event_id": result.event_id,
        "type": "subject.erased",
        "tenant": tenant,
        "subject": subject,
        "partition": result.partition,
        "offset": result.offset,
    }
    return Response(orjson.dumps(body), status_code=202, media_type="application/json")
