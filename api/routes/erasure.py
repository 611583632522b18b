"""`DELETE /v1/subjects/{subject}?tenant=`: erase a subject (right to be forgotten).

Publishes one `subject.erased` event through the SDK (`LedgerProducer.erase_subject`) and answers
202 with where the ledger stored it: the purge itself is done by the projections when they apply
that event (PostgreSQL drops the subject's versions and events but the erasure tombstone; the
search indexer deletes the subject's documents), so a rebuild from the log erases it again.

The subject is the rest of the path, `/` included, exactly as the GET routes read it: `a/b` and
`a%2Fb` both erase the subject `a/b`; `a%252Fb` erases the subject literally named `a%2Fb`.

Idempotent: erasing twice publishes two tombstones and purges nothing more. 401 without a known
API key, 403 for a tenant the key may not use, 422 naming the field for an unstorable subject or
reason, 503 `store_unavailable` naming kafka (nothing published) if the broker failed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from starlette.concurrency import run_in_threadpool

from api.deps import ProducerDep, Storable, TenantQuery, TenantsDep, check_tenant
from api.errors import ApiError, store_unavailable
from api.routes._json import json_response
from api.schemas import ErasureResponse
from producers.contract import InvalidEvent
from producers.sdk import PublishError

router = APIRouter(tags=["erasure"])


@router.delete(
    "/subjects/{subject:path}",
    status_code=202,
    response_model=ErasureResponse,
    responses={202: {"description": "subject.erased published; the projections purge the subject when they apply it"}},
)
async def erase_subject(
    producer: ProducerDep,
    tenants: TenantsDep,
    subject: Annotated[Storable, Path(min_length=1, max_length=256, description="the subject (may contain /)")],
    tenant: TenantQuery,
    reason: Annotated[Storable | None, Query(max_length=1024, description="why (kept on the tombstone)")] = None,
) -> Response:
    """Publish `subject.erased` for (tenant, subject); 202 with its event_id, partition and offset."""
    check_tenant(tenant, tenants)
    try:
        result = await run_in_threadpool(producer.erase_subject, tenant, subject, reason)
    except InvalidEvent as exc:  # e.g. a blank subject: the contract names the field
        raise ApiError(422, exc.code, exc.message, exc.field or "subject") from exc
    except PublishError as exc:
        raise store_unavailable("kafka", exc.reason) from exc
    body = {
        "event_id": result.event_id,
        "type": "subject.erased",
        "tenant": tenant,
        "subject": subject,
        "partition": result.partition,
        "offset": result.offset,
    }
    return json_response(body, 202)
