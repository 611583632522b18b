"""Response models: what each route's 2xx body holds, for /docs, /openapi.json, the MCP tools' output schemas and the
read client's results; generated from the shapes the code builds (projections.shapes), one model per shape.

`model(shape)` makes a shape's pydantic model (same name, docstring, fields, descriptions). The routes answer the
dicts as they are, so these models document the bodies at no cost per request. `EventSchemaDocument` is the one
model written here, as its body is a checked-in file. Pydantic and pure modules only, because the read client
imports this (tests/test_client.py checks it loads no server library).
"""

from __future__ import annotations

import functools
import keyword
import operator
import types
from typing import Annotated, Any, Literal, NotRequired, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from typing_extensions import get_type_hints, is_typeddict

from projections import shapes
from projections.shapes import Timestamp

__all__ = [
    "Body",
    "Consistency",
    "ConsistencyResponse",
    "ContextResponse",
    "DataKeyItem",
    "DeadLetterAction",
    "DeadLetterRecord",
    "DeadLettersResponse",
    "ErasureRecord",
    "ErasureResponse",
    "ErasuresResponse",
    "ErrorBody",
    "ErrorItem",
    "EventResult",
    "EventSchemaDocument",
    "EventStatus",
    "EventsResponse",
    "FactVersion",
    "FactsResponse",
    "HealthResponse",
    "HistoryResponse",
    "KeysResponse",
    "LedgerEvent",
    "PublishErrorBody",
    "PublishResponse",
    "RecallResponse",
    "Receipt",
    "ReceiptReplay",
    "ReceiptVerification",
    "RetireResponse",
    "StatsResponse",
    "SubjectsResponse",
    "TenantsResponse",
    "Timestamp",
    "model",
]


class Body(BaseModel):
    """A response object: the fields it documents, and possibly more later (clients ignore unknown fields)."""

    model_config = ConfigDict(extra="allow")


@functools.cache
def model(shape: Any) -> type[BaseModel]:
    """The pydantic model of a shape of projections.shapes (one per shape: cached)."""
    parent = next((b for b in getattr(shape, "__orig_bases__", ()) if is_typeddict(b)), None)
    if parent is not None:
        base = model(parent)
    else:
        base = BaseModel if getattr(shape, "__pydantic_config__", {}).get("extra") == "ignore" else Body
    inherited = set(get_type_hints(parent)) if parent is not None else set()
    fields: dict[str, Any] = {}
    for key, hint in get_type_hints(shape, include_extras=True).items():
        if key in inherited:
            continue  # the parent model's field
        optional = key in shape.__optional_keys__ or get_origin(hint) is NotRequired  # (a string annotation's too)
        if get_origin(hint) is NotRequired:
            hint = get_args(hint)[0]
        spec: dict[str, Any] = {"alias": key} if keyword.iskeyword(key) else {}
        described = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, FieldInfo)]
        if optional and not any(not m.is_required() for m in described):
            spec["default"] = None  # may be absent: None unless its Field names another default
        fields[f"{key}_" if spec.get("alias") else key] = (_models_in(hint), Field(**spec))
    return create_model(shape.__name__, __base__=base, __module__=__name__, __doc__=shape.__doc__, **fields)


def _models_in(hint: Any) -> Any:
    """`hint` with every shape in it (in a list, a dict, a union, an Annotated) replaced by its model."""
    if is_typeddict(hint):
        return model(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin is None or origin is Literal:
        return hint
    if origin is Annotated:
        return Annotated[(_models_in(args[0]), *hint.__metadata__)]
    args = tuple(_models_in(a) for a in args)
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, args)
    return origin[args]


# the public ones by name; every other shape's model is model(shapes.X), inside these
Consistency = model(shapes.Consistency)
ConsistencyResponse = model(shapes.ConsistencyResponse)
ContextResponse = model(shapes.ContextResponse)
DataKeyItem = model(shapes.DataKeyItem)
DeadLetterAction = model(shapes.DeadLetterAction)
DeadLetterRecord = model(shapes.DeadLetterRecord)
DeadLettersResponse = model(shapes.DeadLettersResponse)
ErasureRecord = model(shapes.ErasureRecord)
ErasureResponse = model(shapes.ErasureResponse)
ErasuresResponse = model(shapes.ErasuresResponse)
ErrorBody = model(shapes.ErrorBody)
ErrorItem = model(shapes.ErrorItem)
EventResult = model(shapes.EventResult)
EventStatus = model(shapes.EventStatus)
EventsResponse = model(shapes.EventsResponse)
FactVersion = model(shapes.FactVersion)
FactsResponse = model(shapes.FactsResponse)
HealthResponse = model(shapes.HealthResponse)
HistoryResponse = model(shapes.HistoryResponse)
KeysResponse = model(shapes.KeysResponse)
LedgerEvent = model(shapes.LedgerEvent)
PublishErrorBody = model(shapes.PublishErrorBody)
PublishResponse = model(shapes.PublishResponse)
RecallResponse = model(shapes.RecallResponse)
Receipt = model(shapes.Receipt)
ReceiptReplay = model(shapes.ReceiptReplay)
ReceiptVerification = model(shapes.ReceiptVerification)
RetireResponse = model(shapes.RetireResponse)
StatsResponse = model(shapes.StatsResponse)
SubjectsResponse = model(shapes.SubjectsResponse)
TenantsResponse = model(shapes.TenantsResponse)


class EventSchemaDocument(Body):
    """The event contract as a JSON Schema (draft 2020-12), served as checked in (producers.event_schema).

    Only its top-level keywords are declared here; the document, generated from producers.contract.MemoryEvent,
    describes the event itself.
    """

    schema_: str = Field(alias="$schema", description="the JSON Schema dialect: draft 2020-12")
    id_: str = Field(alias="$id", description="urn:memory-ledger:schema:memory-event:<schema_version>")
    title: str
    description: str = Field(description="the record (topic, key, size) and what the contract checks beyond it")
    defs: dict[str, Any] = Field(alias="$defs", description="the enums and the source object")
    type: Literal["object"]
    properties: dict[str, Any] = Field(description="one per event field, each described")
    required: list[str]
    additionalProperties: bool
    examples: list[dict[str, Any]] = Field(description="valid events, as a producer sends them")
