"""`POST /v1/context`: a prompt-ready memory block for a subject and an optional question, within a token budget.

`format=text` answers the block itself, ready to paste into a system prompt, with its receipt and consistency in
headers (`X-Receipt`, or `X-Receipt-Omitted` when it is too large for one; `X-Consistency-Reflects`), as the body
is only the block; `format=json` answers the same
lines structured. A body without `format` follows the `Accept` header. The block is built by api.reads.context
(api.context lays it out), shared with the MCP `context` tool.
"""

from __future__ import annotations

import base64

import orjson
from fastapi import APIRouter, Request, Response

from api import reads
from api.deps import ResourcesDep, TenantsDep
from api.requests import ContextBody
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import ContextResponse

router = APIRouter(tags=["context"], route_class=OrjsonBodyRoute)

TEXT = "text/plain; charset=utf-8"
# a response header past this breaks ordinary clients and proxies (curl and httpx take at most 100 KiB of headers,
# Node's parser 16 KiB, nginx buffers 4-8 KiB): a receipt citing more is asked for with format=json
MAX_RECEIPT_HEADER = 8 * 1024


@router.post(
    "/context",
    response_model=ContextResponse,
    responses={200: {"content": {TEXT: {"schema": {"type": "string"}}}, "description": "the block (format=text)"}},
)
async def context(body: ContextBody, res: ResourcesDep, tenants: TenantsDep, request: Request) -> Response:
    """The memory block: text to paste into a prompt (format=text), or the same structured (format=json)."""
    if "format" not in body.model_fields_set and _prefers_json(request.headers.get("accept", "")):
        body = body.model_copy(update={"format": "json"})
    block = await reads.context(res, tenants, body)
    if body.format == "json":
        return json_response(block.doc)
    seen = block.doc.get("consistency")
    headers = {"X-Consistency-Reflects": seen["reflects"]} if seen else {}  # the text is only the block
    # its receipt (of the json form, whose `text` this is): base64url of its JSON, if a header can carry it
    if "receipt" in block.doc:
        receipt = base64.urlsafe_b64encode(orjson.dumps(block.doc["receipt"])).decode()
        if len(receipt) <= MAX_RECEIPT_HEADER:
            headers["X-Receipt"] = receipt
        else:
            headers["X-Receipt-Omitted"] = f"{len(receipt)} bytes, more than a header carries: ask format=json"
    return Response(block.text.encode(), media_type=TEXT, headers=headers)


def _prefers_json(accept: str) -> bool:
    """Whether an Accept header ranks application/json above text/plain (q values; a wildcard ranks both). A q
    value that is not a number from 0 to 1 counts as absent (1): the client named the type, and a type it ruled
    out with q=0 is not chosen over it."""
    weights: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 1.0
                if not 0.0 <= q <= 1.0:  # NaN too
                    q = 1.0
        weights[media.lower()] = max(q, weights.get(media.lower(), 0.0))

    def weight(media: str) -> float:
        kind = media.split("/", 1)[0]
        return weights.get(media, weights.get(f"{kind}/*", weights.get("*/*", 0.0)))

    return weight("application/json") > weight("text/plain")
