"""The door's judging of one request's events: each by the contract, fingerprinted, and the ids repeated within the
request told apart (the same event again, or another under the same id); and the refusals' answer shapes.

`judge` takes and gives picklable values, and its verdicts depend on them alone (an id or a time it mints for an
event without one aside), so a large request is judged in a child process (api.offload) and the server's own GIL
stays with its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from producers.contract import InvalidEvent, MemoryEvent, door_refusal, from_dict

__all__ = ["Judged", "conflict", "invalid", "judge", "refused"]


def refused(raw: Any, error: dict[str, Any]) -> dict[str, Any]:
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return {"event_id": event_id if isinstance(event_id, str) else None, "accepted": False, "error": error}


def invalid(index: int, raw: Any, exc: InvalidEvent) -> dict[str, Any]:
    field = f"events.{index}.{exc.field}" if exc.field else f"events.{index}"
    return refused(raw, {"code": exc.code, "field": field, "message": exc.message})


def conflict(index: int, event: MemoryEvent, where: str) -> dict[str, Any]:
    message = (
        f"event_id {event.event_id!r} already names a different event in tenant {event.tenant!r} ({where}); "
        "resend the same event to retry, or use a new event_id"
    )
    return {
        "event_id": event.event_id,
        "accepted": False,
        "error": {"code": "event_id_conflict", "field": f"events.{index}.event_id", "message": message},
    }


@dataclass
class Judged:
    results: list[dict[str, Any] | None]  # in input order: a refused event's answer; None: valid, answered later
    first: dict[tuple[str, str], tuple[int, MemoryEvent]] = field(default_factory=dict)  # each id's first event
    fingerprints: dict[tuple[str, str], str] = field(default_factory=dict)  # of each first: what the claim holds
    repeats: list[tuple[int, MemoryEvent, int]] = field(default_factory=list)  # (index, event, its first's index)
    # the same id with other content than its first: a conflict with it, unless the ledger holds this content and
    # refuses the first (answered once the ledger is asked, so the answer never depends on the order)
    others: list[tuple[int, MemoryEvent, int]] = field(default_factory=list)


def judge(events: list[Any], now: datetime, skew: timedelta, resolutions: bool) -> Judged:
    """`events` (decoded JSON values) judged one by one; `resolutions`: the caller may publish an event naming a
    dead letter (the dead-letter workflow's own door)."""
    out = Judged(results=[None] * len(events))
    for i, raw in enumerate(events):
        try:
            event = from_dict(raw, now=now, max_future_skew=skew)
        except InvalidEvent as exc:
            out.results[i] = invalid(i, raw, exc)
            continue
        refusal = door_refusal(event, resolutions=resolutions)
        if refusal is not None:
            out.results[i] = invalid(i, raw, refusal)
            continue
        key = (event.tenant, event.event_id)
        if key not in out.first:
            out.first[key], out.fingerprints[key] = (i, event), event.fingerprint
        elif out.fingerprints[key] == event.fingerprint:
            out.repeats.append((i, event, out.first[key][0]))
        else:
            out.others.append((i, event, out.first[key][0]))
    return out
