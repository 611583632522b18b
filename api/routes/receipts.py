"""`POST /v1/receipts/verify` and `POST /v1/receipts/replay`: check a receipt an answer gave, and re-derive its answer.

Every answer of recall, context, facts, history and the audit replay carries a `receipt` (api.receipts: the ledger
positions it reflects, its times, the events behind what it shows with their chain links, keyed digests, what ranked
it, a digest of the answer, an Ed25519 signature). `verify` says whether the signature is this ledger's and whether
each cited event is held at its place with that content (or was erased since: when and where, nothing else);
`replay` re-derives the answer from the request's parameters as known at the receipt's positions and says whether it
is the same, part by part. Tenant-scoped like every read: a receipt of another tenant is a 404, a tenant the key may
not use a 403. The MCP tools `verify_receipt` and `replay_receipt` call the same functions.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api import receipts
from api.deps import ResourcesDep, TenantsDep
from api.requests import ReceiptBody, ReplayBody
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import ReceiptReplay, ReceiptVerification

router = APIRouter(prefix="/receipts", tags=["receipts"], route_class=OrjsonBodyRoute)


@router.post("/verify", response_model=ReceiptVerification)
async def verify_receipt(body: ReceiptBody, request: Request, res: ResourcesDep, tenants: TenantsDep) -> Response:
    """Whether the receipt is this ledger's and what it cites is (or was, before an erasure) in the ledger."""
    await receipts.names_once(await request.body())
    return json_response(await receipts.verify(res, tenants, body))


@router.post("/replay", response_model=ReceiptReplay)
async def replay_receipt(body: ReplayBody, request: Request, res: ResourcesDep, tenants: TenantsDep) -> Response:
    """The receipt's answer re-derived as known at its positions, and whether it is the same."""
    await receipts.names_once(await request.body())
    return json_response(await receipts.replay(res, tenants, body))
