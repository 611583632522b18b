"""The audit console's finders: `GET /v1/tenants` and `GET /v1/subjects?tenant=&prefix=&limit=`.

Subjects are written through the real PostgreSQL projection (`RecorderWriter`, the worker's recorder)
and asked for through the app (`create_app` + TestClient). The prefix walk must list exactly the
subjects a naive scan would (code point order, case-sensitive, prefixes that end in the last code
point or next to the surrogates included), page with `more`, stay bounded (an index walk, never a
scan of the tenant's events), and refuse what every route refuses, in the one error shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.deps import MAX_LIST_CURSOR, list_cursor, list_place
from api.main import create_app
from api.routes.subject_search import MAX_LIMIT
from producers.settings import Settings
from projections.postgres.subject_search import prefix_upper_bound, walk_sql
from tests.conftest import unique
from tests.support import RecorderWriter, asserted, erased, pg, private_store

TENANT, OTHER = "finder", "finder-other"
KEY, OTHER_KEY = "finder-key", "other-key"
H = {"X-API-Key": KEY}
SUBJECTS = [
    "user:1",
    "user:10",
    "user:2",
    "User:3",  # upper case sorts before lower case in code point order
    "user/with/slashes",
    "user:%_like_wildcards",
    "项目:P1",
    "项目:P2",
    "a\U0010ffff",  # ends in the last code point: "a\U0010ffff" + anything still starts with "a\U0010ffff"
    "a\U0010ffffz",
    "b\ud7ffx",  # next to the surrogates: the bound of "b\ud7ff" is "b\ue000"
    "b\ue000",
    "order:1",
    "z" + "\x01" * 255,  # the longest subjects, with the characters JSON writes longest: their cursors are too
    "z" + "\x01" * 254 + "\U0010ffff",
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("prefix", "bound"),
    [
        ("", None),
        ("ab", "ac"),
        ("user:", "user;"),
        ("a\U0010ffff", "b"),
        ("\U0010ffff\U0010ffff", None),
        ("b\ud7ff", "b\ue000"),
        ("项", chr(ord("项") + 1)),
    ],
)
def test_prefix_upper_bound_is_the_least_string_above_the_prefix_range(prefix: str, bound: str | None) -> None:
    assert prefix_upper_bound(prefix) == bound


@pytest.mark.unit
def test_every_string_with_the_prefix_is_below_the_bound_and_the_bound_is_not_in_the_range() -> None:
    for prefix in ["", "a", "a\U0010ffff", "b\ud7ff", "user:", "项目"]:
        bound = prefix_upper_bound(prefix)
        for tail in ["", "a", "\U0010ffff", "\U0010ffff" * 3, "\ue000", "\x01"]:
            assert bound is None or prefix + tail < bound
        assert bound is None or not bound.startswith(prefix)


@pytest.fixture(scope="module")
def client(base_settings: Settings) -> Iterator[TestClient]:
    settings = base_settings.private(unique("finder"), api_keys={KEY: [TENANT], OTHER_KEY: [OTHER]})
    with private_store(settings), RecorderWriter(settings) as writer:
        events = [asserted(s, "k", i, tenant=TENANT) for i, s in enumerate(SUBJECTS)]
        events += [asserted("user:1", f"k{i}", i, tenant=TENANT) for i in range(300)]  # the walk must not read these
        events += [asserted("user:secret", "k", 0, tenant=OTHER), erased("order:1", tenant=TENANT)]
        assert writer.apply(*events).dead == 0
        with TestClient(create_app(settings)) as c:
            yield c


def find(client: TestClient, status: int = 200, key: str = KEY, **params: Any) -> dict[str, Any]:
    r = client.get("/v1/subjects", params={"tenant": TENANT, **params}, headers={"X-API-Key": key})
    assert r.status_code == status, r.text
    return r.json()


def naive(prefix: str) -> list[str]:
    """What a scan would answer: the tenant's distinct subjects starting with prefix, in code point order."""
    return sorted({s for s in SUBJECTS if s.startswith(prefix)})


def test_tenants_are_the_keys_tenants(client: TestClient) -> None:
    assert client.get("/v1/tenants", headers=H).json() == {"tenants": [TENANT]}
    assert client.get("/v1/tenants", headers={"X-API-Key": OTHER_KEY}).json() == {"tenants": [OTHER]}
    r = client.get("/v1/tenants")
    assert r.status_code == 401 and r.json()["detail"][0]["field"] == "X-API-Key"


@pytest.mark.parametrize(
    "prefix", ["", "user", "user:", "user:1", "User", "项目", "a", "a\U0010ffff", "b\ud7ff", "user:%", "nothing"]
)
def test_the_walk_lists_what_a_scan_would(client: TestClient, prefix: str) -> None:
    got = find(client, prefix=prefix, limit=MAX_LIMIT)
    assert got == {"tenant": TENANT, "prefix": prefix, "subjects": naive(prefix), "more": False, "next_cursor": None}


def test_an_erased_subject_is_still_found_and_another_tenants_never(client: TestClient) -> None:
    assert "order:1" in find(client, prefix="order")["subjects"]  # its tombstone: the timeline shows the erasure
    assert "user:secret" not in find(client, prefix="user")["subjects"]


def test_limit_pages_with_more(client: TestClient) -> None:
    everything = naive("")
    page = find(client, limit=3)
    assert page["subjects"] == everything[:3] and page["more"] is True
    exact = find(client, limit=len(everything))
    assert exact["subjects"] == everything and exact["more"] is False


@pytest.mark.unit
def test_a_list_cursor_of_the_longest_sort_keys_fits_its_parameter() -> None:
    for texts in (["\x01" * 256], ["\U0010ffff" * 256], ["2026-12-05T14:36:00.731675Z", "\x01" * 128]):
        cursor = list_cursor(*texts)
        assert len(cursor) <= MAX_LIST_CURSOR and list_place(cursor, len(texts)) == texts


@pytest.mark.parametrize("prefix", ["", "user", "a", "b\ud7ff", "z", "nothing"])
@pytest.mark.parametrize("limit", [1, 2, 5])
def test_next_cursor_walks_the_whole_list_a_page_at_a_time(client: TestClient, prefix: str, limit: int) -> None:
    """Pages asked with each answer's `next_cursor` are the whole list, each subject once, in order, whatever the
    page size; the last page says no more."""
    walked, cursor, pages = [], None, 0
    while True:
        page = find(client, prefix=prefix, limit=limit, **({"cursor": cursor} if cursor else {}))
        walked += page["subjects"]
        pages += 1
        assert len(page["subjects"]) <= limit and page["more"] is (page["next_cursor"] is not None), page
        if not page["more"]:
            break
        cursor = page["next_cursor"]
        assert pages <= len(SUBJECTS) + 1, walked
    assert walked == naive(prefix), (prefix, limit)


def test_a_cursor_outside_the_prefix_or_of_another_list_is_no_page_of_it(client: TestClient) -> None:
    """A cursor made for another prefix starts where the prefix does, or past it; another list's cursor (an erasure
    record's, two texts) and a malformed one are a 422 naming `cursor`."""
    first = find(client, prefix="", limit=1)["next_cursor"]  # after "User:3", before "a..."
    assert find(client, prefix="user", cursor=first)["subjects"] == naive("user")
    last = find(client, prefix="user", limit=len(naive("user")) - 1)
    beyond = find(client, prefix="a", limit=1, cursor=last["next_cursor"])  # after "user/...", past every "a"
    assert beyond["subjects"] == [] and beyond["more"] is False
    for bad in ["", "abc", "1:5", "WyJ4IiwieSJd", "WzFd", "W10", "eyJhIjoxfQ", "WyJ4XHUwMDAwIl0"]:
        body = find(client, status=422, cursor=bad)
        assert [(d["code"], d["field"]) for d in body["detail"]] == [("invalid_value", "cursor")], (bad, body)


def test_the_walk_is_an_index_walk_not_a_scan(client: TestClient) -> None:
    """EXPLAIN ANALYZE of the route's query: index-only probes, a few per subject listed, whatever the events."""
    settings: Settings = client.app.state.settings
    with pg(settings) as conn:
        conn.execute("ANALYZE events")
        conn.execute("SET enable_seqscan = off")  # a tiny table would be scanned anyway; the plan must allow the index
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + walk_sql(bounded=True).as_string(conn),  # the route's statement
            {"tenant": TENANT, "lo": "user:", "hi": prefix_upper_bound("user:"), "limit": 3},
        ).fetchone()[0][0]
    nodes = list(_walk(plan["Plan"]))
    scans = [n for n in nodes if "Scan" in n["Node Type"] and n["Node Type"] not in ("CTE Scan", "WorkTable Scan")]
    assert scans and all(n.get("Index Name") == "events_subject_c" for n in scans), [n["Node Type"] for n in scans]
    read = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in scans)
    assert read <= 10, f"{read} index rows read for 3 subjects (user:1 alone has 301 events)"


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


@pytest.mark.parametrize(
    ("params", "status", "code", "field"),
    [
        ({"tenant": OTHER}, 403, "forbidden_tenant", "tenant"),
        ({"limit": MAX_LIMIT + 1}, 422, "invalid_value", "limit"),
        ({"limit": 0}, 422, "invalid_value", "limit"),
        ({"prefix": "a\x00"}, 422, "unstorable_text", "prefix"),
        ({"prefix": "x" * 257}, 422, "invalid_value", "prefix"),
        ({"tenant": ""}, 422, "invalid_value", "tenant"),
    ],
)
def test_refusals_name_the_field(client: TestClient, params: dict, status: int, code: str, field: str) -> None:
    body = find(client, status=status, **params)
    assert [(d["code"], d["field"]) for d in body["detail"]] == [(code, field)]
