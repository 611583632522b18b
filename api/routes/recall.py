"""`POST /v1/recall`: deterministic-first recall over one tenant's memories.

The handler only validates, checks tenancy and calls `projections.search.recall.RecallEngine`:
the app's one engine (api.resources: the vocabulary cache, the embedder loaded in the background
at start-up), so the event loop never runs the model. The body is `api.schemas.RecallResponse`.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from api.deps import RecallDep, Storable, TenantsDep, Time, check_tenant, storable
from api.routes._json import json_response
from api.schemas import RecallResponse
from producers.contract import Kind, SourceType
from projections.search.recall import Mode, RecallFilters, RecallQuery

router = APIRouter(tags=["recall"])

_Values = str | list[str] | None


def _as_tuple(v: _Values) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


class Filters(BaseModel):
    """Each filter takes one value or a list (any of them matches)."""

    model_config = ConfigDict(extra="forbid")

    kind: _Values = None
    key: _Values = None
    scope: _Values = None
    tags: _Values = None
    source_type: _Values = None

    @field_validator("kind", "key", "scope", "tags", "source_type")
    @classmethod
    def _storable(cls, v: _Values) -> _Values:
        for text in _as_tuple(v):  # a NUL could not be compared by PostgreSQL: 422 naming the filter
            storable(text)
        return v

    @field_validator("kind", "source_type")
    @classmethod
    def _known_values(cls, v: _Values, info: ValidationInfo) -> _Values:
        allowed = (Kind if info.field_name == "kind" else SourceType)._value2member_map_
        bad = [k for k in _as_tuple(v) if k not in allowed]
        if bad:
            raise ValueError(f"unknown {info.field_name} {bad[0]!r}: one of {', '.join(allowed)}")
        return v

    def to_engine(self) -> RecallFilters:
        return RecallFilters(**{name: _as_tuple(getattr(self, name)) for name in RecallFilters.__dataclass_fields__})


class RecallBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: Storable = Field(min_length=1, max_length=128)
    subject: Storable | None = Field(default=None, min_length=1, max_length=256)
    query: Storable = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=5, ge=1, le=100)
    as_of: Time | None = Field(default=None, description="RFC 3339 time with seconds and an offset")
    mode: Mode = "auto"
    filters: Filters | None = None

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


@router.post("/recall", response_model=RecallResponse)
async def recall(body: RecallBody, engine: RecallDep, tenants: TenantsDep) -> Response:
    """Hits (exact first, then keyword/semantic), the cues extracted from the query, and a per-stage trace."""
    check_tenant(body.tenant, tenants)
    query = RecallQuery(
        tenant=body.tenant,
        query=body.query,
        subject=body.subject,
        top_k=body.top_k,
        as_of=body.as_of if isinstance(body.as_of, datetime) else None,
        mode=body.mode,
        filters=body.filters.to_engine() if body.filters else RecallFilters(),
    )
    # a store that fails is a 503 naming it (api.errors), never a guessed answer
    return json_response(await engine.recall(query))
