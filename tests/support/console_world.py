"""The audit console's world: a small ledger with every kind of change, the whole stack, the API as a server.

`console_world(settings)` publishes `scenario()` through the SDK, runs the projector worker and the
search indexer (`pipeline`) until everything is applied and indexed, then serves the API with
`uvicorn api.main:app` on a free port (`ApiServer`), all on the caller's private names. Used by
tests/test_console.py and by the screenshot script (`python -m tests.support.shoot_console`).

The subject `user:42` of tenant `acme` has, in ledger order: a preference, a state, a supersession,
a confirmation, a temporary override (a preference with a bounded valid_to), a second supersession,
a late event (valid from day 2, observed on day 12: an "as known at" difference), a retraction, a
retraction that matches nothing (`no_effect`), and a hostile value (markup in value, content, source).
Tenant `globex` (another key) holds `user:secret-globex` and its own `user:42`. `note:long` holds a value and a
content longer than the console shows at first.

`produce_malformed(world, name)` writes one of `MALFORMED` straight to the ledger topic (as a client that skips the
SDK and the API would), and returns its position once the worker has dead-lettered it (the API lists it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from producers.contract import EventType, MemoryEvent, Source, kafka_key
from producers.settings import Settings
from tests.support.browser import ApiServer
from tests.support.events import asserted, at, marked, wire
from tests.support.kafka import publish_raw
from tests.support.pipeline import Pipeline, pipeline
from tests.support.waiting import wait_for

__all__ = [
    "AUDITOR_KEY",
    "CONSOLE_KEYS",
    "FOREIGN",
    "FOREIGN_KEY",
    "HOSTILE",
    "LONG_SUBJECT",
    "LONG_VALUE",
    "MALFORMED",
    "SUBJECT",
    "ConsoleWorld",
    "console_world",
    "produce_malformed",
    "scenario",
]

AUDITOR_KEY, FOREIGN_KEY = "auditor-key", "globex-key"
CONSOLE_KEYS = {AUDITOR_KEY: ["acme", "initech"], FOREIGN_KEY: ["globex"]}
TENANT, FOREIGN = "acme", "globex"
SUBJECT = "user:42"
HOSTILE = "<img src=x onerror=window.__pwned=1>"
LONG_SUBJECT = "note:long"
LONG_VALUE = "The meeting notes of the quarterly review, kept word for word: " + " ".join(
    f"item {i} was discussed and agreed without objection;" for i in range(1, 13)
)

# records the worker refuses, as a client that skips the SDK and the API could write them (the console's tests
# re-drive the first with its content added and discard the second with a reason)
MALFORMED: dict[str, dict[str, Any]] = {
    "missing-content": wire(
        "ticket:T-100", tenant=TENANT, event_id="ev-dl-content", key="ticket.priority", value="high", content=...
    ),
    "bad-time": wire(
        "ticket:T-200", tenant=TENANT, event_id="ev-dl-time", key="ticket.priority", value="low",
        content="ticket T-200 has low priority", valid_from="last tuesday",
    ),
    "wrong-kind": wire(
        "ticket:T-300", tenant=TENANT, event_id="ev-dl-kind", key="ticket.owner", value="ops-team",
        content="ticket T-300 is owned by the ops team", kind="rumour",
    ),
}  # fmt: skip


def _src(type_: str, service: str, ref: str) -> Source:
    return Source(type=type_, service=service, ref=ref)


def scenario() -> list[MemoryEvent]:
    """The events of the console's world, with fixed event ids (the screenshots are the same each run)."""
    chat, crm = "chat", "crm-import"
    u = SUBJECT
    return [
        asserted(u, "pref.seat", "window", 0, kind="preference", event_id="ev-seat-1",
                 content="user 42 prefers window seats", aliases=["seat preference", "座位偏好"],
                 source=_src("explicit", chat, "msg-101")),
        asserted(u, "home.city", "Lyon", 1, event_id="ev-city-1", content="user 42 lives in Lyon",
                 source=_src("imported", crm, "row-7731")),
        asserted(u, "pref.seat", "aisle", 3, kind="preference", event_id="ev-seat-2",
                 content="user 42 now prefers aisle seats", aliases=["seat preference"],
                 source=_src("explicit", chat, "msg-207")),
        marked(EventType.CONFIRMED, u, "pref.seat", 4, event_id="ev-seat-ok", source=_src("system", "trips", "t-88")),
        asserted(u, "pref.seat", "window", 5, kind="preference", valid_to=at(8), event_id="ev-seat-trip",
                 content="for the Berlin trip (5-8 March) user 42 wants window seats",
                 source=_src("explicit", chat, "msg-233")),
        asserted(u, "home.city", "Berlin", 6, event_id="ev-city-2", content="user 42 moved to Berlin",
                 source=_src("explicit", chat, "msg-240")),
        asserted(u, "note.free_text", HOSTILE, 7, event_id="ev-hostile",
                 content=f"{HOSTILE} <script>window.__pwned=2</script> <b>not bold</b>",
                 source=_src("inferred", "<b>scraper</b>", "<img src=y onerror=window.__pwned=3>")),
        marked(EventType.RETRACTED, u, "pref.meal", 9, event_id="ev-meal-retract", reason="no such preference",
               source=_src("explicit", chat, "msg-251")),
        marked(EventType.RETRACTED, u, "home.city", 10, event_id="ev-city-retract", reason="address unknown",
               source=_src("explicit", chat, "msg-260")),
        asserted(u, "profile.language", "de", 2, observed_at=at(12), event_id="ev-lang",
                 content="user 42 speaks German", source=_src("imported", crm, "row-9120")),
        asserted("project:P1", "project.backend_port", 8080, 0, entities=["P1"], event_id="ev-p1-1",
                 aliases=["backend port", "后端服务地址"], content="项目 P1 的后端服务端口是 8080",
                 source=_src("explicit", chat, "msg-17")),
        asserted("project:P1", "project.backend_port", 9090, 20, entities=["P1"], event_id="ev-p1-2",
                 aliases=["backend port", "后端服务地址"], content="P1 backend port moved to 9090",
                 source=_src("explicit", "deploy-bot", "change-4411")),
        asserted("user:7", "pref.seat", "middle", 1, kind="preference", event_id="ev-u7",
                 source=_src("explicit", chat, "msg-31")),
        asserted("order:OD5001", "order.refund", 30, 15, kind="event", entities=["OD5001"], event_id="ev-refund",
                 content="order OD5001 was refunded, 30 EUR", source=_src("system", "billing", "rf-5001")),
        asserted("user:1", "pref.seat", "window", 0, tenant="initech", kind="preference", event_id="ev-initech",
                 source=_src("explicit", chat, "msg-1")),
        asserted("user:secret-globex", "pref.seat", "globex-only-value", 0, tenant=FOREIGN, kind="preference",
                 event_id="ev-globex-1", content="globex secret", source=_src("explicit", chat, "g-1")),
        asserted(SUBJECT, "pref.seat", "globex-only-value", 0, tenant=FOREIGN, kind="preference",
                 event_id="ev-globex-2", content="globex secret about its own user 42",
                 source=_src("explicit", chat, "g-2")),
        asserted(LONG_SUBJECT, "meeting.minutes", LONG_VALUE, 2, event_id="ev-long", content=LONG_VALUE,
                 source=_src("imported", "minutes", "q1-review")),
    ]  # fmt: skip


@dataclass
class ConsoleWorld:
    settings: Settings
    pipe: Pipeline
    api: ApiServer

    @property
    def url(self) -> str:
        return self.api.url


@contextmanager
def console_world(settings: Settings) -> Iterator[ConsoleWorld]:
    """`scenario()` applied and indexed on `settings`' private names (keys: CONSOLE_KEYS), and the API serving it."""
    settings = settings.model_copy(update={"api_keys": CONSOLE_KEYS})
    with pipeline(settings, seed=scenario()) as pipe, ApiServer(settings) as api:
        api.wait_ready()
        yield ConsoleWorld(settings, pipe, api)


def produce_malformed(world: ConsoleWorld, name: str, timeout: float = 90.0) -> tuple[int, int]:
    """`MALFORMED[name]` written to the ledger topic as it is; its (partition, offset) once the API lists it as a
    dead letter of its tenant (the worker refused it)."""
    event = MALFORMED[name]
    [(partition, offset)] = publish_raw(
        world.settings, [(kafka_key(event["tenant"], event["subject"]), orjson.dumps(event))]
    )

    def listed() -> bool:
        r = httpx.get(
            f"{world.url}/v1/dead-letters",
            params={"tenant": event["tenant"]},
            headers={"X-API-Key": AUDITOR_KEY},
            timeout=30,
        )
        r.raise_for_status()
        return any((d["partition"], d["offset"]) == (partition, offset) for d in r.json()["dead_letters"])

    wait_for(listed, timeout, 0.3, f"the dead letter {name} at {partition}/{offset}")
    return partition, offset
