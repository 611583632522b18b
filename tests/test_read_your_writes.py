"""Read-your-writes: every write door answers a consistency token, every read door takes it as `after`.

One private ledger for the module (tests.support.pipeline: worker, indexer, embedder), the HTTP API and the MCP
server (Streamable HTTP) as children on free ports. What is proved on the real stack:
- a write then a read with its token never misses the write: a new value of one fact, then the answer, in many
  pairs at once, over HTTP and over MCP (where a session's `recall` after its `remember` waits by default);
- the token of each write door (POST /v1/events, the SDK, MCP remember and forget, DELETE /v1/subjects) is taken
  by each read door (HTTP, the read client, MCP), and the answer says which positions it reflects;
- a frozen worker (or indexer) makes the read answer `not_yet` (503, field `after`, the positions reached) within
  the bound, never hang and never answer stale; once it runs again the same read answers;
- a token that is not one is a 422 naming `after`, at every read door.
"""

from __future__ import annotations

import asyncio
import base64
import string
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api.client import LedgerClient, LedgerError
from producers.consistency import decode_token, encode_token, merge_tokens, token_of
from producers.sdk import LedgerProducer
from producers.settings import Settings
from projections.search.drain import INDEXED_CHANNEL, OUTBOX_CHANNEL
from projections.search.vocab import CommitListener
from tests.conftest import unique
from tests.support import TENANT, asserted, pipeline
from tests.support.processes import frozen
from tests.support.servers import ApiServer, McpHttpServer, tool_body

KEY = "k-ryw"
OTHER = "k-other"
KEYS = {KEY: [TENANT], OTHER: ["globex"]}
H = {"X-API-Key": KEY}
BOUND_S = 2.0  # the read's wait (api.consistency): past it, not_yet
PAIRS = 50


@pytest.fixture(scope="module")
def stack(base_settings: Settings) -> Iterator[dict[str, Any]]:
    settings = base_settings.private(unique("ryw"), api_keys=KEYS)
    with pipeline(settings, seed=[asserted("user:warmup", "pref.drink", "tea")]) as pipe:
        with ApiServer(settings) as api, McpHttpServer(settings) as mcp:
            yield {"settings": settings, "pipe": pipe, "api": api.url, "mcp": mcp.url}


def _fact(subject: str, value: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "memory.asserted",
        "tenant": TENANT,
        "subject": subject,
        "key": "pref.drink",
        "value": value,
        "content": f"{subject} drinks {value}",
        "aliases": ["favourite drink"],
        **fields,
    }


def _values(recall: dict[str, Any]) -> list[Any]:
    return [h["value"] for h in recall["hits"]]


@asynccontextmanager
async def mcp_client(stack: dict[str, Any]) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        async with Client(streamable_http_client(stack["mcp"], http_client=http)) as client:
            yield client


async def tool(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    r = await client.call_tool(name, arguments)
    return bool(r.is_error), tool_body(r)


# -- the token itself (pure) ----------------------------------------------------------------------------------------


def test_a_token_names_the_next_positions_and_merges_by_partition() -> None:
    token = token_of([(0, 41), (2, 7), (0, 40)])
    assert decode_token(token) == {0: 42, 2: 8}  # the next offset: "reached" is stored >= it
    assert decode_token(encode_token({3: 0})) == {3: 0}
    merged = merge_tokens(token, encode_token({0: 10, 1: 5}), None)
    assert merged is not None and decode_token(merged) == {0: 42, 1: 5, 2: 8}
    assert merge_tokens(None, None) is None and token_of([]) is None
    for garbage in (
        "",
        "x",
        "v1.",
        "v1.!!",
        "v9.MDox",
        token + "!",
        token[:-1],
        encode_token({0: 1}).upper(),
        "v1." + "A" * 5000,
    ):
        with pytest.raises(ValueError):
            decode_token(garbage)


def test_a_token_cut_short_or_changed_anywhere_is_refused_not_read_as_earlier_positions() -> None:
    """The class: a token is kept somewhere (a column, a header, a copy) and comes back altered. Every prefix and
    every one-character change of tokens of one and several partitions is refused; before the check, a token cut at
    a base64 boundary read as earlier positions and a read waited for less than its write. A token answered before
    tokens carried their check (`v1.`) still reads as its positions."""
    alphabet = string.ascii_letters + string.digits + "-_.="
    for positions in ({0: 1234567}, {0: 10, 1: 2000, 5: 987654321}, {3: 0}):
        token = encode_token(positions)
        assert decode_token(token) == positions
        for cut in range(len(token)):
            with pytest.raises(ValueError):
                decode_token(token[:cut])
        for at in range(len(token)):
            for ch in alphabet:
                changed = token[:at] + ch + token[at + 1 :]
                if changed != token:
                    with pytest.raises(ValueError):
                        decode_token(changed)
    unchecked = "v1." + base64.urlsafe_b64encode(b"0:42,2:7").decode().rstrip("=")
    assert decode_token(unchecked) == {0: 42, 2: 7}


# -- a write, then a read with its token, never misses --------------------------------------------------------------


def test_http_write_then_read_with_its_token_never_misses(stack: dict[str, Any]) -> None:
    """Chains of (new value, recall with the token, facts with the token), the chains at once."""

    async def chain(http: httpx.AsyncClient, n: int, pairs: int) -> list[str]:
        subject, misses = f"user:http-{n}-{uuid.uuid4().hex[:6]}", []
        for i in range(pairs):
            value = f"drink-{n}-{i}-{uuid.uuid4().hex[:4]}"
            wrote = await http.post("/v1/events", json={"events": [_fact(subject, value)]})
            assert wrote.status_code == 200, wrote.text
            token = wrote.json()["consistency_token"]
            ask = {"tenant": TENANT, "subject": subject, "query": "favourite drink", "after": token}
            recalled = await http.post("/v1/recall", json=ask)
            assert recalled.status_code == 200, recalled.text
            facts = await http.get(f"/v1/subjects/{subject}/facts", params={"tenant": TENANT, "after": token})
            assert facts.status_code == 200, facts.text
            if _values(recalled.json())[:1] != [value]:
                misses.append(f"recall {value}: {_values(recalled.json())}")
            if [f["value"] for f in facts.json()["facts"]] != [value]:
                misses.append(f"facts {value}: {facts.json()['facts']}")
            assert decode_token(recalled.json()["trace"]["consistency"]["reflects"])  # which positions it reflects
        return misses

    async def scenario() -> list[str]:
        async with httpx.AsyncClient(base_url=stack["api"], headers=H, timeout=30) as http:
            found = await asyncio.gather(*(chain(http, n, PAIRS // 10) for n in range(10)))
        return [m for ms in found for m in ms]

    assert asyncio.run(scenario()) == []


def test_a_recall_with_the_token_has_the_writes_new_subject_and_alias_as_cues(stack: dict[str, Any]) -> None:
    """The API's cached vocabulary is checked within the recall (by the exact stage's statement when it asks
    PostgreSQL first, as in mode exact; else by a round trip before the stages): a recall with a write's token,
    right after a recall that cached the tenant's vocabulary without it, names the write's new entity and alias as
    known cues and answers it exactly."""

    async def scenario() -> list[str]:
        wrong = []
        async with httpx.AsyncClient(base_url=stack["api"], headers=H, timeout=30) as http:
            words = ("marmoset", "ocelot", "caracal", "serval", "margay", "jerboa")
            for n, (word, mode) in enumerate(zip(words, ("exact", "auto") * 3, strict=True)):
                entity, key, question = f"RWQ{n}", f"pref.gadget_{n}", f"RWQ{n} {word} gadget"
                warm = await http.post("/v1/recall", json={"tenant": TENANT, "query": question, "mode": mode})
                assert warm.status_code == 200, warm.text  # the vocabulary is cached now, without the write
                fact = _fact(f"user:{entity}", f"v{n}", key=key, aliases=[f"{word} gadget"], entities=[entity])
                wrote = await http.post("/v1/events", json={"events": [fact]})
                assert wrote.status_code == 200, wrote.text
                ask = {"tenant": TENANT, "query": question, "mode": mode, "after": wrote.json()["consistency_token"]}
                res = (await http.post("/v1/recall", json=ask)).json()
                cues, top = res["cues"], (res["hits"] or [{}])[0]
                if entity.lower() not in cues["known_entities"] or key not in cues["keys"]:
                    wrong.append(f"{mode} {question}: cues {cues}")
                if (top.get("value"), top.get("match", {}).get("stage")) != (f"v{n}", "exact"):
                    wrong.append(f"{mode} {question}: top {top}")
        return wrong

    assert asyncio.run(scenario()) == []


def test_mcp_remember_then_recall_is_read_your_writes_by_default(stack: dict[str, Any]) -> None:
    """No `after` passed: the session's last write token makes recall and facts wait for it."""

    async def chain(n: int, pairs: int) -> list[str]:
        subject, misses = f"user:mcp-{n}-{uuid.uuid4().hex[:6]}", []
        async with mcp_client(stack) as client:
            for i in range(pairs):
                value = f"drink-{n}-{i}-{uuid.uuid4().hex[:4]}"
                args = {k: v for k, v in _fact(subject, value).items() if k != "type"}
                failed, wrote = await tool(client, "remember", {**args, "event_id": uuid.uuid4().hex})
                assert not failed and wrote["consistency_token"], wrote
                failed, recalled = await tool(client, "recall", {"subject": subject, "query": "favourite drink"})
                assert not failed, recalled
                if _values(recalled)[:1] != [value]:
                    misses.append(f"recall {value}: {_values(recalled)}")
                failed, facts = await tool(client, "facts", {"subject": subject})
                assert not failed, facts
                if [f["value"] for f in facts["facts"]] != [value]:
                    misses.append(f"facts {value}: {facts['facts']}")
        return misses

    async def scenario() -> list[str]:
        found = await asyncio.gather(*(chain(n, PAIRS // 10) for n in range(10)))
        return [m for ms in found for m in ms]

    assert asyncio.run(scenario()) == []


def test_mcp_forget_finds_the_sessions_own_remember(stack: dict[str, Any]) -> None:
    """`forget` looks its target up in the projection: right after the session's own `remember` it waits for that
    write as a read does, instead of answering 404 while the worker has not applied it yet."""

    async def scenario() -> list[str]:
        wrong = []
        async with mcp_client(stack) as client:
            for i in range(8):
                subject = f"user:forget-{i}-{uuid.uuid4().hex[:6]}"
                args = {k: v for k, v in _fact(subject, f"tea-{i}").items() if k != "type"}
                failed, wrote = await tool(client, "remember", {**args, "event_id": uuid.uuid4().hex})
                assert not failed, wrote
                by = {"target_version": wrote["version_id"]} if i % 2 else {"key": args["key"]}
                failed, forgot = await tool(client, "forget", {"subject": subject, **by})
                if failed or forgot.get("action") != "retract":
                    wrong.append(f"{by}: {forgot}")
        return wrong

    assert asyncio.run(scenario()) == []


# -- every write door's token, at every read door -------------------------------------------------------------------


def _writes(stack: dict[str, Any], subject: str) -> dict[str, str]:
    """door -> the token its write answered; each write is a new value of the subject's fact (the last: erasure)."""
    settings, tokens = stack["settings"], {}
    r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(subject, "http")]}, timeout=30)
    assert r.status_code == 200, r.text
    tokens["http"] = r.json()["consistency_token"]
    with LedgerProducer(settings) as producer:
        one = producer.publish(_fact(subject, "sdk"))
        many = producer.publish_many([_fact(subject, "sdk-many")])
    assert decode_token(one.token) == {one.partition: one.offset + 1}
    tokens["sdk"], tokens["sdk_many"] = one.token, many.token

    async def remember() -> tuple[str, str]:
        async with mcp_client(stack) as client:
            args = {k: v for k, v in _fact(subject, "mcp").items() if k != "type"}
            failed, wrote = await tool(client, "remember", {**args, "event_id": uuid.uuid4().hex})
            assert not failed, wrote
            failed, forgot = await tool(
                client, "forget", {"subject": subject + "-gone", "erase_subject": True, "reason": "test"}
            )
            assert not failed, forgot
            return wrote["consistency_token"], forgot["consistency_token"]

    tokens["mcp_remember"], tokens["mcp_forget"] = asyncio.run(remember())
    r = httpx.delete(f"{stack['api']}/v1/subjects/{subject}-gone", params={"tenant": TENANT}, headers=H, timeout=30)
    assert r.status_code == 202, r.text
    tokens["erasure"] = r.json()["consistency_token"]
    return tokens


def test_every_write_doors_token_is_taken_by_every_read_door(stack: dict[str, Any]) -> None:
    subject = f"user:doors-{uuid.uuid4().hex[:6]}"
    tokens = _writes(stack, subject)
    assert all(decode_token(t) for t in tokens.values()), tokens
    memory_id = None
    for door, token in tokens.items():
        # HTTP
        q = {"tenant": TENANT, "after": token}
        facts = httpx.get(f"{stack['api']}/v1/subjects/{subject}/facts", params=q, headers=H, timeout=30)
        assert facts.status_code == 200, (door, facts.text)
        assert decode_token(facts.json()["consistency"]["reflects"]), door
        memory_id = facts.json()["facts"][0]["memory_id"]
        for path in (f"/v1/subjects/{subject}/events", f"/v1/facts/{memory_id}/history"):
            r = httpx.get(stack["api"] + path, params=q, headers=H, timeout=30)
            assert r.status_code == 200 and r.json()["consistency"]["after"] == token, (door, path, r.text)
        ask = {"tenant": TENANT, "subject": subject, "after": token}
        r = httpx.post(stack["api"] + "/v1/recall", json={**ask, "query": "favourite drink"}, headers=H, timeout=30)
        assert r.status_code == 200 and r.json()["trace"]["consistency"]["after"] == token, (door, r.text)
        r = httpx.post(stack["api"] + "/v1/context", json={**ask, "format": "json"}, headers=H, timeout=30)
        assert r.status_code == 200 and r.json()["consistency"]["after"] == token, (door, r.text)
        r = httpx.post(stack["api"] + "/v1/context", json={**ask, "format": "text"}, headers=H, timeout=30)
        assert r.status_code == 200 and decode_token(r.headers["x-consistency-reflects"]), (door, r.text)
        # the read client
        with LedgerClient(stack["api"], api_key=KEY, tenant=TENANT) as client:
            assert client.facts(subject, after=token).facts, door
            assert client.recall("favourite drink", subject=subject, after=token).trace.consistency, door
            assert client.history(memory_id, after=token).versions, door
            assert client.events(subject, after=token).events, door
            assert client.context(subject, "favourite drink", after=token).lines, door

    async def mcp_reads() -> None:
        async with mcp_client(stack) as client:
            for door, token in tokens.items():
                for name, args in (
                    ("facts", {"subject": subject}),
                    ("fact_history", {"memory_id": memory_id}),
                    ("recall", {"subject": subject, "query": "favourite drink"}),
                    ("recall_at", {"subject": subject, "query": "favourite drink", "as_of": "2030-01-01T00:00:00Z"}),
                    ("context", {"subject": subject, "format": "json"}),
                ):
                    failed, out = await tool(client, name, {**args, "after": token})
                    assert not failed, (door, name, out)

    asyncio.run(mcp_reads())
    final = httpx.get(f"{stack['api']}/v1/subjects/{subject}/facts", params={"tenant": TENANT}, headers=H, timeout=30)
    assert [f["value"] for f in final.json()["facts"]] == ["mcp"]  # the last value written, as every read saw


def test_another_tenants_token_waits_for_the_log_and_tells_nothing_of_its_data(stack: dict[str, Any]) -> None:
    """A token names global log positions: another tenant's read waits for them and answers its own data only."""
    subject = f"user:shared-{uuid.uuid4().hex[:6]}"
    r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(subject, "acme-secret")]}, timeout=30)
    token = r.json()["consistency_token"]
    url, other = f"{stack['api']}/v1/subjects/{subject}/facts", {"X-API-Key": OTHER}
    plain = httpx.get(url, params={"tenant": "globex"}, headers=other, timeout=30).json()
    waited = httpx.get(url, params={"tenant": "globex", "after": token}, headers=other, timeout=30).json()
    assert waited["facts"] == plain["facts"] == [] and "acme-secret" not in str(waited), waited
    ask = {"tenant": "globex", "query": "favourite drink", "after": token}
    r = httpx.post(stack["api"] + "/v1/recall", json=ask, headers=other, timeout=30)
    assert r.status_code == 200 and r.json()["hits"] == [] and "acme" not in str(r.json()["hits"]), r.text


# -- a stopped worker: not_yet within the bound, never stale, never a hang ------------------------------------------


def _not_yet(status: int, body: dict[str, Any]) -> str:
    assert status == 503, body
    (item,) = body["detail"]
    assert item["code"] == "not_yet" and item["field"] == "after", item
    return item["message"]


def test_a_frozen_worker_makes_the_read_answer_not_yet_within_the_bound(stack: dict[str, Any]) -> None:
    pipe, subject = stack["pipe"], f"user:frozen-{uuid.uuid4().hex[:6]}"
    r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(subject, "before")]}, timeout=30)
    before = r.json()["consistency_token"]
    facts_url = f"{stack['api']}/v1/subjects/{subject}/facts"
    assert httpx.get(facts_url, params={"tenant": TENANT, "after": before}, headers=H, timeout=30).status_code == 200
    with frozen(pipe.worker):
        r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(subject, "after")]}, timeout=30)
        token = r.json()["consistency_token"]
        reads = [
            ("GET", facts_url, {"params": {"tenant": TENANT, "after": token}}),
            ("POST", stack["api"] + "/v1/recall", {"json": {"tenant": TENANT, "query": "drink", "after": token}}),
        ]
        for method, url, kwargs in reads:
            started = time.monotonic()
            r = httpx.request(method, url, headers=H, timeout=30, **kwargs)
            took = time.monotonic() - started
            message = _not_yet(r.status_code, r.json())
            assert BOUND_S - 0.1 <= took < BOUND_S + 1.5, took
            assert encode_token(decode_token(before)) in message or "reached" in message, message

        async def mcp() -> tuple[str, str]:
            async with mcp_client(stack) as client:
                args = {k: v for k, v in _fact(subject, "mcp").items() if k != "type"}
                failed, _ = await tool(client, "remember", {**args, "event_id": uuid.uuid4().hex})
                assert not failed
                failed, out = await tool(client, "recall", {"subject": subject, "query": "favourite drink"})
                assert failed, out  # the session's own write is not applied: never the old value
                explicit_failed, explicit = await tool(client, "facts", {"subject": subject, "after": token})
                assert explicit_failed, explicit
                return _not_yet(out["status"], out), _not_yet(explicit["status"], explicit)

        asyncio.run(mcp())
    # running again: the same reads answer the new value
    r = httpx.get(facts_url, params={"tenant": TENANT, "after": token}, headers=H, timeout=30)
    assert r.status_code == 200 and [f["value"] for f in r.json()["facts"]] in (["after"], ["mcp"]), r.text


def test_a_frozen_indexer_holds_recall_but_not_facts(stack: dict[str, Any]) -> None:
    """The stages: facts need the projection only; recall needs the search index too."""
    pipe, subject = stack["pipe"], f"user:idx-{uuid.uuid4().hex[:6]}"
    with frozen(pipe.indexer):
        r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(subject, "new")]}, timeout=30)
        token = r.json()["consistency_token"]
        q = {"tenant": TENANT, "after": token}
        r = httpx.get(f"{stack['api']}/v1/subjects/{subject}/facts", params=q, headers=H, timeout=30)
        assert r.status_code == 200 and r.json()["facts"][0]["value"] == "new", r.text
        ask = {"tenant": TENANT, "subject": subject, "query": "favourite drink", "after": token}
        r = httpx.post(stack["api"] + "/v1/recall", json=ask, headers=H, timeout=30)
        _not_yet(r.status_code, r.json())
    r = httpx.post(stack["api"] + "/v1/recall", json=ask, headers=H, timeout=30)
    assert r.status_code == 200 and _values(r.json())[:1] == ["new"], r.text


def test_a_token_waits_for_its_own_write_not_for_what_the_tenant_wrote_after_it(stack: dict[str, Any]) -> None:
    """The class: a read with the token of a write the index already has answers at once, whatever the tenant's
    other writes still wait in the search queues (an agent's reads do not stall behind a sibling service's bulk
    import); a token of one of those writes still waits for it."""
    pipe, first, later = stack["pipe"], f"user:own-{uuid.uuid4().hex[:6]}", f"user:bulk-{uuid.uuid4().hex[:6]}"
    r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": [_fact(first, "own")]}, timeout=30)
    own = r.json()["consistency_token"]
    asks = [{"tenant": TENANT, "subject": first, "query": "favourite drink", "after": own, "mode": mode}
            for mode in ("semantic", "keyword", "auto")]  # fmt: skip
    for ask in asks:  # the write's document and vectors are there
        r = httpx.post(stack["api"] + "/v1/recall", json=ask, headers=H, timeout=30)
        assert r.status_code == 200 and _values(r.json())[:1] == ["own"], r.text
    with frozen(pipe.indexer):
        bulk = [_fact(later, f"v{n}", key=f"pref.n{n}") for n in range(40)]
        r = httpx.post(stack["api"] + "/v1/events", headers=H, json={"events": bulk}, timeout=30)
        queued = r.json()["consistency_token"]
        facts = httpx.get(f"{stack['api']}/v1/subjects/{later}/facts", params={"tenant": TENANT, "after": queued},
                          headers=H, timeout=30)  # fmt: skip
        assert facts.status_code == 200 and len(facts.json()["facts"]) == 40, facts.text  # applied, not indexed
        for ask in asks:
            started = time.monotonic()
            r = httpx.post(stack["api"] + "/v1/recall", json=ask, headers=H, timeout=30)
            took = time.monotonic() - started
            assert r.status_code == 200 and _values(r.json())[:1] == ["own"], (ask["mode"], r.text)
            assert took < BOUND_S / 2, (ask["mode"], took)
            assert r.json()["trace"]["consistency"]["waited_ms"] < BOUND_S * 500, r.json()["trace"]["consistency"]
        r = httpx.post(stack["api"] + "/v1/recall", json={**asks[2], "after": queued}, headers=H, timeout=30)
        _not_yet(r.status_code, r.json())


def test_a_read_waiting_on_an_index_that_is_down_says_so(stack: dict[str, Any]) -> None:
    """Past the bound, a read that waited on the search index asks whether Elasticsearch answers: when it does not,
    the 503 names elasticsearch (the indexer cannot catch up while it is down), not `not_yet` and "retry"."""
    from fastapi.testclient import TestClient

    from api.main import create_app

    pipe, subject = stack["pipe"], f"user:es-{uuid.uuid4().hex[:6]}"
    away = stack["settings"].model_copy(update={"es_url": "http://127.0.0.1:1"})
    with frozen(pipe.indexer), TestClient(create_app(away)) as client:
        r = client.post("/v1/events", headers=H, json={"events": [_fact(subject, "new")]})
        ask = {"tenant": TENANT, "subject": subject, "query": "favourite drink", "after": r.json()["consistency_token"]}
        t0 = time.monotonic()
        r = client.post("/v1/recall", json=ask, headers=H)
        took = time.monotonic() - t0
    assert r.status_code == 503, r.text
    (item,) = r.json()["detail"]
    assert item["code"] == "store_unavailable" and item["message"].startswith("elasticsearch: "), item
    assert took < BOUND_S + 3, took


# -- garbage: 422 naming `after` ------------------------------------------------------------------------------------

GARBAGE = ["", "nope", "v1.", "v1.@@@", "v1." + "A" * 5000, "v1.LTE6NQ"]  # the last: partition -1
GARBAGE += [encode_token({99: 0}), encode_token({0: 0, 3: 5})]  # well formed, but no write names an offset 0


def test_a_token_that_is_not_one_is_422_naming_after_at_every_door(stack: dict[str, Any]) -> None:
    subject = "user:warmup"
    for bad in GARBAGE:
        q = {"tenant": TENANT, "after": bad}
        for path in (f"/v1/subjects/{subject}/facts", f"/v1/subjects/{subject}/events", "/v1/facts/m1/history"):
            r = httpx.get(stack["api"] + path, params=q, headers=H, timeout=30)
            assert r.status_code == 422 and r.json()["detail"][0]["field"] == "after", (bad, path, r.text)
        for path, body in (("/v1/recall", {"query": "drink"}), ("/v1/context", {"subject": subject})):
            r = httpx.post(stack["api"] + path, json={**q, **body}, headers=H, timeout=30)
            assert r.status_code == 422 and r.json()["detail"][0]["field"] == "after", (bad, path, r.text)
        with LedgerClient(stack["api"], api_key=KEY, tenant=TENANT) as client, pytest.raises(LedgerError) as err:
            client.facts(subject, after=bad)
        assert (err.value.status, err.value.field) == (422, "after")

    async def mcp() -> None:
        async with mcp_client(stack) as client:
            for bad in GARBAGE:
                for name, args in (("facts", {"subject": subject}), ("recall", {"query": "drink"})):
                    failed, out = await tool(client, name, {**args, "after": bad})
                    assert failed and out["status"] == 422 and out["detail"][0]["field"] == "after", (name, out)

    asyncio.run(mcp())


@pytest.mark.parametrize("channel", [OUTBOX_CHANNEL, INDEXED_CHANNEL], ids=["projection", "documents"])
def test_each_stage_a_read_waits_for_announces_its_commits(stack: dict[str, Any], channel: str):
    """A read waiting for a write looks again when the stage it waits for commits, not only at its next poll: the
    projection's commit of a write is heard on OUTBOX_CHANNEL, the indexer's of its document on INDEXED_CHANNEL,
    each by a listener of this ledger's schema alone (CommitListener, as api.consistency uses it)."""
    settings, pipe = stack["settings"], stack["pipe"]

    async def heard() -> bool:
        listener = CommitListener(settings.pg_dsn, lambda *_: None, progress=(channel,), schema=settings.pg_schema)
        listener.start()
        try:
            while not listener.listening:
                await asyncio.sleep(0.02)
            changed = listener.changed()
            await asyncio.sleep(1.0)  # nothing of this schema commits meanwhile: the event stays clear
            assert not changed.is_set()
            await asyncio.to_thread(pipe.publish, [asserted(f"user:heard-{uuid.uuid4().hex[:6]}", "pref.drink", "tea")])
            await asyncio.wait_for(changed.wait(), 60)
            return True
        finally:
            await listener.aclose()

    pipe.settle()
    assert asyncio.run(heard())
