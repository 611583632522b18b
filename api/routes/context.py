"""`POST /v1/context`: a prompt-ready memory block for a subject and an optional question, within a token budget.

Body `api.requests.ContextBody`: `{tenant, subject, question?, budget_tokens=1000, format="text"|"json",
include_history=false, as_of?, top_k=5, mode="auto"}`. The block holds the subject's facts in force,
the recall hits for the question first, and (asked) the versions no longer in force, each line with
its value, source, valid time and status; api.context says how it is laid out, escaped and cut.

`format=text` answers the block itself (`text/plain; charset=utf-8`), ready to paste into a system
prompt; `format=json` answers `api.schemas.ContextResponse`: the same lines, structured, the token
count, what was left out, and the text. The budget counts the text with the embedding model's own
tokenizer (api.tokens). Same state, same request: the same bytes (pass `as_of` to pin the valid time).

Errors as everywhere (api.errors): 422 naming the field (`budget_tokens` too small for the frame is
`budget_too_small`), 401/403 for the key and tenant, 503 naming a store that is down. The MCP
`context` tool calls the same `api.reads.context`.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

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
async def context(body: ContextBody, res: ResourcesDep, tenants: TenantsDep) -> Response:
    """The memory block: text to paste into a prompt (format=text), or the same structured (format=json)."""
    block = await reads.context(res, tenants, body)
    if body.format == "json":
        return json_response(block.doc)
    return Response(block.text.encode(), media_type=TEXT)
