"""The audit console's Erasures view in a real headless Chromium against the real stack.

The world (tests.support.erasure_world): encryption on, facts published through the SDK, projected by the worker,
indexed by the indexer, the API under uvicorn; then subjects erased through the API (and one erasure with a hostile
id through the SDK), and every erasure record complete. What the console shows is read back as text and compared
with the API's own JSON (`GET /v1/erasures`, `GET /v1/erasures/{id}`), never with numbers written here. Every
request to anything but the service is aborted and must not happen, and no script error may occur.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import unique
from tests.support.browser import OfflinePage
from tests.support.console_page import ConsolePage, page_size, short
from tests.support.erasure_world import (
    AUDITOR_KEY,
    FOREIGN,
    FOREIGN_GONE,
    FOREIGN_KEY,
    GONE,
    HOSTILE_ERASURE,
    HOSTILE_SUBJECT,
    KEPT,
    TENANT,
    ErasureWorld,
    erasure_settings,
    erasure_world,
)


@pytest.fixture(scope="module")
def world(base_settings) -> Iterator[ErasureWorld]:
    with erasure_world(erasure_settings(base_settings, unique("cerase"))) as w:
        yield w


def signed_in(tab: OfflinePage, key: str = AUDITOR_KEY, fragment: str = "") -> ConsolePage:
    console = ConsolePage(tab.page).open(fragment)
    console.login(key)
    assert console.signed_in(), console.login_error()
    return console


def link(**params: str) -> str:
    return "#" + str(httpx.QueryParams(params))


def error_line(body: dict[str, Any], status: int) -> str:
    """The banner line the console shows for the first item of an API error body."""
    item = body["detail"][0]
    return f"{status} {item['code']}" + (f" · {item['field']}" if item["field"] else "") + f": {item['message']}"


def _text(v: Any) -> str:
    return "—" if v is None else short(v) if isinstance(v, str) else json.dumps(v)


def expected(r: dict[str, Any]) -> dict[str, str]:
    """What a row of an erasures table must show for this record of the API (by data-field)."""
    led, recs = r["ledger"], r["records"]
    row = {
        "erasure_id": r["erasure_id"],
        "requested_at": short(r["requested_at"]),
        "applied_at": short(r["applied_at"]),
        "subject_digest": r["subject_digest"],
        "records.total": _text(recs["total"]),
        "records.sealed": _text(recs["sealed"]),
        "records.clear": _text(recs["clear"]),
        "keys": "".join(f"{k['key_id']}fingerprint {k['fingerprint']}" for k in r["keys"]) or "none (no sealed record)",
        "ledger.topic": _text(led["topic"]),
        "ledger.partition": _text(led["partition"]),
        "ledger.first_offset": _text(led["first_offset"]),
        "ledger.erasure_offset": _text(led["erasure_offset"]),
        "complete": "yes" if r["complete"] else "no",
    }
    for store, counts in r["purged"].items():
        row.update({f"purged.{store}.{k}": _text(v) for k, v in counts.items()})
    return row


def shown(console: ConsolePage, table: str = "erasures") -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k != "_data"} for r in console.rows(table)]


def keys_of(records: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    return [[(k["key_id"], k["fingerprint"]) for k in r["keys"]] for r in records]


# -- the list ------------------------------------------------------------------------------------------------


def test_the_erasures_view_lists_the_tenants_records_as_the_api_does(world: ErasureWorld, tab: OfflinePage) -> None:
    listed = world.get("/v1/erasures", tenant=TENANT)["erasures"]
    assert {e["erasure_id"] for e in listed} == {world.erasures[GONE], world.erasures[HOSTILE_SUBJECT]}
    gone = next(e for e in listed if e["erasure_id"] == world.erasures[GONE])
    # the numbers compared below are the API's; they are worth comparing (sealed facts were purged, a key destroyed)
    assert gone["complete"] and gone["keys"] and gone["records"]["total"] > 0 and gone["records"]["clear"] == 0
    assert gone["purged"]["postgres"]["versions"] > 0 and gone["purged"]["elasticsearch"]["documents"] > 0

    console = signed_in(tab)
    assert console.erasures() == "ready", console.error()
    rows = console.rows("erasures")
    assert [r["_data"]["erasureId"] for r in rows] == [e["erasure_id"] for e in listed]  # newest first, as the API
    assert shown(console) == [expected(e) for e in listed]
    assert console.erasure_keys() == keys_of(listed)
    assert world.erasures[FOREIGN_GONE] not in tab.page.inner_text("#panel-erasures")  # globex's is not listed

    # one subject's records: GET /v1/erasures?subject= (the record holds only its digest)
    assert console.erasures(GONE) == "ready", console.error()
    only = world.get("/v1/erasures", tenant=TENANT, subject=GONE)["erasures"]
    assert [e["erasure_id"] for e in only] == [world.erasures[GONE]]
    assert shown(console) == [expected(e) for e in only]
    assert console.erasures(KEPT) == "ready", console.error()
    assert console.rows("erasures") == [] and world.get("/v1/erasures", tenant=TENANT, subject=KEPT)["erasures"] == []


def test_the_erasures_view_pages_on_with_the_apis_cursor(world: ErasureWorld, tab: OfflinePage) -> None:
    """More than a page of records: the view shows the first page and "More" appends the next one, with the
    cursor the API gave, until the API says there is no more. The console's own page size is turned down to one
    on the way to the real API (the request's `limit` rewritten), so two records make two pages."""
    listed = world.get("/v1/erasures", tenant=TENANT)["erasures"]
    assert len(listed) == 2
    with page_size(tab.context, "**/v1/erasures?*", 1) as asked:
        console = signed_in(tab)
        assert console.erasures() == "ready", console.error()
        assert shown(console) == [expected(listed[0])]
        assert tab.page.is_visible("#erasures-more") and "more" in tab.page.inner_text("#erasures-count")
        tab.page.click("#erasures-more")
        console.wait_panel("erasures", "ready")
        assert shown(console) == [expected(e) for e in listed], console.error()
        assert not tab.page.is_visible("#erasures-more") and "more" not in tab.page.inner_text("#erasures-count")
        assert "cursor" not in asked[-2].params and asked[-1].params["cursor"]  # the second asked after the first


# -- an erased subject ---------------------------------------------------------------------------------------


def test_an_erased_subject_says_so_and_links_to_its_record(world: ErasureWorld, tab: OfflinePage) -> None:
    erasure_id = world.erasures[GONE]
    console = signed_in(tab)
    assert console.type_subject(GONE) == "ready", console.error()
    assert console.rows("facts") == []  # purged
    assert "subject.erased" in [r["type"] for r in console.rows("timeline")]  # the tombstone stays
    note = console.erased_note()
    assert note["links"] == [[erasure_id, erasure_id]] and "was erased" in note["text"]

    assert console.follow_erasure(erasure_id) == "ready", console.error()
    record = world.get(f"/v1/erasures/{erasure_id}", tenant=TENANT)
    assert console.erasure_shown() == erasure_id
    assert shown(console, "erasure-one") == [expected(record)]
    assert console.erasure_keys("erasure-one") == keys_of([record])
    # below it, that subject's records (the list asked with ?subject=)
    only = world.get("/v1/erasures", tenant=TENANT, subject=GONE)["erasures"]
    assert shown(console) == [expected(e) for e in only]

    # the link is a real fragment: a reload shows the same record
    assert "erasure=" in tab.page.url
    tab.page.reload()
    tab.page.wait_for_selector("#app:not([hidden])")
    console.wait_panel("erasures", "ready")
    assert console.erasure_shown() == erasure_id and shown(console, "erasure-one") == [expected(record)]

    # a subject that was never erased has no note
    assert console.type_subject(KEPT) == "ready", console.error()
    assert console.rows("facts") and console.erased_note() == {"text": "", "links": []}


def test_a_hostile_subject_and_erasure_id_are_shown_as_text(world: ErasureWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.type_subject(HOSTILE_SUBJECT) == "ready", console.error()
    assert HOSTILE_SUBJECT in (tab.page.text_content("#subject-title") or "")
    assert console.erased_note()["links"] == [[HOSTILE_ERASURE, HOSTILE_ERASURE]]

    assert console.follow_erasure(HOSTILE_ERASURE) == "ready", console.error()
    record = world.get(f"/v1/erasures/{HOSTILE_ERASURE}", tenant=TENANT)
    assert console.erasure_shown() == HOSTILE_ERASURE
    assert shown(console, "erasure-one") == [expected(record)]
    assert HOSTILE_ERASURE in (tab.page.text_content("#erasure-title") or "")
    assert tab.page.input_value("#erasures-subject") == HOSTILE_SUBJECT
    assert HOSTILE_SUBJECT in (tab.page.text_content("#erasures-title") or "")
    assert tab.page.locator("#app script, #app img, #app b").count() == 0
    assert tab.page.evaluate("window.__pwned") is None


# -- tenancy -------------------------------------------------------------------------------------------------


def test_another_tenants_erasure_is_not_reachable(world: ErasureWorld, tab: OfflinePage) -> None:
    foreign_id = world.erasures[FOREIGN_GONE]
    # a link into globex's record with acme's key: the API's 403, shown, and nothing of the record
    console = signed_in(tab, fragment=link(tenant=FOREIGN, view="erasures", erasure=foreign_id))
    console.wait_panel("erasures", "error")
    body = world.get(f"/v1/erasures/{foreign_id}", tenant=FOREIGN, status=403)
    assert body == world.get("/v1/erasures", tenant=FOREIGN, status=403)
    assert console.error() == error_line(body, 403) and console.error_codes() == ["forbidden_tenant"]
    assert console.rows("erasures") == [] and console.erasure_shown() == ""

    # its id in the key's own tenant: no such record there (404), and acme's list does not have it
    tab.page.goto("about:blank")
    ConsolePage(tab.page).open(link(tenant=TENANT, view="erasures", erasure=foreign_id))
    console.wait_panel("erasures", "error")
    body = world.get(f"/v1/erasures/{foreign_id}", tenant=TENANT, status=404)
    assert console.error() == error_line(body, 404) and console.error_codes() == ["not_found"]
    assert console.erasure_shown() == ""
    assert console.erasures() == "ready", console.error()
    assert foreign_id not in [r["_data"]["erasureId"] for r in console.rows("erasures")]

    # with globex's own key the record is there (so the checks above could fail)
    console.sign_out()
    console.login(FOREIGN_KEY)
    assert console.tenants() == [FOREIGN]
    assert console.erasures() == "ready", console.error()
    record = world.get(f"/v1/erasures/{foreign_id}", key=FOREIGN_KEY, tenant=FOREIGN)
    assert shown(console) == [expected(record)]
