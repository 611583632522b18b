"""Availability: no tenant's largest legal request, on any route or MCP tool, stalls another tenant's reads.

The class test: for every route of the app (its OpenAPI paths and its own routes and mounts) and every MCP
tool, an attacker tenant sends that route's largest legal input, several at once, for a bounded time, while a
victim tenant reads its own small subject (`GET /v1/subjects/{s}/facts`, or the MCP `facts` tool on the MCP
server); the victim's p99 latency under attack may exceed its p99 with the attacker idle, measured just before
in the same test, by at most 100 ms. The servers are real child processes (`ledger serve`, `ledger mcp
--transport http`), so their event loops are the loops that would stall; the attacker runs in a process of its
own, so the test's own client work never delays the victim's measurement.

`ATTACKS` and `TOOL_ATTACKS` are derived-checked: a route (`tests.support.routes.app_routes`) or tool without an
entry fails `test_every_route_and_tool_has_an_attack`, so a new door cannot skip the test.

Latencies are counted as an open-loop victim would see them (a call held up by a stall also holds up the calls it
would have sent meanwhile: `_open_loop`), so one long stall is not a single sample among hundreds. The attacker
sends one request at a time, back to back; the routes with a bound on bursts get bursts (`BURSTS`). The machine is
shared (2 cores, other suites running): a stall is reproducible and a spike of the machine is not, so a failing
measurement is taken once more and the better of the two is judged.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import httpx
import pydantic
import pytest
from fastapi.testclient import TestClient

from api.errors import ApiError
from api.limits import Bulkhead
from api.main import create_app
from api.mcp.tools import TOOLS
from api.requests import MAX_CITED
from producers.settings import Settings
from tests.conftest import unique
from tests.support import asserted, pipeline
from tests.support.routes import app_routes
from tests.support.servers import ApiServer, McpHttpServer

ATTACKER, VICTIM = "attacker", "victim"
KEYS = {"k-attacker": [ATTACKER], "k-victim": [VICTIM]}
HA = {"X-API-Key": "k-attacker"}
BIG = "user:big"  # the attacker's subject: 60 facts with ~80,000-character values (the largest that fit an event)
ERASE_HTTP, ERASE_MCP = "user:erase-http", "user:erase-mcp"
VICTIM_SUBJECT = "user:v"
LONG_QUERY = ("which value " + " ".join(f"w{i}" for i in range(400)))[:2000]  # the longest legal question

BASELINE_S, ATTACK_S = 1.0, 2.0  # victim sampling with the attacker idle, then busy
# the attacker's requests in flight at once: one, back to back (a tenant's largest request, not a flood: sharing a
# loaded server among many requests is not a stall), and bursts where a bound must hold them (429, one at a time)
CONCURRENCY = 1
BURSTS = {("GET", "/v1/stats/consistency"): 40, ("POST", "/v1/context"): 2, "context": 2}
MAX_ATTACKS = 400  # and at most this many in one measurement
ALLOWED_DELAY_S = 0.100  # p99 delta


def _words(n: int, seed: int) -> str:
    """About `n` characters of English-like words (deterministic): what a real long value costs to tokenize."""
    rng = random.Random(seed)
    vocab = ["ledger", "memory", "window", "seat", "project", "backend", "port", "value", "the", "of", "preference"]
    vocab += ["configuration", "东京", "überprüfung", "x86_64", "2026-03-01", "https://example.org/a?b=c"]
    out: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(vocab)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def _seed() -> list:
    big = [
        asserted(BIG, f"note.k{i:02d}", _words(80_000, i), 0, tenant=ATTACKER, content=f"big note {i}", importance=0.5)
        for i in range(50)
    ]
    big += [  # new versions of ten of them: history lines for include_history
        asserted(BIG, f"note.k{i:02d}", _words(80_000, 100 + i), 1, tenant=ATTACKER, content=f"big note {i} again")
        for i in range(10)
    ]
    erasable = [
        asserted(s, f"k{i}", _words(2_000, i), 0, tenant=ATTACKER) for s in (ERASE_HTTP, ERASE_MCP) for i in range(5)
    ]
    victim = [asserted(VICTIM_SUBJECT, f"pref.k{i}", f"v{i}", 0, tenant=VICTIM) for i in range(3)]
    return big + erasable + victim


# -- the largest legal input of each route ----------------------------------------------------------------------

Request = tuple[str, str, dict[str, Any]]  # method, path (from the server's root), httpx keyword arguments


def _events_body() -> dict[str, Any]:
    """1000 events (the per-call maximum), fixed ids: once applied (the stack applies them first), every call is
    answered as retries of applied events."""
    events = [
        {
            "event_id": f"flood-{i}",
            "type": "memory.asserted",
            "tenant": ATTACKER,
            "subject": f"flood:{i % 50}",
            "key": "k",
            "value": _words(2_000, i),
            "content": "flood",
        }
        for i in range(1000)
    ]
    return {"events": events}


# the largest context block of the largest subject: every line, the history, the longest question, the most hits
LARGEST_CONTEXT = {
    "tenant": ATTACKER,
    "subject": BIG,
    "question": LONG_QUERY,
    "budget_tokens": 32_000,
    "include_history": True,
    "top_k": 50,
    "format": "json",
}

# (method, path template) -> the attacker's request; a route's template as the app's OpenAPI spec names it
ATTACKS: dict[tuple[str, str], Callable[[dict[str, Any]], Request]] = {
    ("GET", "/v1/health"): lambda s: ("GET", "/v1/health", {}),
    ("GET", "/v1/events/{event_id}"): lambda s: (
        "GET",
        "/v1/events/" + "e" * 128,
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    ("GET", "/v1/schema/event"): lambda s: ("GET", "/v1/schema/event", {}),
    ("POST", "/v1/events"): lambda s: ("POST", "/v1/events", {"json": s["events"], "headers": HA}),
    ("GET", "/v1/facts/{memory_id}/history"): lambda s: (
        "GET",
        f"/v1/facts/{s['big_memory_id']}/history",
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    ("GET", "/v1/subjects/{subject}/facts"): lambda s: (
        "GET",
        f"/v1/subjects/{BIG}/facts",
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    ("GET", "/v1/subjects/{subject}/events"): lambda s: (
        "GET",
        f"/v1/subjects/{BIG}/events",
        {"params": {"tenant": ATTACKER, "limit": 10_000}, "headers": HA},
    ),
    ("GET", "/v1/stats"): lambda s: ("GET", "/v1/stats", {"params": {"tenant": ATTACKER}, "headers": HA}),
    ("GET", "/v1/stats/consistency"): lambda s: (
        "GET",
        "/v1/stats/consistency",
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    ("DELETE", "/v1/subjects/{subject}"): lambda s: (
        "DELETE",
        f"/v1/subjects/{ERASE_HTTP}",
        {"params": {"tenant": ATTACKER, "reason": "r" * 1024}, "headers": HA},
    ),
    ("POST", "/v1/recall"): lambda s: (
        "POST",
        "/v1/recall",
        {
            "json": {
                "tenant": ATTACKER,
                "query": LONG_QUERY,
                "top_k": 100,
                "explain": True,
                "context_turns": 5,
                "mode": "auto",
            },
            "headers": HA,
        },
    ),
    ("POST", "/v1/context"): lambda s: ("POST", "/v1/context", {"json": LARGEST_CONTEXT, "headers": HA}),
    ("GET", "/v1/tenants"): lambda s: ("GET", "/v1/tenants", {"headers": HA}),
    ("GET", "/v1/subjects"): lambda s: (
        "GET",
        "/v1/subjects",
        {"params": {"tenant": ATTACKER, "prefix": "", "limit": 200}, "headers": HA},
    ),
    ("POST", "/v1/keys"): lambda s: (
        "POST",
        "/v1/keys",
        {"json": {"tenant": ATTACKER, "subjects": [f"user:k{i}" for i in range(500)]}, "headers": HA},
    ),
    ("POST", "/v1/keys/retire"): lambda s: (
        "POST",
        "/v1/keys/retire",
        {"json": {"tenant": ATTACKER, "subject": BIG, "erasure_id": "e" * 128}, "headers": HA},
    ),
    ("GET", "/v1/erasures"): lambda s: (
        "GET",
        "/v1/erasures",
        {"params": {"tenant": ATTACKER, "limit": 500}, "headers": HA},
    ),
    ("GET", "/v1/erasures/{erasure_id}"): lambda s: (
        "GET",
        "/v1/erasures/" + "e" * 128,
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    # the dead-letter workflow: the largest page, and actions whose body is as large as allowed (the attacker's
    # tenant has no dead letter at the position: each is judged whole, then 404)
    ("GET", "/v1/dead-letters"): lambda s: (
        "GET",
        "/v1/dead-letters",
        {"params": {"tenant": ATTACKER, "limit": 500}, "headers": HA},
    ),
    ("GET", "/v1/dead-letters/{partition}/{offset}"): lambda s: (
        "GET",
        f"/v1/dead-letters/0/{2**63 - 1}",
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
    ("POST", "/v1/dead-letters/redrive"): lambda s: (
        "POST",
        "/v1/dead-letters/redrive",
        {"json": {**TOOL_ATTACKS["redrive_dead_letter"](s), "event": s["events"]["events"][0]}, "headers": HA},
    ),
    ("POST", "/v1/dead-letters/discard"): lambda s: (
        "POST",
        "/v1/dead-letters/discard",
        {"json": TOOL_ATTACKS["discard_dead_letter"](s), "headers": HA},
    ),
    # a receipt citing as many events as one may (its signature no longer holds: every check is still made) with
    # the largest answer to digest, and the replay of the largest audit replay's receipt
    ("POST", "/v1/receipts/verify"): lambda s: (
        "POST",
        "/v1/receipts/verify",
        {"json": TOOL_ATTACKS["verify_receipt"](s), "headers": HA},
    ),
    ("POST", "/v1/receipts/replay"): lambda s: (
        "POST",
        "/v1/receipts/replay",
        {"json": TOOL_ATTACKS["replay_receipt"](s), "headers": HA},
    ),
    # the app's own routes and mounts
    ("GET", "/"): lambda s: ("GET", "/", {}),
    ("GET", "/openapi.json"): lambda s: ("GET", "/openapi.json", {}),
    ("GET", "/docs"): lambda s: ("GET", "/docs", {}),
    ("GET", "/docs/static"): lambda s: ("GET", "/docs/static/swagger-ui-bundle.js", {}),  # the largest file
    ("GET", "/console"): lambda s: ("GET", "/console", {}),
    ("GET", "/console/static"): lambda s: ("GET", "/console/static/console.js", {}),
    ("GET", "/metrics"): lambda s: ("GET", "/metrics", {}),
}

# MCP tool -> the attacker's arguments (tenant given: the key has one tenant anyway)
TOOL_ATTACKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "remember": lambda s: {
        "event_id": "mcp-flood",
        "tenant": ATTACKER,
        "subject": "user:mcp-flood",
        "key": "k",
        "value": _words(200_000, 7),
        "content": "flood",
    },
    "recall": lambda s: {"tenant": ATTACKER, "query": LONG_QUERY, "top_k": 100, "explain": True, "context_turns": 5},
    "recall_at": lambda s: {
        "tenant": ATTACKER,
        "query": LONG_QUERY,
        "top_k": 100,
        "as_of": "2026-03-05T00:00:00Z",
        "known_at": "2026-03-05T00:00:00Z",
        "explain": True,
        "context_turns": 5,
    },
    "facts": lambda s: {"tenant": ATTACKER, "subject": BIG, "limit": 1_000},
    "event_status": lambda s: {"tenant": ATTACKER, "event_id": "e" * 128},
    "fact_history": lambda s: {"tenant": ATTACKER, "memory_id": s["big_memory_id"], "limit": 1_000},
    "forget": lambda s: {"tenant": ATTACKER, "subject": ERASE_MCP, "erase_subject": True, "reason": "r" * 1024},
    "context": lambda s: LARGEST_CONTEXT,
    "dead_letters": lambda s: {"tenant": ATTACKER, "limit": 500},
    "dead_letter": lambda s: {"tenant": ATTACKER, "partition": 0, "offset": 2**63 - 1},
    "redrive_dead_letter": lambda s: {
        "tenant": ATTACKER,
        "partition": 0,
        "offset": 2**63 - 1,
        "event": {
            "type": "memory.asserted",
            "subject": "user:r",
            "key": "k",
            "value": _words(200_000, 8),
            "content": "r",
        },
    },
    "discard_dead_letter": lambda s: {"tenant": ATTACKER, "partition": 0, "offset": 2**63 - 1, "reason": "r" * 1024},
    "verify_receipt": lambda s: {"tenant": ATTACKER, "receipt": s["longest_receipt"], "answer": s["events_answer"]},
    "replay_receipt": lambda s: {
        "tenant": ATTACKER,
        "receipt": s["events_receipt"],
        "request": {"subject": BIG, "limit": 10_000},
    },
}


def _longest_receipt(receipt: dict[str, Any]) -> dict[str, Any]:
    """`receipt` citing MAX_CITED events: its own, then copies of them at other places (unsigned by then)."""
    cited = receipt["cited"]
    more = [{**cited[i % len(cited)], "offset": 10**9 + i} for i in range(MAX_CITED - len(cited))]
    return {**receipt, "cited": cited + more}


def _mcp_call(tool: str, arguments: dict[str, Any], call_id: int = 1) -> dict[str, Any]:
    """A JSON-RPC tools/call, as a Streamable HTTP client posts it (the server is stateless: no session)."""
    return {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


# -- the attacker: a process of its own ----------------------------------------------------------------------------


def _encoded(request: Request) -> Request:
    """`request` with its `json` body as the bytes httpx would send (its encoder's options), made once."""
    method, path, kwargs = request
    if "json" not in kwargs:
        return request
    kwargs = dict(kwargs)
    body = json.dumps(kwargs.pop("json"), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    headers = {**kwargs.pop("headers", {}), "Content-Type": "application/json"}
    return method, path, {**kwargs, "content": body.encode(), "headers": headers}


def attack(base: str, requests: list[Request], seconds: float, concurrency: int, limit: int) -> dict[str, Any]:
    """Send `requests` (in turn), `concurrency` at a time, for `seconds` (at most `limit`); the statuses seen.

    Runs in the attacker process; bodies are read as bytes and dropped (nothing here parses them), and JSON bodies
    are encoded once, before the clock starts: the attacker's own encoding (tens of milliseconds of CPU for a body
    of megabytes, on the same cores as the server) is not the server's doing. A 429 must carry Retry-After, which
    is obeyed."""

    async def run() -> dict[str, Any]:
        statuses: list[int] = []
        turn = itertools.cycle([_encoded(r) for r in requests])
        deadline = time.monotonic() + seconds
        timeout = httpx.Timeout(120.0)
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:

            async def one() -> None:
                while time.monotonic() < deadline and len(statuses) < limit:
                    method, path, kwargs = next(turn)
                    r = await client.request(method, path, **kwargs)
                    statuses.append(r.status_code)
                    if r.status_code == 429:  # refused at once: it waits as told (a flood is a rate limit's matter)
                        await asyncio.sleep(float(r.headers["retry-after"]))

            await asyncio.gather(*(one() for _ in range(concurrency)))
        return {"statuses": statuses}

    return asyncio.run(run())


def _p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def _open_loop(samples: list[float], interval: float) -> list[float]:
    """The latencies a victim calling every `interval` seconds would have seen: a closed loop sends nothing while a
    call is stalled, so a 5 s stall would be one sample of hundreds; here it is also the calls it held up."""
    out: list[float] = []
    for latency in samples:
        out.append(latency)
        held = latency - interval
        while held > 0:
            out.append(held)
            held -= interval
    return out


def _sample(victim: Callable[[], None], seconds: float, until: Callable[[], bool] = lambda: True) -> list[float]:
    """The victim's latencies, one call after another, for `seconds` and then until `until()`."""
    out: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or not until():
        t0 = time.perf_counter()
        victim()
        out.append(time.perf_counter() - t0)
    return out


def _measure(
    pool: ProcessPoolExecutor, base: str, requests: list[Request], victim: Callable[[], None], concurrency: int
) -> dict[str, Any]:
    baseline = _sample(victim, BASELINE_S)
    attacking = pool.submit(attack, base, requests, ATTACK_S, concurrency, MAX_ATTACKS)
    busy = _sample(victim, ATTACK_S, attacking.done)  # until the last attack is answered: a stall may come late
    statuses = attacking.result(timeout=300)["statuses"]
    interval = statistics.median(baseline)  # the victim's pace with the attacker idle
    return {
        "baseline_p99": _p99(_open_loop(baseline, interval)),
        "busy_p99": _p99(_open_loop(busy, interval)),
        "samples": (len(baseline), len(busy)),
        "statuses": sorted(set(statuses)),
        "attacks": len(statuses),
    }


def _judge(measure: Callable[[], dict[str, Any]], what: str) -> None:
    measured = [measure()]
    if measured[0]["busy_p99"] - measured[0]["baseline_p99"] > ALLOWED_DELAY_S:
        measured.append(measure())  # a spike of the shared machine does not come back; a stall does
    result = min(measured, key=lambda m: m["busy_p99"] - m["baseline_p99"])
    assert result["attacks"] > 0, f"{what}: the attacker sent nothing"
    assert all(s < 500 for s in result["statuses"]), f"{what}: the attack got a server error: {result}"
    delay = result["busy_p99"] - result["baseline_p99"]
    assert delay <= ALLOWED_DELAY_S, (
        f"{what}: the victim's p99 went from {result['baseline_p99'] * 1000:.0f} ms to "
        f"{result['busy_p99'] * 1000:.0f} ms under attack (+{delay * 1000:.0f} ms, the better of {measured})"
    )


# -- the stack ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("avail"), api_keys=KEYS, mcp_admin_keys=["k-attacker"])  # every tool
    with pipeline(settings, seed=_seed(), timeout=180) as pipe:
        with ApiServer(settings) as api, McpHttpServer(settings) as mcp:
            facts = httpx.get(
                f"{api.url}/v1/subjects/{BIG}/facts", params={"tenant": ATTACKER}, headers=HA, timeout=60
            ).json()["facts"]
            assert len(facts) == 50, len(facts)
            shared = {"big_memory_id": facts[0]["memory_id"], "events": _events_body()}
            events = httpx.get(
                f"{api.url}/v1/subjects/{BIG}/events",
                params={"tenant": ATTACKER, "limit": 10_000},
                headers=HA,
                timeout=60,
            ).json()
            shared["events_answer"] = events  # the largest answer a receipt is checked against
            shared["events_receipt"] = events["receipt"]
            shared["longest_receipt"] = _longest_receipt(events["receipt"])
            # the largest batch, applied and indexed before any measurement: the attack then measures what the door
            # does with it (judging, claims, the answer), not the pipeline indexing it once (another process's cores)
            r = httpx.post(f"{api.url}/v1/events", json=shared["events"], headers=HA, timeout=120)
            assert r.status_code == 200, r.text[:300]
            pipe.settle(180)
            with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
                # the attacker process is up and has imported what it runs (seconds of CPU on the server's cores)
                # before any measurement: an attack that sends nothing
                pool.submit(attack, api.url, [], 0, 1, 0).result(timeout=120)
                yield {"settings": settings, "pipe": pipe, "api": api, "mcp": mcp, "shared": shared, "pool": pool}


def test_every_route_and_tool_has_an_attack(base_settings: Settings) -> None:
    """A new route or tool must say what its largest legal input is, or this fails (and so it is measured)."""
    routes = app_routes(base_settings)
    assert not routes - set(ATTACKS), f"routes without an attack: {sorted(routes - set(ATTACKS))}"
    assert not set(ATTACKS) - routes, f"attacks on no route: {sorted(set(ATTACKS) - routes)}"
    tools = {t.name for t in TOOLS}
    assert tools == set(TOOL_ATTACKS), f"tools without an attack: {sorted(tools - set(TOOL_ATTACKS))}"


def test_no_route_builds_its_validators_or_reads_its_source_on_a_request(
    base_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What FastAPI builds lazily (a router's route table with its pydantic validators, an endpoint's source
    location read from its file, the OpenAPI document) is built at startup: built on a route's first request, it
    ran on the event loop and stalled every other tenant for as long (the first attack on a route, here ~90 ms)."""
    routes = sorted(app_routes(base_settings))
    app = create_app(base_settings.private(unique("warm"), api_keys=KEYS))
    with TestClient(app) as client:
        assert app.openapi_schema is not None, "the OpenAPI document is built on its first request"
        built: list[str] = []
        adapter_init, getsourcelines = pydantic.TypeAdapter.__init__, inspect.getsourcelines

        def counted_adapter(self: Any, *args: Any, **kwargs: Any) -> None:
            built.append(f"TypeAdapter({args[0] if args else kwargs})")
            adapter_init(self, *args, **kwargs)

        def counted_source(obj: Any) -> Any:
            built.append(f"source of {getattr(obj, '__qualname__', obj)}")
            return getsourcelines(obj)

        monkeypatch.setattr(pydantic.TypeAdapter, "__init__", counted_adapter)
        monkeypatch.setattr(inspect, "getsourcelines", counted_source)
        for method, template in routes:  # without a key: every route answers before touching a store
            client.request(method, re.sub(r"\{[^}]*\}", "x", template))
        assert not built, f"built on the request path after startup: {sorted(set(built))[:10]}"
        assert len(routes) > 20


@pytest.mark.parametrize("route", sorted(ATTACKS), ids=lambda r: f"{r[0]} {r[1]}")
def test_the_largest_request_on_a_route_does_not_stall_another_tenant(
    stack: dict[str, Any], route: tuple[str, str]
) -> None:
    api = stack["api"]
    request = ATTACKS[route](stack["shared"])
    with httpx.Client(base_url=api.url, headers={"X-API-Key": "k-victim"}, timeout=60) as client:

        def victim() -> None:
            r = client.get(f"/v1/subjects/{VICTIM_SUBJECT}/facts", params={"tenant": VICTIM})
            assert r.status_code == 200 and len(r.json()["facts"]) == 3, r.text[:300]

        burst = BURSTS.get(route, CONCURRENCY)
        _judge(lambda: _measure(stack["pool"], api.url, [request], victim, burst), f"{route[0]} {route[1]}")
    api.check()


@pytest.mark.parametrize("tool", sorted(TOOL_ATTACKS))
def test_the_largest_call_of_an_mcp_tool_does_not_stall_another_tenant(stack: dict[str, Any], tool: str) -> None:
    mcp = stack["mcp"]
    arguments = TOOL_ATTACKS[tool](stack["shared"])
    attacker = (
        "POST",
        "/mcp",
        {"json": _mcp_call(tool, arguments), "headers": {**MCP_HEADERS, "Authorization": "Bearer k-attacker"}},
    )
    headers = {**MCP_HEADERS, "Authorization": "Bearer k-victim"}
    with httpx.Client(base_url=mcp.base, headers=headers, timeout=60) as client:

        def victim() -> None:
            r = client.post("/mcp", json=_mcp_call("facts", {"tenant": VICTIM, "subject": VICTIM_SUBJECT}))
            assert r.status_code == 200 and '"pref.k2"' in r.text.replace('\\"', '"'), r.text[:300]

        burst = BURSTS.get(tool, CONCURRENCY)
        _judge(lambda: _measure(stack["pool"], mcp.base, [attacker], victim, burst), f"MCP {tool}")
    mcp.check()


# -- many small rows: the other largest answer ---------------------------------------------------------------------

MANY, LONG_CHAIN = "user:many", "user:long-chain"  # 10,000 small facts; one fact of 5,000 small versions
MANY_FACTS, CHAIN_VERSIONS = 10_000, 5_000


@pytest.fixture(scope="module")
def many(base_settings: Settings) -> Iterator[dict[str, Any]]:
    """The attacker's subjects of many small rows beside the victim's subject, projected into PostgreSQL (what these
    reads read; no index needed), and an API and an MCP server over them. Apart from `stack`: its subjects are few
    large values."""
    settings = base_settings.private(unique("availmany"), api_keys=KEYS)
    seed = [asserted(MANY, f"k{i:05d}", f"v{i}", 0, tenant=ATTACKER, content=f"small {i}") for i in range(MANY_FACTS)]
    seed += [asserted(LONG_CHAIN, "k", f"v{i}", i / 1000, tenant=ATTACKER) for i in range(CHAIN_VERSIONS)]
    seed += [asserted(VICTIM_SUBJECT, f"pref.k{i}", f"v{i}", 0, tenant=VICTIM) for i in range(3)]
    with (
        pipeline(settings, seed=seed, indexer=False, timeout=240),
        ApiServer(settings) as api,
        McpHttpServer(settings) as mcp,
    ):
        [chain] = httpx.get(
            f"{api.url}/v1/subjects/{LONG_CHAIN}/facts", params={"tenant": ATTACKER}, headers=HA, timeout=60
        ).json()["facts"]
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            pool.submit(attack, api.url, [], 0, 1, 0).result(timeout=120)  # imported before any measurement
            yield {"api": api, "mcp": mcp, "pool": pool, "chain_memory_id": chain["memory_id"]}


MANY_ROWS_ATTACKS: dict[str, Callable[[dict[str, Any]], Request]] = {
    "facts": lambda m: ("GET", f"/v1/subjects/{MANY}/facts", {"params": {"tenant": ATTACKER}, "headers": HA}),
    "facts as known": lambda m: (
        "GET",
        f"/v1/subjects/{MANY}/facts",
        {"params": {"tenant": ATTACKER, "known_at": "2100-01-01T00:00:00Z"}, "headers": HA},
    ),
    "events": lambda m: (
        "GET",
        f"/v1/subjects/{MANY}/events",
        {"params": {"tenant": ATTACKER, "limit": 10_000}, "headers": HA},
    ),
    "history": lambda m: (
        "GET",
        f"/v1/facts/{m['chain_memory_id']}/history",
        {"params": {"tenant": ATTACKER}, "headers": HA},
    ),
}


@pytest.mark.parametrize("read", sorted(MANY_ROWS_ATTACKS))
def test_a_subject_of_many_small_rows_does_not_stall_another_tenant(many: dict[str, Any], read: str) -> None:
    """The largest answers in rows rather than bytes (10,000 facts, a page of 10,000 events, a chain of 5,000
    versions, each with its receipt): the rows are converted a chunk at a time and shaped, cited and signed in
    worker threads, so the event loop is never held for long and another tenant's small read waits as it does
    beside the largest values."""
    api = many["api"]
    method, path, kwargs = MANY_ROWS_ATTACKS[read](many)
    shown = httpx.request(method, f"{api.url}{path}", timeout=120, **kwargs)
    assert shown.status_code == 200, shown.text[:300]
    answer = shown.json()
    rows = answer.get("facts") or answer.get("events") or answer.get("versions")
    assert len(rows) == {"history": CHAIN_VERSIONS, "events": 10_000}.get(read, MANY_FACTS), len(rows)  # a page
    assert len(answer["receipt"]["cited"]) == len(rows)
    with httpx.Client(base_url=api.url, headers={"X-API-Key": "k-victim"}, timeout=60) as client:

        def victim() -> None:
            r = client.get(f"/v1/subjects/{VICTIM_SUBJECT}/facts", params={"tenant": VICTIM})
            assert r.status_code == 200 and len(r.json()["facts"]) == 3, r.text[:300]

        _judge(lambda: _measure(many["pool"], api.url, [(method, path, kwargs)], victim, CONCURRENCY), read)
    api.check()


# the MCP tools' largest page of the same subjects (api.requests.MCP_LIMIT): the SDK walks a tool's answer with
# pydantic on the event loop, so the page is what bounds the walk
MCP_PAGE = 1_000
MANY_ROWS_TOOLS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "facts": lambda m: {"tenant": ATTACKER, "subject": MANY, "limit": MCP_PAGE},
    "fact_history": lambda m: {"tenant": ATTACKER, "memory_id": m["chain_memory_id"], "limit": MCP_PAGE},
}


@pytest.mark.parametrize("tool", sorted(MANY_ROWS_TOOLS))
def test_the_largest_page_of_an_mcp_tool_over_many_rows_does_not_stall_another_tenant(
    many: dict[str, Any], tool: str
) -> None:
    """The same subjects through the MCP tools, a page of 1,000 (their largest) from offset 5: the answer holds the
    page, its receipt cites the page, and another tenant's small MCP read waits no longer than beside any other."""
    mcp = many["mcp"]
    arguments = {**MANY_ROWS_TOOLS[tool](many), "offset": 5}
    headers = {**MCP_HEADERS, "Authorization": "Bearer k-attacker"}
    shown = httpx.post(f"{mcp.base}/mcp", json=_mcp_call(tool, arguments), headers=headers, timeout=120)
    result = shown.json()["result"]
    assert not result.get("isError"), str(result)[:300]
    answer = result["structuredContent"]
    rows = answer.get("facts") or answer.get("versions")
    total = CHAIN_VERSIONS if tool == "fact_history" else MANY_FACTS
    assert len(rows) == MCP_PAGE and answer["page"] == {
        "offset": 5,
        "limit": MCP_PAGE,
        "total": total,
        "next_offset": 5 + MCP_PAGE,
    }, answer["page"]
    assert len(answer["receipt"]["cited"]) == MCP_PAGE
    attacker = ("POST", "/mcp", {"json": _mcp_call(tool, arguments), "headers": headers})
    victim_headers = {**MCP_HEADERS, "Authorization": "Bearer k-victim"}
    with httpx.Client(base_url=mcp.base, headers=victim_headers, timeout=60) as client:

        def victim() -> None:
            r = client.post("/mcp", json=_mcp_call("facts", {"tenant": VICTIM, "subject": VICTIM_SUBJECT}))
            assert r.status_code == 200 and '"pref.k2"' in r.text.replace('\\"', '"'), r.text[:300]

        _judge(lambda: _measure(many["pool"], mcp.base, [attacker], victim, CONCURRENCY), f"MCP {tool}")
    mcp.check()


def test_a_burst_of_consistency_scans_runs_one_per_tenant_and_refuses_the_rest_at_once(stack: dict[str, Any]) -> None:
    """40 scans of one tenant at once: one runs, the others are refused at once with 429 `busy` in the one error
    shape with Retry-After; meanwhile another tenant's scan still runs (a tenant holds one of the slots at most)."""
    api = stack["api"]

    async def burst() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=api.url, timeout=120) as client:
            mine = [client.get("/v1/stats/consistency", params={"tenant": ATTACKER}, headers=HA) for _ in range(40)]
            other = client.get("/v1/stats/consistency", params={"tenant": VICTIM}, headers={"X-API-Key": "k-victim"})
            *answers, theirs = await asyncio.gather(*mine, other)
            return answers, theirs

    answers, theirs = asyncio.run(burst())
    assert theirs.status_code == 200, theirs.text[:300]
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(200) >= 1 and set(statuses) == {200, 429}, statuses
    for r in answers:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            [item] = r.json()["detail"]  # the one error shape
            assert item["code"] == "busy" and item["field"] is None and "consistency" in item["message"], item
    assert httpx.get(f"{api.url}/v1/stats/consistency", params={"tenant": ATTACKER}, headers=HA).status_code == 200


@pytest.mark.unit
def test_a_bulkhead_queues_a_tenant_behind_itself_never_another_tenant() -> None:
    """One slot per tenant, two in all: a tenant's second job waits for its first, another tenant's starts at once;
    `try_slot` refuses with 429 `busy` and Retry-After instead of waiting; a failed job gives its slot back."""
    slots = Bulkhead("job", per_tenant=1, total=2, retry_after_s=3)
    order: list[str] = []

    async def job(tenant: str, name: str, hold: float) -> None:
        async with slots.slot(tenant):
            order.append(f"{name}+")
            await asyncio.sleep(hold)
            order.append(f"{name}-")

    async def scenario() -> None:
        first = asyncio.ensure_future(job("a", "a1", 0.2))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(job("a", "a2", 0.01))
        other = asyncio.ensure_future(job("b", "b1", 0.01))
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as refused:
            async with slots.try_slot("a"):
                pass
        assert refused.value.status == 429 and refused.value.code == "busy"
        assert refused.value.headers == {"Retry-After": "3"}
        await asyncio.gather(first, second, other)
        with pytest.raises(RuntimeError):
            async with slots.try_slot("a"):
                raise RuntimeError("the job failed")
        async with slots.try_slot("a"), slots.try_slot("b"):  # every slot was given back
            pass

    asyncio.run(scenario())
    assert order.index("b1-") < order.index("a1-") < order.index("a2+"), order
