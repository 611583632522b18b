"""Event factories: the events tests publish, built in one way.

Times are days after `T0` (`at(day)`), so a test reads as a timeline; every factory takes any other
contract field as a keyword (event_id, kind, valid_to, entities, ...).

- `asserted(subject, key, value, day)`: memory.asserted, valid from and observed at `at(day)`,
  content "<subject> <key> = <value>" unless given.
- `facts(subject, {key: value, ...}, day)`: one assertion per key, in order.
- `episode(subject, content, when, service)`: a turn of a conversation (kind episodic, source imported from
  `service`), said and logged at the datetime `when`.
- `marked(type, subject, key, day)`: memory.retracted / memory.confirmed.
- `erased(subject)`: subject.erased.
- `wire(subject, ...)`: the JSON of one event as an HTTP client posts it (no event_id unless given;
  a field given as `...` is left out).
- `changed(leaf)` and `with_value_at(data, path, value)`: the tamper and hostile-input tests' one change.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from producers.contract import EventType, MemoryEvent, Source, SourceType

__all__ = ["MALFORMED_CURSORS", "T0", "TENANT", "asserted", "at", "episode", "erased", "facts", "marked", "wire"]

T0 = datetime(2026, 3, 1, tzinfo=UTC)
TENANT = "acme"


# page cursors that name no place in the log ('<partition>:<offset>'): every route that pages by one refuses each
MALFORMED_CURSORS = [
    "",
    "abc",
    "1:",
    ":1",
    "-1:5",
    "1:-5",
    "1 :5",
    "1:5 ",
    "1:5\n",
    "1:5:6",
    "\u0663:5",  # an Arabic-Indic digit: int() reads it, a position has none
    "0:1\x00",
    "2147483648:0",  # past Kafka's int32 partitions
    "0:9223372036854775808",  # past an int64 offset
    "0:" + "9" * 20,
    "0:" + "1" * 40,
]


def at(days: float) -> datetime:
    return T0 + timedelta(days=days)


def asserted(
    subject: str, key: str | None, value: Any, day: float = 0, *, tenant: str = TENANT, **fields
) -> MemoryEvent:
    return MemoryEvent(
        type=EventType.ASSERTED,
        tenant=tenant,
        subject=subject,
        key=key,
        value=value,
        content=fields.pop("content", f"{subject} {key} = {value}"),
        valid_from=at(day),
        observed_at=fields.pop("observed_at", at(day)),
        **fields,
    )


def episode(
    subject: str, content: str, when: datetime, service: str, *, tenant: str = TENANT, **fields: Any
) -> MemoryEvent:
    return MemoryEvent(
        type=EventType.ASSERTED,
        tenant=tenant,
        subject=subject,
        kind="episodic",
        content=content,
        source=Source(type=SourceType.IMPORTED, service=service),
        observed_at=when,
        valid_from=fields.pop("valid_from", when),
        **fields,
    )


def facts(subject: str, values: Mapping[str, Any], day: float = 0, **fields) -> list[MemoryEvent]:
    """`asserted(subject, key, value, day, **fields)` for each key of `values`, in order."""
    return [asserted(subject, key, value, day, **fields) for key, value in values.items()]


def marked(
    type_: str | EventType, subject: str, key: str, day: float, *, tenant: str = TENANT, **fields
) -> MemoryEvent:
    return MemoryEvent(
        type=type_, tenant=tenant, subject=subject, key=key, valid_from=at(day), observed_at=at(day), **fields
    )


def erased(subject: str, *, tenant: str = TENANT, **fields) -> MemoryEvent:
    return MemoryEvent(type=EventType.ERASED, tenant=tenant, subject=subject, **fields)


def wire(subject: str = "user:1", *, tenant: str = TENANT, **over: Any) -> dict[str, Any]:
    """One memory.asserted as JSON ("<subject> prefers window seats"); `over` replaces fields, `...` drops one."""
    base = {
        "type": "memory.asserted",
        "tenant": tenant,
        "subject": subject,
        "key": "pref.seat",
        "value": "window",
        "content": f"{subject} prefers window seats",
    }
    return {k: v for k, v in {**base, **over}.items() if v is not ...}


def with_value_at(data: Any, path: Sequence[Any], value: Any) -> Any:
    """A deep copy of `data` with `value` at `path` (keys and list indexes; a new key is added)."""
    data = copy.deepcopy(data)
    holder = data
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return data


def changed(value: Any) -> Any:
    """A JSON leaf with one thing changed, of the same type where it has one (the tamper tests' one change)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.25
    if isinstance(value, str):
        if not value:
            return "x"
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if value is None:
        return "x"
    raise AssertionError(f"no change for {value!r}")
