"""`DELETE /v1/subjects/{subject}?tenant=`: erase a subject (right to be forgotten).

Publishes one `subject.erased` event through the SDK (`LedgerProducer.erase_subject`) and answers
202 with where the ledger stored it, `effect: "pending"` and the `status_url` that tells when it was
applied (api.writes.effect_pending): the purge itself is done by the projections when they apply
that event (PostgreSQL drops the subject's versions and events but the erasure tombstone; the
search indexer deletes the subject's documents), so a rebuild from the log erases it again.

The subject is the rest of the path, `/` included, exactly as the GET routes read it: `a/b` and
`a%2Fb` both erase the subject `a/b`; `a%252Fb` erases the subject literally named `a%2Fb`.

The answer's `consistency_token`, given to a read as `after`, makes it answer once the erasure is applied.

Idempotent: erasing twice publishes two tombstones and purges nothing more. 401 without a known
API key, 403 for a tenant the key may not use, 422 naming the field for an unstorable subject or
reason, 503 `store_unavailable` naming kafka (nothing published) if the broker failed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api import writes
from api.deps import ResourcesDep, Storable, TenantQuery, TenantsDep
from api.requests import SUBJECT
from api.routes._json import json_response
from api.schemas import ErasureResponse

router = APIRouter(tags=["erasure"])


@router.delete(
    "/subjects/{subject:path}",
    status_code=202,
    response_model=ErasureResponse,
    responses={202: {"description": "subject.erased published; the projections purge the subject when they apply it"}},
)
async def erase_subject(
    res: ResourcesDep,
    tenants: TenantsDep,
    subject: Annotated[Storable, Path(**SUBJECT, description="the subject (may contain /)")],
    tenant: TenantQuery,
    reason: Annotated[Storable | None, Query(max_length=1024, description="why (kept on the tombstone)")] = None,
) -> Response:
    """Publish `subject.erased` for (tenant, subject); 202 with its event_id, partition and offset."""
    return json_response(await writes.erase_subject(res, tenants, tenant, subject, reason), 202)
