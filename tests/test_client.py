"""The read client (api.client) against the real API: `ledger serve` as a child on a free port, on private settings.

The ledger runs as deployed: events through the SDK, the projector worker and the search indexer from
tests/support (pipeline), the API as its own process; the client talks HTTP to it. Each method, sync and
async, returns the API's response model, equal to the JSON the server sent in that very response (captured
with an httpx event hook); errors raise LedgerError carrying the API's error items and status: a 422 names
the field, another tenant is a 403, a PostgreSQL that does not answer is a 503 naming postgres (a second
API child whose DSN points at a port nobody listens on). Two unit tests: the two clients' methods agree,
and importing the client loads no server library.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from api import schemas
from api.client import AsyncLedgerClient, LedgerClient, LedgerError
from infra.private import free_port
from producers.event_schema import SCHEMA_ID, checked_in
from producers.keys.signing import new_signing_key
from producers.settings import REPO_ROOT, ClientSettings, Settings
from tests.conftest import unique
from tests.support import Process, asserted, at, erased, marked, pipeline, publish_raw, wait_for

A, B = "acme", "globex"
KEY_A, KEY_B = "client-key-acme", "client-key-globex"
SUBJECT = "project:P1"
ODD = "team/x y?z%2F#1 é"  # every character a URL reserves: the client escapes, the API reads it back
PORT_TEXT = "Project P1's backend port is {}"
P1_PORT = {"entities": ["P1"], "aliases": ["backend port"]}
GONE, ERASURE_ID = "user:gone", "erase-user-gone"  # a subject erased in the seed: its erasure record is read back

EVENTS = [
    asserted(SUBJECT, "project.port", 8080, 0, **P1_PORT, content=PORT_TEXT.format(8080)),
    asserted(SUBJECT, "project.owner", "ada", 1, entities=["P1"], content="Ada owns project P1"),
    asserted(SUBJECT, "project.port", 9090, 5, **P1_PORT, content=PORT_TEXT.format(9090)),
    marked("memory.confirmed", SUBJECT, "project.owner", 6),
    asserted(ODD, "team.size", 7, 1),
    asserted(SUBJECT, "project.port", 1111, 0, tenant=B, entities=["P1"], content=PORT_TEXT.format(1111)),
    asserted(GONE, "pref.seat", "aisle", 1),
    erased(GONE, tenant=A, event_id=ERASURE_ID),
]  # fmt: skip


class Api(Process):
    """`ledger serve` on a free loopback port, on `settings`."""

    name = "api"

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(settings, ["-m", "infra.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)])

    def start(self, timeout: float = 60.0) -> Api:
        super().start()

        def answers() -> bool:
            self.check()
            try:
                return httpx.get(self.url + "/v1/health", timeout=10).status_code in (200, 503)  # a dead store: ~3 s
            except httpx.TransportError:
                return False

        wait_for(answers, timeout, 0.3, f"the API on {self.url}")
        return self


@dataclass
class Stack:
    settings: Settings
    api: Api
    memory_id: str = ""
    bodies: list[Any] = field(default_factory=list)  # what the server sent, response by response
    pipe: Any = None  # the worker and indexer (tests.support.pipeline): `.settle()` until they applied everything

    def capture(self, response: httpx.Response) -> None:
        response.read()
        self.bodies.append(response.json())

    async def acapture(self, response: httpx.Response) -> None:
        await response.aread()
        self.bodies.append(response.json())

    def client(self, key: str | None = KEY_A, tenant: str | None = A) -> LedgerClient:
        http = httpx.Client(event_hooks={"response": [self.capture]})
        return LedgerClient(self.api.url, api_key=key or "", tenant=tenant, timeout=30, http=http)

    def aclient(self, key: str | None = KEY_A, tenant: str | None = A) -> AsyncLedgerClient:
        http = httpx.AsyncClient(event_hooks={"response": [self.acapture]})
        return AsyncLedgerClient(self.api.url, api_key=key or "", tenant=tenant, timeout=30, http=http)


@pytest.fixture(scope="module")
def stack(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    chain_key = tmp_path_factory.mktemp("client") / "chain-key"  # receipts are signed with it
    chain_key.write_bytes(new_signing_key())
    chain_key.chmod(0o600)
    settings = base_settings.private(unique("cl"), api_keys={KEY_A: [A], KEY_B: [B]}, chain_key_file=chain_key)
    with pipeline(settings, seed=EVENTS) as pipe, Api(settings) as api:
        pipe.worker.check()
        st = Stack(settings, api, pipe=pipe)
        with st.client() as c:
            st.memory_id = next(f.memory_id for f in c.facts(SUBJECT).facts if f.key == "project.port")
        yield st


# (label, method name, args, kwargs, response model, what the answer must show)
CALLS: list[tuple[str, str, tuple, dict[str, Any], type, Any]] = [
    ("recall", "recall", ("P1 backend port",), {}, schemas.RecallResponse, lambda r: r.hits[0].value == 9090),
    ("recall as_of", "recall", ("P1 backend port",), {"as_of": at(2)}, schemas.RecallResponse,
     lambda r: r.hits[0].value == 8080 and r.hits[0].match.stage == "exact"),
    ("recall filters", "recall", ("who owns P1",), {"mode": "keyword", "top_k": 3, "filters": {"key": "project.owner"}},
     schemas.RecallResponse, lambda r: [h.key for h in r.hits] == ["project.owner"]),
    ("context", "context", (SUBJECT, "what is the backend port of P1?"), {"budget_tokens": 400},
     schemas.ContextResponse, lambda r: r.lines[0].value == 9090 and r.lines[0].matched and "9090" in r.text),
    ("context with history", "context", (SUBJECT,), {"include_history": True, "as_of": at(7), "top_k": 2},
     schemas.ContextResponse, lambda r: ("history", 8080) in [(line.status, line.value) for line in r.lines]),
    ("facts", "facts", (SUBJECT,), {}, schemas.FactsResponse,
     lambda r: {f.key: f.value for f in r.facts} == {"project.port": 9090, "project.owner": "ada"}),
    ("facts as_of", "facts", (SUBJECT,), {"as_of": at(2)}, schemas.FactsResponse,
     lambda r: {f.key: f.value for f in r.facts} == {"project.port": 8080, "project.owner": "ada"}),
    ("facts known_at", "facts", (SUBJECT,), {"known_at": "2026-03-03T00:00:00+00:00"}, schemas.FactsResponse,
     lambda r: {f.key: f.value for f in r.facts} == {"project.port": 8080, "project.owner": "ada"}),
    ("facts, reserved characters", "facts", (ODD,), {}, schemas.FactsResponse,
     lambda r: r.subject == ODD and [f.value for f in r.facts] == [7]),
    ("history", "history", ("{memory_id}",), {}, schemas.HistoryResponse,
     lambda r: [v.value for v in r.versions] == [8080, 9090] and r.versions[0].status == "superseded"),
    ("events", "events", (SUBJECT,), {}, schemas.EventsResponse,
     lambda r: [e.type for e in r.events].count("memory.asserted") == 3 and len(r.events) == 4),
    ("events page", "events", (SUBJECT,), {"limit": 3}, schemas.EventsResponse,
     lambda r: len(r.events) == 3 and r.more and r.next_cursor == f"{r.events[-1].partition}:{r.events[-1].offset}"),
    ("events window", "events", (SUBJECT,), {"from_": at(1), "to": at(5.5), "limit": 10}, schemas.EventsResponse,
     lambda r: [e.event["value"] for e in r.events] == ["ada", 9090]),
    ("stats", "stats", (), {}, schemas.StatsResponse,
     lambda r: r.tenant == A and r.double_active == 0 and r.events_applied == 6 and r.total_lag == 0),  # 7, one purged
    ("consistency", "consistency", (), {}, schemas.ConsistencyResponse, lambda r: r.tenant == A and r.consistent),
    ("tenants", "tenants", (), {}, schemas.TenantsResponse, lambda r: r.tenants == [A]),
    ("subjects", "subjects", ("project:",), {}, schemas.SubjectsResponse,
     lambda r: r.subjects == [SUBJECT] and not r.more),
    ("subjects, limit", "subjects", (), {"limit": 1}, schemas.SubjectsResponse,
     lambda r: len(r.subjects) == 1 and r.more),
    ("erasures", "erasures", (), {}, schemas.ErasuresResponse,
     lambda r: [e.erasure_id for e in r.erasures] == [ERASURE_ID] and r.erasures[0].records.total == 1),
    ("erasure", "erasure", (ERASURE_ID,), {}, schemas.ErasureRecord,
     lambda r: r.erasure_id == ERASURE_ID and r.ledger is not None),
    ("health", "health", (), {}, schemas.HealthResponse, lambda r: r.status == "ok" and r.parts.postgres.ok),
    ("event schema", "event_schema", (), {}, schemas.EventSchemaDocument,
     lambda r: r.id_ == SCHEMA_ID and r.model_dump(by_alias=True) == json.loads(checked_in())),
]  # fmt: skip


def _dumped(result: Any) -> Any:
    return result.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _args(st: Stack, args: tuple) -> tuple:
    return tuple(a.format(memory_id=st.memory_id) if a == "{memory_id}" else a for a in args)


@pytest.mark.parametrize(("label", "method", "args", "kwargs", "model", "shows"), CALLS, ids=[c[0] for c in CALLS])
def test_each_method_returns_the_api_model_equal_to_the_raw_json_sync(
    stack: Stack, label, method, args, kwargs, model, shows
):
    with stack.client() as client:
        result = getattr(client, method)(*_args(stack, args), **kwargs)
    assert type(result) is model, (label, type(result))
    assert _dumped(result) == stack.bodies[-1], label
    assert shows(result), (label, _dumped(result))


@pytest.mark.parametrize(("label", "method", "args", "kwargs", "model", "shows"), CALLS, ids=[c[0] for c in CALLS])
def test_each_method_returns_the_api_model_equal_to_the_raw_json_async(
    stack: Stack, label, method, args, kwargs, model, shows
):
    async def call() -> Any:
        async with stack.aclient() as client:
            return await getattr(client, method)(*_args(stack, args), **kwargs)

    result = asyncio.run(call())
    assert type(result) is model, (label, type(result))
    assert _dumped(result) == stack.bodies[-1], label
    assert shows(result), (label, _dumped(result))


def test_the_context_text_is_the_text_form_byte_for_byte(stack: Stack) -> None:
    """`context(...).text` is what POST /v1/context answers with format=text (what a prompt gets)."""
    ask = {"tenant": A, "subject": SUBJECT, "question": "P1 backend port", "as_of": "2026-03-08T00:00:00Z"}
    raw = httpx.post(stack.api.url + "/v1/context", json=ask, headers={"X-API-Key": KEY_A}, timeout=30)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/plain"), raw.text
    with stack.client() as c:
        assert c.context(SUBJECT, "P1 backend port", as_of="2026-03-08T00:00:00Z").text == raw.text


def _refused(call) -> LedgerError:
    with pytest.raises(LedgerError) as refused:
        call()
    return refused.value


def test_a_422_names_the_field_and_carries_the_api_error_body(stack: Stack) -> None:
    from datetime import datetime

    with stack.client() as c:
        cases = [
            (lambda: c.facts(SUBJECT, as_of="yesterday"), "invalid_time", "as_of"),
            (lambda: c.facts(SUBJECT, as_of=datetime(2026, 3, 2)), "invalid_time", "as_of"),  # naive: no offset
            (lambda: c.events(SUBJECT, from_=1700000000), "invalid_time", "from"),
            (lambda: c.events(SUBJECT, cursor="0:x"), "invalid_value", "cursor"),
            (lambda: c.recall("P1", top_k=0), "invalid_value", "top_k"),
            (lambda: c.context(SUBJECT, budget_tokens=10), "invalid_value", "budget_tokens"),
            (lambda: c.recall("P1", mode="psychic"), "unknown_value", "mode"),
            (lambda: c.recall("P1", filters={"kind": "mood"}), "invalid_value", "filters.kind"),
            (lambda: c.facts("bad\x00subject"), "unstorable_text", "subject"),
        ]
        for call, code, field_ in cases:
            err = _refused(call)
            assert (err.status, err.code, err.field) == (422, code, field_), (code, str(err))
            assert err.as_dict() == stack.bodies[-1] and err.store is None
    with stack.client(tenant=None) as c:  # no tenant anywhere: the server says which field is missing
        err = _refused(lambda: c.facts(SUBJECT))
        assert (err.status, err.code, err.field) == (422, "missing_field", "tenant")


def test_another_tenant_is_a_403_error_object_and_each_key_sees_its_own(stack: Stack) -> None:
    with stack.client() as c:
        for call in (
            lambda: c.facts(SUBJECT, tenant=B),
            lambda: c.recall("P1 backend port", tenant=B),
            lambda: c.history(stack.memory_id, tenant=B),
            lambda: c.events(SUBJECT, tenant=B),
            lambda: c.stats(tenant=B),
        ):
            err = _refused(call)
            assert (err.status, err.code, err.field) == (403, "forbidden_tenant", "tenant"), str(err)
            assert err.as_dict() == stack.bodies[-1]
            assert "globex" in err.message
    with stack.client(KEY_B, B) as c:
        assert [f.value for f in c.facts(SUBJECT).facts] == [1111]
        assert _refused(lambda: c.history(stack.memory_id)).status == 404  # acme's fact is not globex's

    async def other_tenant() -> LedgerError:
        async with stack.aclient() as c:
            try:
                await c.facts(SUBJECT, tenant=B)
            except LedgerError as exc:
                return exc
        raise AssertionError("no error")

    err = asyncio.run(other_tenant())
    assert (err.status, err.code, err.field) == (403, "forbidden_tenant", "tenant")


def test_401_404_and_no_answer_are_the_same_exception(stack: Stack) -> None:
    with stack.client(key=None) as c:
        err = _refused(lambda: c.facts(SUBJECT))
        assert (err.status, err.code, err.field) == (401, "unauthorized", "X-API-Key")
        assert c.event_schema().id_ == SCHEMA_ID  # the public contract needs no key
    with stack.client(key="not-a-key") as c:
        assert _refused(lambda: c.stats()).code == "unauthorized"
    with stack.client() as c:
        err = _refused(lambda: c.history("no-such-fact"))
        assert (err.status, err.code, err.field) == (404, "not_found", "memory_id")
    with LedgerClient(f"http://127.0.0.1:{free_port()}", api_key=KEY_A, tenant=A, timeout=2) as c:
        err = _refused(lambda: c.facts(SUBJECT))
        assert err.status is None and err.code == "api_unreachable" and err.message.startswith("api: ")
    with LedgerClient(stack.api.url, api_key=KEY_A, tenant=A) as c:
        pass
    assert _refused(lambda: c.stats()).code == "client_closed"  # after its with block: the one exception too

    async def closed_async() -> LedgerError:
        async with AsyncLedgerClient(stack.api.url, api_key=KEY_A, tenant=A) as ac:
            pass
        try:
            await ac.stats()
        except LedgerError as exc:
            return exc
        raise AssertionError("a closed async client answered")

    assert asyncio.run(closed_async()).code == "client_closed"


def test_a_store_that_does_not_answer_is_a_503_naming_it(stack: Stack) -> None:
    """A second API child whose PostgreSQL DSN points at a port nobody listens on (nothing is stopped)."""
    dead_pg = stack.settings.pg_dsn.replace(f":{stack.settings.pg_host_port[1]}/", f":{free_port()}/")
    assert dead_pg != stack.settings.pg_dsn
    with Api(stack.settings.model_copy(update={"pg_dsn": dead_pg, "pg_connect_timeout_s": 2})) as api:
        with LedgerClient(api.url, api_key=KEY_A, tenant=A, timeout=30) as c:
            err = _refused(lambda: c.facts(SUBJECT))
            assert (err.status, err.code, err.store) == (503, "store_unavailable", "postgres"), str(err)
            health = c.health()  # an answer, not an exception: the parts say what is down
            assert health.status == "degraded" and not health.parts.postgres.ok and health.parts.kafka.ok
            assert [item.message.split(":")[0] for item in health.detail or []] == ["postgres"]


def _refusing(record: dict[str, Any], n: int) -> list[tuple[bytes, bytes]]:
    """n copies of `record` (event ids -0, -1, ...) of acme, written as a producer that skips the contract writes them:
    each one the worker refuses is a dead letter."""
    key = f"{A}|{record['subject']}".encode()
    return [(key, json.dumps(record | {"event_id": f"{record['subject']}-{i}"}).encode()) for i in range(n)]


def _in_mode(stack: Stack, mode: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call of a client method with the sync or the async client."""
    if mode == "sync":
        with stack.client() as c:
            return getattr(c, method)(*args, **kwargs)

    async def call() -> Any:
        async with stack.aclient() as c:
            return await getattr(c, method)(*args, **kwargs)

    return asyncio.run(call())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_operator_lists_opens_redrives_and_discards_dead_letters(stack: Stack, mode: str) -> None:
    """The dead-letter routes through the client: each answer is the route's model, equal to the JSON sent; a re-drive
    and a discard are events the worker applies (the letters then read redriven and discarded, the corrected fact
    is in force); a second action, another tenant, a position without a letter and a bad event are LedgerErrors."""
    subject = f"user:dead-{mode}"
    broken = {"type": "memory.asserted", "tenant": A, "subject": subject, "key": "pref.meal", "value": "veg"}
    publish_raw(stack.settings, _refusing(broken, 3))  # no content: refused by the worker
    stack.pipe.settle()

    def call(model: type, method: str, *args: Any, **kwargs: Any) -> Any:
        result = _in_mode(stack, mode, method, *args, **kwargs)
        assert type(result) is model and _dumped(result) == stack.bodies[-1], (method, result)
        return result

    page = call(schemas.DeadLettersResponse, "dead_letters", state="open")
    mine = [d for d in page.dead_letters if (d.event_id or "").startswith(f"{subject}-")]
    assert len(mine) == 3 and {(d.state, d.reason.code, d.reason.field) for d in mine} == {
        ("open", "missing_field", "content")
    }, mine
    one = call(schemas.DeadLettersResponse, "dead_letters", state="open", limit=1)
    assert len(one.dead_letters) == 1 and one.next is not None
    two = call(schemas.DeadLettersResponse, "dead_letters", state="open", limit=1, after=one.next)
    assert (two.dead_letters[0].partition, two.dead_letters[0].offset) > (
        one.dead_letters[0].partition,
        one.dead_letters[0].offset,
    )

    first, second, third = mine
    opened = call(schemas.DeadLetterRecord, "dead_letter", first.partition, first.offset)
    assert opened.record == broken | {"event_id": first.event_id} and opened.state == "open", opened
    fixed = broken | {"content": f"{subject} eats vegetarian"}
    redriven = call(schemas.DeadLetterAction, "redrive_dead_letter", first.partition, first.offset, fixed)
    assert (redriven.dead_letter.partition, redriven.dead_letter.offset, redriven.effect) == (
        first.partition,
        first.offset,
        "pending",
    )
    discarded = call(schemas.DeadLetterAction, "discard_dead_letter", second.partition, second.offset, "a test record")
    assert discarded.event_id == f"deadletter:{second.partition}:{second.offset}" and not discarded.duplicate
    stack.pipe.settle()

    now = {(d.partition, d.offset): d for d in call(schemas.DeadLettersResponse, "dead_letters").dead_letters}
    assert now[first.partition, first.offset].state == "redriven"
    assert now[first.partition, first.offset].resolution.event_id == redriven.event_id
    assert now[second.partition, second.offset].state == "discarded"
    assert now[second.partition, second.offset].resolution.reason == "a test record"
    assert now[third.partition, third.offset].state == "open"
    assert [f.value for f in call(schemas.FactsResponse, "facts", subject).facts] == ["veg"]  # the correction holds

    refusals = [
        (("discard_dead_letter", first.partition, first.offset, "again"), {}, (409, "dead_letter_resolved", "offset")),
        (("redrive_dead_letter", third.partition, third.offset, broken), {}, (422, "missing_field", "event.content")),
        (("dead_letter", third.partition, 2**40), {}, (404, "not_found", "offset")),
        (("dead_letters",), {"tenant": B}, (403, "forbidden_tenant", "tenant")),
        (("dead_letters",), {"after": "not-a-position"}, (422, "invalid_value", "after")),
    ]
    for args, kwargs, expected in refusals:
        err = _refused(lambda args=args, kwargs=kwargs: _in_mode(stack, mode, *args, **kwargs))
        assert (err.status, err.code, err.field) == expected, (args, str(err))
        assert err.as_dict() == stack.bodies[-1]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_receipt_from_an_answer_verifies_and_replays_through_the_client(stack: Stack, mode: str) -> None:
    """An answer's receipt, as the client's model gave it, verifies (with the answer: its digest holds) and replays to
    the same answer; one byte changed does not verify; another tenant's key is refused. Each answer is the route's
    model, equal to the JSON the server sent."""

    def call(model: type, method: str, *args: Any, **kwargs: Any) -> Any:
        result = _in_mode(stack, mode, method, *args, **kwargs)
        assert type(result) is model and _dumped(result) == stack.bodies[-1], (method, result)
        return result

    facts = call(schemas.FactsResponse, "facts", SUBJECT)
    checked = call(schemas.ReceiptVerification, "verify_receipt", facts.receipt, answer=facts)
    assert checked.valid and checked.signature == "valid" and checked.answer is True, checked
    assert {c.state for c in checked.cited} == {"held"} and len(checked.cited) == len(facts.facts)
    replayed = call(schemas.ReceiptReplay, "replay_receipt", facts.receipt, {"subject": SUBJECT})
    assert replayed.same and replayed.identical, replayed

    recall = call(schemas.RecallResponse, "recall", "P1 backend port")
    assert call(schemas.ReceiptVerification, "verify_receipt", recall.receipt.model_dump(by_alias=True)).valid

    digest = _dumped(facts.receipt)["answer_digest"]  # one character changed: never to itself (a digest may start "0")
    changed = _dumped(facts.receipt) | {"answer_digest": ("1" if digest[0] == "0" else "0") + digest[1:]}
    forged = call(schemas.ReceiptVerification, "verify_receipt", changed)
    assert not forged.valid and forged.signature == "invalid", forged
    other = _refused(lambda: _in_mode(stack, mode, "verify_receipt", facts.receipt, tenant=B))
    assert (other.status, other.code, other.field) == (403, "forbidden_tenant", "tenant")


# the routes no client method calls, and why; every other route is a method (by its operationId, or the name here)
NOT_IN_THE_CLIENT = {
    "publish_events": "publishing is the SDK's (producers.sdk writes to Kafka)",
    "erase_subject": "erasing is the SDK's (LedgerProducer.erase_subject)",
    "data_keys": "a sealing producer's, through the key provider (producers.keys)",
    "retire_key": "the key provider's, before it publishes an erasure (producers.keys)",
}
METHOD_FOR = {"list_dead_letters": "dead_letters", "open_dead_letter": "dead_letter", "find_subjects": "subjects"}


@pytest.mark.unit
def test_every_route_is_a_client_method_or_says_why_not() -> None:
    """A new route must be a method of both clients or say here why it is not one, so no door is missing from it."""
    from api.main import create_app

    paths = create_app().openapi()["paths"].values()
    operations = {op["operationId"] for path in paths for op in path.values()}
    assert set(NOT_IN_THE_CLIENT) <= operations, set(NOT_IN_THE_CLIENT) - operations  # no stale entry
    wanted = {METHOD_FOR.get(op, op) for op in operations - set(NOT_IN_THE_CLIENT)}
    methods = {n for n, f in vars(LedgerClient).items() if not n.startswith("_") and callable(f)} - {"close"}
    assert wanted == methods, {"routes without a method": wanted - methods, "methods without a route": methods - wanted}


@pytest.mark.unit
def test_the_sync_and_async_clients_have_the_same_methods() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {n: inspect.signature(f) for n, f in vars(cls).items() if not n.startswith("_") and callable(f)}

    sync, async_ = public(LedgerClient), public(AsyncLedgerClient)
    assert set(sync) - {"close"} == set(async_) - {"aclose"}
    for name in set(sync) - {"close"}:
        assert inspect.iscoroutinefunction(getattr(AsyncLedgerClient, name)), name
        s, a = sync[name], async_[name]
        assert list(s.parameters) == list(a.parameters) and s.return_annotation == a.return_annotation, name


@pytest.mark.unit
def test_settings_give_what_arguments_do_not() -> None:
    with LedgerClient(settings=ClientSettings(timeout_s=4.5)) as c:
        assert (c.url, c.timeout, c._headers) == ("http://127.0.0.1:8000", 4.5, {})
    s = ClientSettings(url="https://ledger.example/", api_key="k1")
    with LedgerClient(settings=s, timeout=1.0) as c:
        assert (c.url, c.timeout, c._headers) == ("https://ledger.example", 1.0, {"X-API-Key": "k1"})
    with LedgerClient("http://h:1", api_key="k2", timeout=2.0, settings=s) as c:  # arguments win
        assert (c.url, c.timeout, c._headers) == ("http://h:1", 2.0, {"X-API-Key": "k2"})


# what a client's machine may hold: no LEDGER_DEVELOPMENT (the development key is then refused), or a server
# setting a client has no use for that the server would refuse
SERVER_SETTINGS_A_CLIENT_IGNORES = (
    {},
    {"LEDGER_API_KEYS": '{"dev-key": ["demo"]}'},
    {"LEDGER_PG_DSN": "postgresql://ledger:ledger@db:5432/ledger", "LEDGER_API_PORT": "not-a-port"},
    {"LEDGER_PG_SCHEMA": "Not A Schema", "LEDGER_API_KEYS": "{not json"},
)
CONSTRUCTIONS = """
import asyncio, json, sys
import producers.settings
from api.client import AsyncLedgerClient, LedgerClient

def built():
    yield LedgerClient("http://127.0.0.1:8000", api_key="dev-key", tenant="demo")
    yield LedgerClient(api_key="dev-key", tenant="demo")
    yield LedgerClient()
    yield AsyncLedgerClient("http://127.0.0.1:8000", api_key="dev-key", tenant="demo")
    yield AsyncLedgerClient(api_key="dev-key", tenant="demo")
    yield AsyncLedgerClient()

seen = [(c.url, c.timeout, c._headers) for c in built()]
print(json.dumps({"seen": seen, "server_settings_read": producers.settings.get_settings.cache_info().misses}))
"""


@pytest.mark.unit
@pytest.mark.parametrize("env", SERVER_SETTINGS_A_CLIENT_IGNORES, ids=lambda e: ",".join(e) or "no-development")
def test_a_client_reads_none_of_the_servers_settings(env: dict[str, str]) -> None:
    """Every way of building either client, in an environment whose server settings would not load: it builds,
    from its own arguments and LEDGER_CLIENT_* only, and the server's settings are never read."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env = {**clean, **env, "LEDGER_CLIENT_TIMEOUT_S": "3.5"}
    done = subprocess.run(
        [sys.executable, "-c", CONSTRUCTIONS], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["server_settings_read"] == 0
    keyed = {"X-API-Key": "dev-key"}
    assert [tuple(x) for x in out["seen"]] == 2 * [
        ("http://127.0.0.1:8000", 3.5, keyed),
        ("http://127.0.0.1:8000", 3.5, keyed),
        ("http://127.0.0.1:8000", 3.5, {}),
    ]


SERVER_LIBRARIES = ("fastapi", "starlette", "uvicorn", "psycopg", "psycopg_pool", "elasticsearch", "kafka", "aiokafka",
                    "faust", "fastembed", "onnxruntime", "numpy")  # fmt: skip


@pytest.mark.unit
def test_importing_the_client_loads_no_server_library() -> None:
    code = (
        "import json, sys, time; t = time.perf_counter(); import api.client; "
        "print(json.dumps([round(time.perf_counter() - t, 3), sorted({m.split('.')[0] for m in sys.modules})]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    seconds, modules = json.loads(out.stdout)
    loaded = sorted(set(SERVER_LIBRARIES) & set(modules))
    assert not loaded, f"importing api.client loads {loaded} (api.schemas must stay light)"
    print(f"import api.client: {seconds} s")


def test_the_sdk_refuses_what_the_api_door_refuses_beyond_the_contract(stack: Stack) -> None:
    """The class: the contract takes these (the worker applies one a raw producer wrote), but no door publishes
    them: `.`/`..` as a segment of an asserted subject or of any event id (`team/../x` is `x` to a client that
    resolves its path), and an event naming a dead letter outside the dead-letter workflow. The SDK (and so
    `ledger publish`) used to publish them all; it now refuses each with the door's code and field, before anything
    is sent."""
    from producers.sdk import InvalidEvent, LedgerProducer

    base = {"type": "memory.asserted", "tenant": B, "subject": "sdk-door", "key": "k", "value": 1, "content": "c"}
    letter = {"partition": 0, "offset": 1}
    cases = [
        {**base, "subject": "."},
        {**base, "event_id": ".."},
        {**base, "subject": "team/../x"},  # a client erasing it would erase `x`
        {**base, "subject": "team/./x"},
        {**base, "event_id": "a/.."},
        {"type": "memory.retracted", "tenant": B, "subject": "sdk-door", "key": "k", "event_id": "."},
        {**base, "event_id": "sdk-door-redrive", "dead_letter": letter},
        {"type": "deadletter.discarded", "tenant": B, "subject": "sdk-door", "reason": "r", "dead_letter": letter},
    ]
    with LedgerProducer(stack.settings) as producer:
        for event in cases:
            r = httpx.post(f"{stack.api.url}/v1/events", json={"events": [event]}, headers={"X-API-Key": KEY_B})
            (result,) = r.json()["results"]
            assert not result["accepted"], (event, r.text)
            with pytest.raises(InvalidEvent) as refused:
                producer.check(event)
            assert (refused.value.code, f"events.0.{refused.value.field}") == (
                result["error"]["code"],
                result["error"]["field"],
            ), event
            with pytest.raises(InvalidEvent):
                producer.publish(event)
        [sent] = producer.send_many(cases[:1] + [{**base, "event_id": "sdk-door-fine"}], report_invalid=True)[1:]
        assert not isinstance(sent, InvalidEvent), sent


@pytest.mark.parametrize("name", [".", ".."])
def test_an_id_or_subject_that_is_a_dot_segment_is_refused_at_the_door_and_reached_as_itself(
    stack: Stack, name: str
) -> None:
    """Clients resolve `.` and `..` in a path as dot segments (a browser even when spelled %2E): the door refuses
    them as a subject or event id, naming the field. One another producer wrote (the SDK takes it) is still reached
    as itself by the client, which spells it %2E (httpx and curl keep that), never as the route above it."""
    event = {"type": "memory.asserted", "tenant": B, "event_id": f"dot-{len(name)}", "subject": f"dot-{len(name)}",
             "key": "k", "value": 1, "content": "dot"}  # fmt: skip
    headers = {"X-API-Key": KEY_B}
    for named in ("subject", "event_id"):
        r = httpx.post(
            f"{stack.api.url}/v1/events", json={"events": [{**event, named: name}]}, headers=headers, timeout=30
        )
        (result,) = r.json()["results"]
        assert not result["accepted"] and result["error"]["field"] == f"events.0.{named}", r.text
    own = {**event, "event_id": name, "subject": name}  # a raw producer's: the SDK refuses it as the door does
    publish_raw(stack.settings, [(f"{B}|{name}".encode(), json.dumps(own).encode())])
    stack.pipe.settle()
    with stack.client(KEY_B, B) as c:
        assert c.event_status(name).event_id == name
        facts = c.facts(name)
        assert facts.subject == name and [f.content for f in facts.facts] == ["dot"], facts
        assert c.history(facts.facts[0].memory_id).versions[0].event_id == name
        assert [e.event_id for e in c.events(name).events] == [name]
    erased = httpx.delete(f"{stack.api.url}/v1/subjects/%2E{'%2E' * (len(name) - 1)}", params={"tenant": B},
                          headers=headers, timeout=30)  # fmt: skip
    assert erased.status_code == 202 and erased.json()["subject"] == name, erased.text
    stack.pipe.settle()
    with stack.client(KEY_B, B) as c:
        assert c.facts(name).facts == []


@pytest.mark.unit
@pytest.mark.parametrize("client_class", [LedgerClient, AsyncLedgerClient])
def test_every_failure_is_a_ledger_error_even_one_no_request_can_carry(client_class: type) -> None:
    """The class: `every failure one LedgerError`. A lone surrogate in any text argument of any method (no URL or
    body can carry it: httpx raised UnicodeEncodeError), a timeout that is no time, or a key no header can carry
    (refused by httpx at each request and reported as an API that does not answer) is refused before anything is
    sent, in the API's error shape, naming the argument. Nothing here reaches a server (nobody listens on it)."""
    from api.client import _Base, _Route

    nowhere = f"http://127.0.0.1:{free_port()}"
    refused = [({"timeout": 0}, "timeout"), ({"timeout": -1}, "timeout"), ({"timeout": float("nan")}, "timeout"),
               ({"timeout": True}, "timeout"), ({"api_key": "k\r\nX-Other: 1"}, "api_key"),
               ({"api_key": "ké"}, "api_key")]  # fmt: skip
    refused += [({"api_key": b"k"}, "api_key", "wrong_type"), ({"tenant": "a\ud800"}, "tenant", "unstorable_text")]
    for kwargs, named, *code in refused:
        with pytest.raises(LedgerError) as err:
            client_class(nowhere, **kwargs)
        assert (err.value.status, err.value.code, err.value.field) == (None, *(code or ["invalid_value"]), named)
    client = client_class(nowhere, api_key="k", tenant=A, timeout=2)
    bad = "x\ud800y"
    samples = {"int": 1, "Mapping[str, Any]": {"k": "v"}, "Mapping[str, Any] | BaseModel": {"k": "v"}}
    checked = 0
    for name, route in vars(_Base).items():
        if not isinstance(route, _Route):
            continue
        params = [p for p in inspect.signature(route.ask).parameters.values() if p.name != "self"]
        required = {p.name: samples.get(p.annotation, "ok") for p in params if p.default is inspect.Parameter.empty}
        for p in params:
            if "str" not in str(p.annotation) or p.name == "mode":
                continue
            value = {"k": bad} if "Mapping" in str(p.annotation) else bad
            with pytest.raises(LedgerError) as err:
                answer = getattr(client, name)(**{**required, p.name: value})
                if inspect.isawaitable(answer):
                    asyncio.run(answer)
            assert (err.value.code, err.value.field) == ("unstorable_text", p.name), (name, p.name, err.value)
            checked += 1
            if p.annotation in ("str", "str | None"):  # bytes or a number for a text: the wrong type, named
                with pytest.raises(LedgerError) as err:
                    answer = getattr(client, name)(**{**required, p.name: b"x"})
                    if inspect.isawaitable(answer):
                        asyncio.run(answer)
                assert (err.value.code, err.value.field) == ("wrong_type", p.name), (name, p.name, err.value)
    assert checked >= 30, checked
    with pytest.raises(LedgerError) as err:  # a number key holding a lone surrogate, deep in a filter
        answer = client.recall("x", filters={1: "\ud800"})
        if inspect.isawaitable(answer):
            asyncio.run(answer)
    assert (err.value.code, err.value.field) == ("unstorable_text", "filters"), err.value
    with pytest.raises(LedgerError) as err:  # a path longer than a URL may be
        answer = client.facts("x" * 1_000_000)
        if inspect.isawaitable(answer):
            asyncio.run(answer)
    assert (err.value.status, err.value.field) == (None, "url"), err.value


@pytest.mark.unit
@pytest.mark.parametrize("client_class", [LedgerClient, AsyncLedgerClient])
def test_an_answer_trickled_past_the_timeout_is_an_api_timeout(client_class: type) -> None:
    """httpx bounds each read, not the answer: a server sending its body a byte at a time (a read never waits long)
    held a call for as long as it liked (a 55-byte answer at a byte a second: 54 s with a 2 s timeout)."""
    import socket
    import threading
    import time

    body = b'{"status": "ok", "stores": {}, "padding": "' + b"x" * 200 + b'"}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(head)  # the answer begins at once; its body comes slowly
            for byte in body:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=trickle, daemon=True).start()
    client = client_class(f"http://127.0.0.1:{server.getsockname()[1]}", api_key="k", timeout=1)
    began = time.monotonic()
    try:
        with pytest.raises(LedgerError) as err:
            answer = client.health()
            if inspect.isawaitable(answer):
                asyncio.run(answer)
    finally:
        stop.set()
        server.close()
    took = time.monotonic() - began
    assert (err.value.status, err.value.code) == (None, "api_timeout") and took < 5, (err.value, took)


@pytest.mark.unit
@pytest.mark.parametrize("client_class", [LedgerClient, AsyncLedgerClient])
def test_an_argument_of_a_shape_no_call_reads_is_a_ledger_error(client_class: type) -> None:
    """A NaN, a filter that is text, a receipt that is no object: each raised Python's own error (ValueError,
    AttributeError, TypeError) where every failure is one LedgerError. Nothing here reaches a server."""
    client = client_class(f"http://127.0.0.1:{free_port()}", api_key="k", tenant=A, timeout=2)
    calls = [
        (lambda: client.recall("x", top_k=float("nan")), "top_k"),
        (lambda: client.verify_receipt({"x": float("inf")}), "receipt"),
        (lambda: client.recall("x", filters="abc"), None),
        (lambda: client.recall("x", filters={"tags": 5}), None),
        (lambda: client.redrive_dead_letter(0, 1, [1, 2]), None),
        (lambda: client.verify_receipt("abc"), None),
        (lambda: client.replay_receipt({}, "abc"), None),
    ]
    for make, named in calls:
        with pytest.raises(LedgerError) as err:
            answer = make()
            if inspect.isawaitable(answer):
                asyncio.run(answer)
        assert (err.value.status, err.value.code, err.value.field) == (None, "invalid_value", named), err.value
