"""`POST /v1/context`: a prompt-ready memory block for a subject and an optional question, within a token budget.

Body `api.requests.ContextBody`: `{tenant, subject, question?, budget_tokens=1000, format="text"|"json",
include_history=false, as_of?, top_k=5, mode="auto"}`. The block holds the subject's facts in force,
the recall hits for the question first, and (asked) the versions no longer in force, each line with
its value, source, valid time and status; api.context says how it is laid out, escaped and cut.

`format=text` answers the block itself (`text/plain; charset=utf-8`), ready to paste into a system
prompt; `format=json` answers `api.schemas.ContextResponse`: the same lines, structured, the token
count, what was left out, and the text. The budget counts the text with the embedding model's own
tokenizer (api.tokens). Same state, same request: the same bytes (pass `as_of` to pin the valid time).
A body without `format` is answered as the `Accept` header prefers (`application/json` over `text/plain`:
json), text otherwise; a `format` in the body always wins.

Its receipt (api.receipts) is `receipt` in `format=json`, and the header `X-Receipt` of the text (base64url of its
JSON; the receipt is of the json form, whose `text` the text is).

`after` (a write's consistency token): the block is built once the projection (and, for the question, the search
index) has that write (api.consistency), else 503 `not_yet`; which positions it reflects is `consistency` in
`format=json`, and the header `X-Consistency-Reflects` of the text.

Errors as everywhere (api.errors): 422 naming the field (every `budget_tokens` of 64..32000 holds a block:
api.context), 401/403 for the key and tenant, 503 naming a store that is down. The MCP `context` tool calls
the same `api.reads.context`, which builds one block of a tenant at a time, in a worker thread (api.limits):
the work is bounded by the budget and never holds the event loop.
"""

from __future__ import annotations

import base64

import orjson
from fastapi import APIRouter, Request, Response

from api import reads
from api.deps import ResourcesDep, TenantsDep
from api.requests import ContextBody
from api.routes._json import json_response
from api.schemas import ContextResponse

router = APIRouter(tags=["context"])

TEXT = "text/plain; charset=utf-8"


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
    # its receipt (of the json form, whose `text` this is): base64url of its JSON
    if "receipt" in block.doc:
        headers["X-Receipt"] = base64.urlsafe_b64encode(orjson.dumps(block.doc["receipt"])).decode()
    return Response(block.text.encode(), media_type=TEXT, headers=headers)


def _prefers_json(accept: str) -> bool:
    """Whether an Accept header ranks application/json above text/plain (q values; a wildcard ranks both)."""
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
                    q = 0.0
        weights[media.lower()] = max(q, weights.get(media.lower(), 0.0))

    def weight(media: str) -> float:
        kind = media.split("/", 1)[0]
        return weights.get(media, weights.get(f"{kind}/*", weights.get("*/*", 0.0)))

    return weight("application/json") > weight("text/plain")
