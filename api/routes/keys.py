"""Data keys for producers without database credentials, and the erasure records.

`POST /v1/keys` hands a producer that seals events itself its subjects' data keys: as sensitive as reading the
tenant's memories, which the same API key may already do, and answered `Cache-Control: no-store`. A producer calls
`POST /v1/keys/retire` just before publishing an erasure, so its later events get a new key. Erasure records
(`GET /v1/erasures`) hold no personal data: the subject only as its tenant's keyed digest.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from api.deps import (
    DIGITS,
    ListCursorQuery,
    Named,
    PoolDep,
    ResourcesDep,
    SettingsDep,
    Storable,
    TenantQuery,
    TenantsDep,
    check_tenant,
    list_cursor,
    list_place,
)
from api.errors import ApiError
from api.requests import SUBJECT, TENANT
from api.routes._json import OrjsonBodyRoute, json_response
from api.schemas import ErasureRecord, ErasuresResponse, KeysResponse, RetireResponse
from producers.contract import parse_rfc3339
from producers.keys.kek import KekError
from producers.keys.store import settings_keks
from projections import shapes
from projections.postgres.erasures import erasure_record, list_erasures

router = APIRouter(tags=["encryption"], route_class=OrjsonBodyRoute)

MAX_SUBJECTS = 500


class KeysBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subjects: list[Annotated[Named, Field(**SUBJECT)]] = Field(min_length=1, max_length=MAX_SUBJECTS)


class RetireBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(**TENANT)
    subject: Named = Field(**SUBJECT)
    erasure_id: Named = Field(min_length=1, max_length=128)


def _keys(res):  # the API's key source, or 409
    if res.keys is None:
        raise ApiError(
            409,
            "encryption_unavailable",
            "this API has no key-encryption key configured (LEDGER_KEK / LEDGER_KEK_FILE)",
        )
    return res.keys


@router.post("/keys", response_model=KeysResponse, responses={200: {"description": "each subject's key (no-store)"}})
async def data_keys(res: ResourcesDep, tenants: TenantsDep, body: KeysBody) -> Response:
    """The current data key of each subject of `tenant` (created on first use), for a producer that seals."""
    check_tenant(body.tenant, tenants, "tenant")
    source = _keys(res)
    subjects = list(dict.fromkeys(body.subjects))
    keys = await run_in_threadpool(source.sealing_keys, [(body.tenant, s) for s in subjects])
    items: list[shapes.DataKeyItem] = [
        {
            "subject": s,
            "key_id": keys[(body.tenant, s)].key_id,
            "key": base64.b64encode(keys[(body.tenant, s)].key).decode(),
        }
        for s in subjects
    ]
    response = json_response(shapes.KeysResponse(tenant=body.tenant, keys=items))
    response.headers["Cache-Control"] = "no-store"
    return response


@router.post("/keys/retire", response_model=RetireResponse)
async def retire_key(res: ResourcesDep, tenants: TenantsDep, body: RetireBody) -> Response:
    """Stop handing out the subject's current key: its erasure `erasure_id` is about to be published."""
    check_tenant(body.tenant, tenants, "tenant")
    retired = await run_in_threadpool(_keys(res).retire, body.tenant, body.subject, body.erasure_id)
    return json_response(shapes.RetireResponse(retired=retired))


@router.get("/erasures", response_model=ErasuresResponse)
async def erasures(
    pool: PoolDep,
    settings: SettingsDep,
    tenants: TenantsDep,
    tenant: TenantQuery,
    subject: Annotated[Named | None, Query(**SUBJECT, description="only this subject's erasures")] = None,
    limit: Annotated[int, Query(ge=1, le=500), DIGITS] = 50,
    cursor: ListCursorQuery = None,
) -> Response:
    """The tenant's erasure records, newest first (of one subject: its keyed digest is computed from `subject`); with
    `more`, `next_cursor` asks for the records after these."""
    check_tenant(tenant, tenants)
    past = _erasure_place(cursor)
    try:
        keks = settings_keks(settings) if subject is not None else None
        async with pool.connection() as conn:
            items, more = await list_erasures(
                conn, settings.keys_schema, tenant, subject=subject, keks=keks, limit=limit, past=past
            )
    except KekError as exc:  # the tenant's digest key is wrapped by a KEK this API does not have
        raise ApiError(409, "encryption_unavailable", str(exc), "subject") from None
    last = items[-1] if more else None
    next_cursor = None if last is None else list_cursor(last["applied_at"], last["erasure_id"])
    return json_response(shapes.ErasuresResponse(tenant=tenant, erasures=items, more=more, next_cursor=next_cursor))


def _erasure_place(cursor: str | None) -> tuple[datetime, str] | None:
    """The (applied_at, erasure_id) a `next_cursor` names, else 422 naming `cursor`."""
    if cursor is None:
        return None
    applied_at, erasure_id = list_place(cursor, 2)
    try:
        return parse_rfc3339(applied_at), erasure_id
    except ValueError:
        raise ApiError(422, "invalid_value", "is not a next_cursor this route gave", "cursor") from None


@router.get("/erasures/{erasure_id:text}", response_model=ErasureRecord)
async def erasure(
    pool: PoolDep,
    settings: SettingsDep,
    tenants: TenantsDep,
    tenant: TenantQuery,
    erasure_id: Annotated[Named, Path(min_length=1, max_length=128)],
) -> Response:
    """One erasure record (404 `not_found` until the worker has applied that erasure)."""
    check_tenant(tenant, tenants)
    async with pool.connection() as conn:
        item = await erasure_record(conn, settings.keys_schema, tenant, erasure_id)
    if item is None:
        raise ApiError(
            404, "not_found", f"no erasure {erasure_id!r} has been applied in tenant {tenant!r}", "erasure_id"
        )
    return json_response(item)
