"""Pages of a listing: a subject's facts and a fact's history, `offset` and `limit` over HTTP and the MCP tools.

On the real servers (a private ledger, the worker, the app in process): the pages walked by `page.next_offset` are
the whole list cut in its order, now (cut by PostgreSQL: every page of keys of 1 to 4 bytes a character is checked)
and as known at a time (the re-folded path); a page out of the list is empty and says how long the list is; another
tenant's facts of the same subject are never counted; a page's receipt cites the page alone and replays only with
the page it names; bounds are a 422 naming the field at both doors, where the MCP tools answer pages of 100 unless
told and of 1,000 at most. Pure: a list asked whole is spelled in a receipt's request as it always was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from api.client import LedgerClient
from api.mcp.tools import TOOLS, run_tool
from api.receipts import request_fields
from api.resources import Resources
from producers.keys.signing import new_signing_key
from producers.settings import Settings
from tests.conftest import unique
from tests.support import pipeline
from tests.support.events import asserted

TENANT, OTHER = "pages", "pages-other"
KEYS = {"k-pages": [TENANT, OTHER]}
H = {"X-API-Key": "k-pages"}
SUBJECT, CHAIN = "user:paged", "user:paged-chain"
FACTS, VERSIONS = 105, 7


@pytest.fixture(scope="module")
def stack(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    key_file = tmp_path_factory.mktemp("pages") / "chain-key"  # receipts signed, so that they verify as valid
    key_file.write_bytes(new_signing_key())
    key_file.chmod(0o600)
    seed = [asserted(SUBJECT, f"k{i:03d}", i, 0, tenant=TENANT) for i in range(FACTS)]
    seed += [asserted(CHAIN, "k", f"v{i}", i, tenant=TENANT) for i in range(VERSIONS)]
    seed += [asserted(SUBJECT, f"theirs{i}", i, 0, tenant=OTHER) for i in range(3)]  # same subject, other tenant
    seed += _in_order_seed()
    settings = base_settings.private(unique("pages"), api_keys=KEYS, chain_key_file=key_file)
    with pipeline(settings, seed=seed, indexer=False, app=True) as pipe:
        yield pipe


# keys whose UTF-8 bytes take 1 to 4 per character, upper before lower case, one key in two scopes, and episodes
# without a key, two of them at one time: every tie-break of the listing's order
ORDERED, ORDER_KEYS = "user:paged-order", ["b", "B", "a", "é", "ｚ", "😀", "中", "z", "a b", "a"]


def _in_order_seed() -> list[Any]:
    seed = [asserted(ORDERED, k, i, 0, tenant=TENANT, scope="s9" if i == 9 else "") for i, k in enumerate(ORDER_KEYS)]
    for i, day in enumerate((2, 1, 1)):
        seed.append(asserted(ORDERED, None, None, day, tenant=TENANT, kind="episodic", content=f"episode {i}"))
    return seed


def _get(stack: Any, path: str, **params: Any) -> Any:
    return stack.client.get(path, params={"tenant": TENANT, **params}, headers=H)


def _walk(stack: Any, path: str, items: str, limit: int, **params: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """Every page of `path` by next_offset: the items in page order, and each page's `page`."""
    got: list[dict[str, Any]] = []
    pages: list[Any] = []
    offset: int | None = 0
    while offset is not None:
        r = _get(stack, path, offset=offset, limit=limit, **params)
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        got += body[items]
        pages.append(body["page"])
        assert len(body["receipt"]["cited"]) == len(body[items])  # a page's receipt cites the page alone
        offset = body["page"]["next_offset"]
    return got, pages


@pytest.mark.parametrize("as_known", [False, True], ids=["now", "as known"])
def test_the_pages_of_a_subjects_facts_are_the_whole_list_cut_in_its_order(stack: Any, as_known: bool) -> None:
    params = {"known_at": "2100-01-01T00:00:00Z"} if as_known else {}
    path = f"/v1/subjects/{SUBJECT}/facts"
    whole = _get(stack, path, **params).json()
    assert "page" not in whole and len(whole["facts"]) == FACTS  # asked whole: every fact, no page
    assert {f["tenant"] for f in whole["facts"]} == {TENANT}
    walked, pages = _walk(stack, path, "facts", 40, **params)
    assert walked == whole["facts"]
    assert pages == [
        {"offset": 0, "limit": 40, "total": FACTS, "next_offset": 40},
        {"offset": 40, "limit": 40, "total": FACTS, "next_offset": 80},
        {"offset": 80, "limit": 40, "total": FACTS, "next_offset": None},
    ]
    beyond = _get(stack, path, offset=10**9, **params).json()
    assert beyond["facts"] == [] and beyond["page"] == {
        "offset": 10**9,
        "limit": None,
        "total": FACTS,
        "next_offset": None,
    }
    tail = _get(stack, path, offset=100, **params).json()  # an offset alone: the rest of the list
    assert tail["facts"] == whole["facts"][100:] and tail["page"]["next_offset"] is None


def test_every_page_cut_by_postgresql_is_the_whole_list_cut_in_its_order(stack: Any) -> None:
    """The current facts are listed in SQL's order, whole or a page; the facts as known at a time are re-folded and
    sorted in Python (`_listed`): both orders are the same for any key, and every page is the whole list cut."""
    path = f"/v1/subjects/{ORDERED}/facts"
    whole = _get(stack, path).json()["facts"]
    assert len(whole) == len(ORDER_KEYS) + 3 and whole[0]["key"] is None  # the episodes have no key: first
    in_python = _get(stack, path, known_at="2100-01-01T00:00:00Z").json()["facts"]  # every event known by then
    assert [f["memory_id"] for f in in_python] == [f["memory_id"] for f in whole]
    n = len(whole)
    for offset in range(n + 2):
        for limit in range(1, n + 2):
            body = _get(stack, path, offset=offset, limit=limit).json()
            assert body["facts"] == whole[offset : offset + limit], (offset, limit)
            assert body["page"]["total"] == n


def test_the_pages_of_a_facts_history_are_its_versions_oldest_first(stack: Any) -> None:
    [fact] = _get(stack, f"/v1/subjects/{CHAIN}/facts").json()["facts"]
    path = f"/v1/facts/{fact['memory_id']}/history"
    whole = _get(stack, path).json()["versions"]
    assert [v["value"] for v in whole] == [f"v{i}" for i in range(VERSIONS)]
    walked, pages = _walk(stack, path, "versions", 3)
    assert walked == whole and [p["offset"] for p in pages] == [0, 3, 6]
    beyond = _get(stack, path, offset=100, limit=5)  # a page past the end of a fact that exists: not a 404
    assert beyond.status_code == 200 and beyond.json()["versions"] == []
    assert beyond.json()["page"] == {"offset": 100, "limit": 5, "total": VERSIONS, "next_offset": None}
    missing = _get(stack, "/v1/facts/no-such-fact/history", offset=3, limit=5)
    assert missing.status_code == 404 and "memory_id" in missing.text


def test_the_read_client_asks_for_a_page(stack: Any) -> None:
    client = LedgerClient(str(stack.client.base_url), api_key="k-pages", tenant=TENANT, timeout=30, http=stack.client)
    facts = client.facts(SUBJECT, offset=100, limit=3)
    assert [f.key for f in facts.facts] == ["k100", "k101", "k102"]
    assert facts.page is not None and (facts.page.total, facts.page.next_offset) == (FACTS, 103)
    chain = client.history(client.facts(CHAIN).facts[0].memory_id, offset=6)
    assert [v.value for v in chain.versions] == ["v6"] and chain.page is not None and chain.page.limit is None
    assert client.facts(SUBJECT).page is None  # asked whole


def test_a_pages_receipt_replays_with_its_page_and_only_with_it(stack: Any) -> None:
    answer = _get(stack, f"/v1/subjects/{SUBJECT}/facts", offset=10, limit=5).json()
    receipt = answer.pop("receipt")
    assert [c["version_id"] for c in receipt["cited"]] == [f["version_id"] for f in answer["facts"]]
    body = {"tenant": TENANT, "receipt": receipt, "answer": answer}
    checked = stack.client.post("/v1/receipts/verify", json=body, headers=H)
    assert checked.json()["valid"] is True and checked.json()["answer"] is True, checked.text[:300]

    def replay(request: dict[str, Any]) -> Any:
        body = {"tenant": TENANT, "receipt": receipt, "request": {"subject": SUBJECT, **request}}
        return stack.client.post("/v1/receipts/replay", json=body, headers=H)

    again = replay({"offset": 10, "limit": 5})
    assert again.status_code == 200 and again.json()["identical"] is True, again.text[:300]
    assert again.json()["replayed"]["facts"] == answer["facts"]
    for other in ({}, {"offset": 10}, {"offset": 11, "limit": 5}, {"offset": 10, "limit": 6}):
        refused = replay(other)
        assert refused.status_code == 422, (other, refused.text[:300])
        [item] = refused.json()["detail"]
        assert item["field"] == "request" and "page" in item["message"], item


@pytest.mark.unit
def test_a_list_asked_whole_is_spelled_without_a_page_in_a_receipts_request() -> None:
    """Receipts of whole lists made before pages existed name no offset or limit: theirs must replay."""
    before = {"subject": SUBJECT, "as_of": None, "known_at": None}
    assert request_fields("facts", {**before, "offset": 0, "limit": None}) == request_fields("facts", before)
    assert request_fields("history", {"memory_id": "m", "offset": 0, "limit": None}) == {
        "answer": "history",
        "memory_id": "m",
    }
    paged = request_fields("facts", {**before, "offset": 0, "limit": 100})
    assert paged["limit"] == 100 and "offset" not in paged


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": 10**10}, "offset"),
        ({"offset": "1.5"}, "offset"),
    ],
)
def test_a_page_out_of_its_bounds_is_a_422_naming_the_field(stack: Any, params: dict[str, Any], field: str) -> None:
    for path in (f"/v1/subjects/{SUBJECT}/facts", "/v1/facts/any/history"):
        r = _get(stack, path, **params)
        assert r.status_code == 422, (path, params, r.text[:300])
        assert [i["field"] for i in r.json()["detail"]] == [field], r.text[:300]


def test_the_mcp_tools_answer_pages_of_100_unless_told_and_1000_at_most(stack: Any) -> None:
    asyncio.run(_mcp_pages(stack))


async def _mcp_pages(stack: Any) -> None:
    tools = {t.name: t for t in TOOLS}
    tenants = frozenset(KEYS["k-pages"])
    async with Resources.open(stack.settings, warm_embedder=False) as res:

        async def call(tool: str, **arguments: Any) -> Any:
            return await run_tool(tools[tool], res, tenants, {"tenant": TENANT, **arguments})

        first = await call("facts", subject=SUBJECT)
        assert not first.is_error and len(first.structured_content["facts"]) == 100
        assert first.structured_content["page"] == {"offset": 0, "limit": 100, "total": FACTS, "next_offset": 100}
        rest = await call("facts", subject=SUBJECT, offset=100)
        assert [f["key"] for f in rest.structured_content["facts"]] == [f"k{i:03d}" for i in range(100, FACTS)]
        most = await call("facts", subject=SUBJECT, limit=1000)
        assert len(most.structured_content["facts"]) == FACTS
        for bad in ({"limit": 1001}, {"limit": 0}, {"limit": None}, {"offset": -1}):
            refused = await call("facts", subject=SUBJECT, **bad)
            assert refused.is_error, bad
            error = orjson.loads(refused.content[0].text)
            assert error["status"] == 422 and [i["field"] for i in error["detail"]] == list(bad), error
        [fact] = (await call("facts", subject=CHAIN)).structured_content["facts"]
        chain = await call("fact_history", memory_id=fact["memory_id"], limit=2, offset=5)
        assert [v["value"] for v in chain.structured_content["versions"]] == ["v5", "v6"]
        assert chain.structured_content["page"]["next_offset"] is None
        refused = await call("fact_history", memory_id=fact["memory_id"], limit=1001)
        assert refused.is_error and orjson.loads(refused.content[0].text)["detail"][0]["field"] == "limit"
