"""`DELETE /v1/subjects/{subject}?tenant=`: erase a subject (right to be forgotten).

Publishes one `subject.erased` event and answers 202 `pending`: the projections purge when they apply it, so a
rebuild from the log erases the subject again. The subject is the rest of the path, `/` included, as the GET
routes read it. So a path ending in `/facts` or `/events` (or in `/`) is refused unless `literal=true`: it is a read
route's path (or a URL's trailing slash), and a caller deleting it means the subject before it far more often than a
subject of that name (erasing nothing while believing the subject gone is the one mistake an erasure must not
make). Erasing twice publishes two tombstones and purges nothing more.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response

from api import writes
from api.client import path_segment
from api.deps import ResourcesDep, Storable, TenantQuery, TenantsDep, check_tenant
from api.errors import ApiError
from api.routes._json import OrjsonBodyRoute, json_response
from api.routes.subjects import Subject
from api.schemas import ErasureResponse

router = APIRouter(tags=["erasure"], route_class=OrjsonBodyRoute)

REASON_NOTE = "why, kept readable for good (an erasure is never sealed): say why, never who"
LITERAL_NOTE = (
    "true: the whole path is the subject, even when it ends in `/facts`, `/events` or `/`, or has no record while "
    "another subject reads the same (case, width, Unicode form, white space at its ends, invisible characters or a "
    "dash's kind aside)"
)
# the last path segments of the read routes under /v1/subjects/{subject} (api.routes.subjects)
READ_ROUTE_NAMES = frozenset({"facts", "events"})


@router.delete(
    "/subjects/{subject:text}",
    status_code=202,
    response_model=ErasureResponse,
    responses={202: {"description": "subject.erased published; the projections purge the subject when they apply it"}},
)
async def erase_subject(
    res: ResourcesDep,
    tenants: TenantsDep,
    subject: Subject,
    tenant: TenantQuery,
    reason: Annotated[Storable | None, Query(max_length=1024, description=REASON_NOTE)] = None,
    literal: Annotated[bool, Query(description=LITERAL_NOTE)] = False,
) -> Response:
    """Publish `subject.erased` for (tenant, subject); 202 with its event_id, partition and offset."""
    check_tenant(tenant, tenants)  # another tenant is a 403 whatever else the request says
    if not literal:
        _refuse_a_read_routes_path(subject, tenant)
    return json_response(await writes.erase_subject(res, tenants, tenant, subject, reason, literal=literal), 202)


def _meant_instead(subject: str) -> tuple[str, str] | None:
    """(the subject a caller more likely means, why) when the path is a read route's (`.../facts`, `.../events`,
    with or without a trailing slash) or ends in `/` (a URL habit far more often than a subject's last character);
    None when the path means just `subject` (also a subject of slashes alone: there is no other it could mean)."""
    bare = subject.rstrip("/")
    head, _, last = bare.rpartition("/")
    if head and last in READ_ROUTE_NAMES:
        return head, f"this path names the {last} of the subject {head!r}"
    return (bare, "this path ends in '/'") if bare and bare != subject else None


def _refuse_a_read_routes_path(subject: str, tenant: str) -> None:
    """422 naming `subject` when the path may mean another subject (`_meant_instead`), with the request that erases
    the subject meant (none for a blank one, which no request erases) and how to erase `subject` itself."""
    meant = _meant_instead(subject)
    if meant is None:
        return
    named, why = meant
    other = f"to erase the subject {named!r}, DELETE {_erasure_path(named, tenant)}; " if named.strip() else ""
    raise ApiError(
        422, "invalid_value", f"{why}: {other}to erase the subject {subject!r} itself, add literal=true", "subject"
    )


def _erasure_path(subject: str, tenant: str) -> str:
    """The request that erases exactly `subject`, as a client sends it: percent-encoded, a `.` or `..` segment too
    (a client would resolve it against the path before it, and erase another subject), literal=true when needed."""
    segments = [path_segment(s, safe=":@!$&'()*+,;=") for s in subject.split("/")]
    query = {"tenant": tenant} | ({"literal": "true"} if _meant_instead(subject) is not None else {})
    return "/v1/subjects/" + "/".join(segments) + "?" + urlencode(query)
