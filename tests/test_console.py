"""The audit console (`/console`) in a real headless Chromium against the real stack.

The world (tests.support.console_world): the scenario published through the SDK to Kafka, projected
by the worker into PostgreSQL and indexed by the indexer into Elasticsearch, served by `uvicorn
api.main:app` in a child process, all on private names. The browser is Debian's Chromium driven by
Playwright; every request it makes to anything but the service is aborted and must not happen, and
no script error may occur (checked after each test). What is shown is read back as text and
compared with the API's own JSON: the answer the page received and an independent request, in the forms the page
writes for reading (`short()`: a time without the zero digits of its fraction; `rounded()`: a score to 4 decimals).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.console import CSP
from tests.conftest import unique
from tests.support.browser import OfflinePage
from tests.support.console_page import ConsolePage, page_size, short
from tests.support.console_world import (
    AUDITOR_KEY,
    FOREIGN,
    FOREIGN_KEY,
    HOSTILE,
    LONG_SUBJECT,
    LONG_VALUE,
    SUBJECT,
    ConsoleWorld,
    console_world,
)
from tests.support.events import asserted

TENANT = "acme"
SECRET_SUBJECT, SECRET_VALUE = "user:secret-globex", "globex-only-value"
KEY_STORE = "memory-ledger.console.api-key"
CLIP = 120  # characters of a value the page shows before "show all" (console.js)


@pytest.fixture(scope="module")
def world(base_settings) -> Iterator[ConsoleWorld]:
    with console_world(base_settings.private(unique("console"))) as w:
        yield w


def api(world: ConsoleWorld, path: str, key: str = AUDITOR_KEY, status: int = 200, **params: Any) -> dict[str, Any]:
    r = httpx.get(world.url + path, params=params, headers={"X-API-Key": key}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def signed_in(tab: OfflinePage, key: str = AUDITOR_KEY) -> ConsolePage:
    console = ConsolePage(tab.page).open()
    console.login(key)
    assert console.signed_in(), console.login_error()
    return console


def shown(value: Any) -> str:
    """A JSON value as the console writes it: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def rounded(shown_text: str, exact: float) -> bool:
    """A score as the console shows it: `exact` to at most 4 decimals."""
    decimals = shown_text.split(".")[1] if "." in shown_text else ""
    return len(decimals) <= 4 and abs(float(shown_text) - exact) <= 0.5e-4 + 1e-12


def fact_row(f: dict[str, Any]) -> dict[str, Any]:
    """What a row of a facts table must show for this fact of the API."""
    return {
        "key": f["key"] or "—",
        "scope": f["scope"],
        "value": shown(f["value"]),
        "kind": f["kind"],
        "version": str(f["version"]),
        "valid_from": short(f["valid_from"]),
        "valid_to": short(f["valid_to"]),
        "observed_at": short(f["observed_at"]),
        "version_id": f["version_id"],
    }


FACT_FIELDS = ("key", "scope", "value", "kind", "version", "valid_from", "valid_to", "observed_at")


def facts_shown(console: ConsolePage, table: str) -> list[dict[str, Any]]:
    """The rows of a facts table as fact_row() spells them (the version id from the row's data attribute)."""
    return [{**{k: r[k] for k in FACT_FIELDS}, "version_id": r["_data"]["versionId"]} for r in console.rows(table)]


def error_line(body: dict[str, Any], status: int) -> str:
    """The banner line the console shows for the first item of an API error body."""
    item = body["detail"][0]
    return f"{status} {item['code']}" + (f" · {item['field']}" if item["field"] else "") + f": {item['message']}"


# -- signing in, tenants, subjects ---------------------------------------------------------------------------


def test_signing_in_lists_the_keys_tenants_and_their_subjects(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = ConsolePage(tab.page).open()
    assert tab.page.is_visible("#login") and not console.signed_in()
    console.login("not-a-key")
    assert not console.signed_in()
    assert console.login_error() == error_line(api(world, "/v1/tenants", key="not-a-key", status=401), 401)

    console.login(AUDITOR_KEY)
    assert console.signed_in()
    assert console.tenants() == api(world, "/v1/tenants")["tenants"] == ["acme", "initech"]
    listed = console.subjects()  # the first tenant's subjects, listed at sign-in
    assert listed == api(world, "/v1/subjects", tenant=TENANT)["subjects"]
    assert SUBJECT in listed and SECRET_SUBJECT not in listed
    assert console.search("user:") == api(world, "/v1/subjects", tenant=TENANT, prefix="user:")["subjects"]
    assert console.search("user:") == ["user:42", "user:7"]
    console.pick_tenant("initech")
    assert console.subjects() == api(world, "/v1/subjects", tenant="initech", prefix="user:")["subjects"] == ["user:1"]

    # the key lives in this tab's sessionStorage: a reload stays signed in, signing out forgets it
    tab.page.reload()
    tab.page.wait_for_selector("#app:not([hidden])")
    assert tab.page.evaluate(f"sessionStorage.getItem('{KEY_STORE}')") == AUDITOR_KEY
    console.sign_out()
    assert tab.page.is_visible("#login") and not console.signed_in()
    assert tab.page.evaluate(f"sessionStorage.getItem('{KEY_STORE}')") is None


def test_signing_out_leaves_nothing_the_key_read_for_the_next_key(world: ConsoleWorld, tab: OfflinePage) -> None:
    """Sign out hid the app and kept its page: the next key, signed in on the same tab, saw the last one's recall hits
    under its own tenant, and the page held the last receipt and drafts, hidden. Signing out starts a new page; a
    tenant picked in the picker empties the playground too."""
    console = signed_in(tab)
    console.open_subject(SUBJECT)
    facts = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=TENANT)["facts"]
    seen = [shown(f["value"]) for f in facts if isinstance(f["value"], str) and len(f["value"]) > 3]
    text = "document.documentElement.textContent"  # hidden views too
    assert seen and all(v in tab.page.evaluate(text) for v in seen), seen  # so the checks below can fail
    hits = console.recall(SUBJECT).json()["hits"]
    assert hits and console.rows("recall-hits")
    console.pick_tenant("initech")
    assert console.rows("recall-hits") == [] and not tab.page.is_visible("#recall-receipt")
    console.pick_tenant(TENANT)
    console.recall(SUBJECT)
    console.sign_out()
    page = tab.page.evaluate(text)
    assert SUBJECT not in page and not [v for v in seen if v in page]
    console.login(FOREIGN_KEY)
    assert console.tenants() == [FOREIGN]
    page = tab.page.evaluate(text)  # globex has a user:42 of its own: its values are not acme's
    assert not [v for v in seen if v in page]
    tab.page.click('#tabs button[data-view="recall"]')
    assert console.rows("recall-hits") == []


def test_the_subject_finder_pages_on_with_the_apis_cursor(world: ConsoleWorld, tab: OfflinePage) -> None:
    """More subjects than a page: the finder shows the first page and "More" appends the next, with the cursor the
    API gave, until the API says there is no more. The console's page size is turned down to two on the way to the
    real API (the request's `limit` rewritten), so the tenant's few subjects make several pages."""
    listed = api(world, "/v1/subjects", tenant=TENANT)["subjects"]
    assert len(listed) >= 3, listed
    with page_size(tab.context, "**/v1/subjects?*", 2) as asked:
        console = signed_in(tab)
        assert console.subjects() == listed[:2]
        pages = 1
        while tab.page.is_visible("#subjects-more"):
            assert "more" in tab.page.inner_text("#subjects-note")
            tab.page.click("#subjects-more")
            pages += 1
            tab.page.wait_for_function(
                "n => document.querySelectorAll('#subjects button.subject').length >= n",
                arg=min(2 * pages, len(listed)),
            )
            assert pages <= len(listed), "More never ends"
        assert console.subjects() == listed
        assert "more" not in tab.page.inner_text("#subjects-note")
        assert asked[-1].params["cursor"] and "cursor" not in asked[0].params
        assert console.search("user:") == api(world, "/v1/subjects", tenant=TENANT, prefix="user:", limit=2)["subjects"]


# -- facts and timeline --------------------------------------------------------------------------------------


def test_a_subjects_facts_and_timeline_are_what_the_api_says(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()

    facts = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=TENANT)["facts"]
    assert facts_shown(console, "facts") == [fact_row(f) for f in facts]
    assert {f["key"] for f in facts} == {"pref.seat", "profile.language", "note.free_text"}  # home.city retracted

    events = api(world, f"/v1/subjects/{SUBJECT}/events", tenant=TENANT)["events"]
    rows = console.rows("timeline")
    assert [r["_data"]["eventId"] for r in rows] == [e["event_id"] for e in events]  # ledger order
    for r, e in zip(rows, events, strict=True):
        assert r["ledger"] == f"{e['partition']}/{e['offset']}"
        assert (r["type"], r["event_id"]) == (e["type"], e["event_id"])
        assert r["observed_at"] == short(e["observed_at"])
        assert r["_data"]["effect"] == e["effect"]["effect"]
        assert r["effect"].startswith(e["effect"]["effect"]) and short(e["effect"]["detail"]) in r["effect"]
        src = e["event"]["source"]
        assert r["source"] == " · ".join(str(src[k]) for k in ("type", "service", "ref") if src.get(k))
    assert {e["effect"]["effect"] for e in events} >= {"superseded", "active", "confirmed", "override", "no_effect"}


def test_a_hostile_value_is_shown_as_text(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    hostile = [r for r in console.rows("facts") if r["key"] == "note.free_text"]
    assert [r["value"] for r in hostile] == [HOSTILE]
    timeline = {r["_data"]["eventId"]: r for r in console.rows("timeline")}
    assert timeline["ev-hostile"]["value"] == HOSTILE
    assert timeline["ev-hostile"]["source"] == "inferred · <b>scraper</b> · <img src=y onerror=window.__pwned=3>"
    assert tab.page.locator("#app img, #app b, #app script").count() == 0
    assert tab.page.evaluate("window.__pwned") is None

    # a hostile tenant name in a link comes back in the API's 403 message: text too
    evil = "<svg/onload=window.__pwned=4>"  # a tenant has no white space: this one is well formed, so a 403
    tab.page.goto("about:blank")
    ConsolePage(tab.page).open("#" + str(httpx.QueryParams({"tenant": evil, "subject": "x"})))
    tab.page.wait_for_selector("#error:not([hidden])")
    body = api(world, "/v1/subjects", tenant=evil, status=403)
    assert console.error().startswith(error_line(body, 403)) and evil in console.error()
    assert tab.page.locator("#app img, body img, #error svg").count() == 0
    assert tab.page.evaluate("window.__pwned") is None


# -- the version chain ---------------------------------------------------------------------------------------


def test_the_version_chain_shows_supersessions_and_overrides(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    assert console.chain_of("pref.seat") == "ready", console.error()

    facts = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=TENANT)["facts"]
    memory_id = next(f["memory_id"] for f in facts if f["key"] == "pref.seat")
    versions = api(world, f"/v1/facts/{memory_id}/history", tenant=TENANT)["versions"]
    number = {v["version_id"]: v["version"] for v in versions}
    rows = console.rows("chain")
    assert [r["_data"]["versionId"] for r in rows] == [v["version_id"] for v in versions]
    for r, v in zip(rows, versions, strict=True):
        assert (r["version"], r["value"]) == (str(v["version"]), shown(v["value"]))
        assert (r["valid_from"], r["valid_to"], r["observed_at"]) == (
            short(v["valid_from"]),
            short(v["valid_to"]),
            short(v["observed_at"]),
        )
        assert r["ledger"] == f"{v['partition']}/{v['offset']}"
        assert r["status"].startswith(v["status"]) and ("override" in r["status"]) == v["override"]
        if v["superseded_by"]:
            assert r["superseded"] == f"by v{number[v['superseded_by']]} at {short(v['superseded_at'])}"
        elif v["override"]:
            assert r["superseded"].startswith("override")
        else:
            assert r["superseded"] == "—"
    assert any(v["superseded_by"] for v in versions) and any(v["override"] for v in versions)

    # the confirmation shows on the version it confirmed
    events = api(world, f"/v1/subjects/{SUBJECT}/events", tenant=TENANT)["events"]
    confirmed = next(e["effect"]["version_id"] for e in events if e["type"] == "memory.confirmed")
    marks = {r["_data"]["versionId"]: r["marks"] for r in rows}
    assert "memory.confirmed" in marks[confirmed]
    assert all("memory.confirmed" not in m for vid, m in marks.items() if vid != confirmed)


# -- as of ---------------------------------------------------------------------------------------------------


def _values(rows: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((r["key"], r["value"]) for r in rows))


def test_the_as_of_control_replays_what_the_api_says(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    assert console.view("asof") == "ready", console.error()
    position, top = console.slider("asof")
    assert position == top and console.asof_inputs() == ("", "")  # now, everything known
    now = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=TENANT)["facts"]
    assert facts_shown(console, "asof-facts") == [fact_row(f) for f in now]

    path = f"/v1/subjects/{SUBJECT}/facts"
    seen: dict[str, tuple] = {}
    answer = console.move("asof", "Home")
    while True:
        as_of, known_at = console.asof_inputs()
        assert as_of and known_at == ""
        expected = api(world, path, tenant=TENANT, as_of=as_of)
        assert answer.json()["facts"] == expected["facts"], as_of  # the page asked for the time the control shows
        assert facts_shown(console, "asof-facts") == [fact_row(f) for f in expected["facts"]], as_of
        assert console.asof_shown() == {"state": "ready", "asOf": expected["as_of"]}
        seen[as_of] = _values(console.rows("asof-facts"))
        if console.slider("asof")[0] == top - 1:
            break
        answer = console.move("asof", "ArrowRight")
    assert len(set(seen.values())) >= 5, seen  # the facts shown change as the control moves
    seat = {t: dict(v).get("pref.seat") for t, v in seen.items()}
    assert seat["2026-03-04T00:00:00Z"] == "aisle"  # v2 superseded v1 on day 3
    assert seat["2026-03-06T00:00:00Z"] == "window"  # the trip override, days 5 to 8
    assert seat["2026-03-09T00:00:00Z"] == "aisle"  # the override's window has ended

    # known at: the language (valid from day 2) was only observed on day 12
    console.move("asof", "End")
    console.move_to("known", "2026-03-11T00:00:00Z")
    expected = api(world, path, tenant=TENANT, known_at="2026-03-11T00:00:00Z")
    assert facts_shown(console, "asof-facts") == [fact_row(f) for f in expected["facts"]]
    assert "profile.language" not in {r["key"] for r in console.rows("asof-facts")}
    console.move("known", "End")
    assert "profile.language" in {r["key"] for r in console.rows("asof-facts")}

    # a time typed by hand that the API refuses: its error, as the API words it
    tab.page.fill("#asof-valid", "1700000000")
    tab.page.press("#asof-valid", "Enter")
    tab.page.wait_for_selector("#error:not([hidden])")
    body = api(world, path, tenant=TENANT, as_of="1700000000", status=422)
    assert console.error() == error_line(body, 422) and console.error_codes() == ["invalid_time"]


def test_a_typed_time_moves_the_sliders_and_their_notes_say_where_it_falls(
    world: ConsoleWorld, tab: OfflinePage
) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    assert console.view("asof") == "ready", console.error()
    events = api(world, f"/v1/subjects/{SUBJECT}/events", tenant=TENANT)["events"]
    valid = sorted({short(t) for e in events for t in (e["valid_from"], e["valid_to"]) if t})  # the slider's points
    known = sorted({short(e["observed_at"]) for e in events})
    assert console.slider("asof") == (len(valid), len(valid)) and console.asof_notes()[0].endswith(": now")

    # a valid time that is one of the points, a known-at time between two: each slider on its place
    at, known_at = "2026-03-06T00:00:00Z", "2026-03-11T12:00:00+00:00"
    assert at in valid and known_at not in known
    console.type_asof(at, known_at)
    expected = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=TENANT, as_of=at, known_at=known_at)
    assert facts_shown(console, "asof-facts") == [fact_row(f) for f in expected["facts"]]
    valid_note, known_note = console.asof_notes()
    assert console.slider("asof")[0] == valid.index(at) and console.asof_inputs()[0] == at
    assert valid_note.startswith(f"point {valid.index(at) + 1} of {len(valid) + 1}: ") and "now" not in valid_note
    before = max(i for i, t in enumerate(known) if t < "2026-03-11T12:00:00Z")
    assert console.slider("known")[0] == before and console.asof_inputs()[1] == known_at  # the box keeps it
    assert known_note.startswith(f"typed {known_at} ") and "everything" not in known_note.split(": ", 1)[0]
    assert f"between point {before + 1} ({known[before]}: " in known_note
    assert f"and point {before + 2} ({known[before + 1]}: " in known_note
    # the slider goes on from there, and shows the next point
    console.move("known", "ArrowRight")
    assert console.asof_inputs()[1] == known[before + 1]
    assert console.asof_notes()[1].startswith(f"point {before + 2} of {len(known) + 1}: ")

    # before the first point; and both boxes emptied: now and everything, the sliders at the end
    console.type_asof("2026-02-01T00:00:00Z", "")
    assert console.slider("asof")[0] == 0 and console.asof_notes()[0].startswith("typed 2026-02-01T00:00:00Z")
    assert "before the first, point 1 (" in console.asof_notes()[0]
    assert console.slider("known") == (len(known), len(known)) and console.asof_notes()[1].endswith(
        ": everything the ledger holds"
    )
    console.type_asof("", "")
    assert console.slider("asof") == (len(valid), len(valid)) and console.asof_notes()[0].endswith(": now")
    # a time after the clock: after now, the slider on "now" (its last point at or before the typed time)
    console.type_asof("9999-12-31T23:59:59Z", "")
    assert console.slider("asof") == (len(valid), len(valid)), console.asof_notes()
    assert "after now (the last event: point " in console.asof_notes()[0], console.asof_notes()


def test_times_are_shown_without_a_zero_fraction(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    events = api(world, f"/v1/subjects/{SUBJECT}/events", tenant=TENANT)["events"]
    assert all(e["observed_at"].endswith(".000000Z") for e in events)  # what the API writes: worth shortening
    assert console.chain_of("pref.seat") == "ready", console.error()
    assert console.view("asof") == "ready", console.error()
    times = tab.page.eval_on_selector_all("#app .time[title]", "ts => ts.map(t => [t.textContent, t.title])")
    assert len(times) > 30  # facts, timeline, chain and the replay
    for text, exact in times:
        assert text == short(exact) and not re.search(r"\.0*Z", text), (text, exact)
    assert not re.search(r":\d\d\.0+(Z|[+-])", tab.page.text_content("#app") or "")  # effects' details too
    assert "2026-03-04T00:00:00Z" in (tab.page.text_content("#timeline") or "")


# -- the recall playground -----------------------------------------------------------------------------------


def _number(text: str) -> float:
    return float(re.sub(r"\s*ms$", "", text))


@pytest.mark.parametrize(
    ("query", "mode"),
    [("P1 的后端服务地址是什么", "auto"), ("refunded order", "keyword")],
    ids=["exact-alias", "keyword"],
)
def test_the_recall_playground_explains_each_hit_as_the_api_does(
    world: ConsoleWorld, tab: OfflinePage, query: str, mode: str
) -> None:
    console = signed_in(tab)
    answer = console.recall(query, mode=mode)
    assert answer.status == 200
    got = answer.json()
    assert got["hits"], got

    # the trace shown is the trace the page received: every stage's time, every tier's candidates
    trace = console.trace_shown()
    for stage, ms in got["trace"]["stages_ms"].items():
        assert _number(trace[stage]) == ms, stage
    tiers = {k: v for k, v in got["trace"].items() if k.endswith("_candidates")}
    assert tiers and all(trace[k.replace("_", " ", 1)] == str(v) for k, v in tiers.items())
    assert _number(trace["total"]) == got["trace"]["total_ms"]
    assert trace["embedding computed"] == ("yes" if got["trace"]["embedding_computed"] else "no")
    assert trace["mode"] == got["trace"]["mode"] == mode
    # each stage's candidates (the page asks to explain): the ids the API listed, in its order
    listed = got["trace"]["candidates"]
    assert listed and set(listed) <= set(got["trace"]["stages_ms"])
    assert console.candidates_shown() == {s: [c["version_id"] for c in found] for s, found in listed.items()}
    assert any(h["version_id"] in {c["version_id"] for found in listed.values() for c in found} for h in got["hits"])

    cues = console.cues_shown()
    for name in ("entities", "known_entities", "keys", "event_types", "terms"):
        assert cues[name.replace("_", " ")] == got["cues"][name], name
    assert cues["aliases"] == [f"{a['phrase']} → {', '.join(a['keys'])}" for a in got["cues"]["aliases"]]

    # each hit: its stage and why it matched, as the API said
    why = console.why_shown()
    assert [w["version_id"] for w in why] == [h["version_id"] for h in got["hits"]]
    for w, h in zip(why, got["hits"], strict=True):
        m = h["match"]
        assert w["stage"] == m["stage"]
        expected_cues = {
            k: f"{k.replace('_', ' ', 1)}: {', '.join(v) if isinstance(v, list) else v}"
            for k, v in m["cues"].items()
            if v
        }
        assert w["cues"] == expected_cues
        assert w["scores"].keys() == m["scores"].keys()
        assert all(rounded(w["scores"][k].split(" ", 1)[1], v) for k, v in m["scores"].items()), w["scores"]
        assert ("replaced_by" in m["verified"]) == ("PostgreSQL holds" in w["verified"])

    # an independent request answers the same hits for the same reasons
    body = {"tenant": TENANT, "query": query, "mode": mode, "top_k": 5}
    again = httpx.post(f"{world.url}/v1/recall", json=body, headers={"X-API-Key": AUDITOR_KEY}, timeout=60).json()
    assert [(h["version_id"], h["match"]["stage"], h["match"]["cues"]) for h in again["hits"]] == [
        (h["version_id"], h["match"]["stage"], h["match"]["cues"]) for h in got["hits"]
    ]
    assert again["cues"] == got["cues"]
    assert "candidates" not in again["trace"]  # listed only when asked to explain
    if mode == "auto":  # the alias cue finds P1's port exactly, and only the version holding now
        assert got["hits"][0]["match"]["stage"] == "exact"
        port = api(world, "/v1/subjects/project:P1/facts", tenant=TENANT)["facts"]
        assert got["hits"][0]["version_id"] == next(f["version_id"] for f in port)
    else:
        assert {h["match"]["stage"] for h in got["hits"]} == {"keyword"}


def test_scores_are_rounded_for_display(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    got = console.recall("refunded order", mode="keyword").json()
    listed = [c for found in got["trace"]["candidates"].values() for c in found if c["score"] is not None]
    exact = [c["score"] for c in listed] + [h["score"] for h in got["hits"]]
    assert any(len(repr(float(v)).split(".")[1]) > 4 for v in exact), exact  # worth rounding
    shown_candidates = tab.page.eval_on_selector_all(
        "#recall-trace li", "ls => ls.map(l => l.textContent.split(' · ')[1] ?? null)"
    )
    assert len(shown_candidates) == len(listed)
    assert all(rounded(t, c["score"]) for t, c in zip(shown_candidates, listed, strict=True)), shown_candidates
    hits = console.rows("recall-hits")
    assert all(rounded(r["score"], h["score"]) for r, h in zip(hits, got["hits"], strict=True)), hits


OTHER = "initech"  # the auditor key's second tenant


def _hidden(text: str) -> list[str]:
    """The characters of `text` that could reorder or hide what is shown: control (but tab and line breaks), format,
    separator (but the space) and private-use characters, and the invisible ones of other categories."""
    import unicodedata

    invisible = {"\u034f", "\u115f", "\u1160", "\u2800", "\u3164", "\ufe0f", "\uffa0", "\ufffc", "\ufffe", "\uffff"}
    ignorable = ((0x2060, 0x206F), (0xFFF0, 0xFFF8), (0xFDD0, 0xFDEF), (0xE0000, 0xE0FFF), (0x13430, 0x1343F))
    return [
        f"U+{ord(c):04X}"
        for c in text
        if c not in " \t\n\r"
        and (
            unicodedata.category(c)[0] in "CZ"
            and unicodedata.category(c) not in ("Cn", "Cs")
            or c in invisible
            or any(a <= ord(c) <= b for a, b in ignorable)
            or ord(c) & 0xFFFE == 0xFFFE  # a noncharacter of any plane
        )
    ]


def test_stored_text_cannot_reorder_the_page_or_widen_its_tables(world: ConsoleWorld, tab: OfflinePage) -> None:
    """The class: stored text is shown inside the console's own words and tables. A right-to-left override in a
    subject, key or value reordered the page around it (the subject `rtl<U+202E>exe.txt` read `rtltxt.exe`, and the
    Erasures heading's own words ran backwards; the as-of notes, a long value shown whole, a tooltip too), and a
    zero-width space made two subjects look the same; every such character is now shown spelled out, wherever the
    console shows stored text. A key of 200 letters without a break widened the facts table past the window; it
    wraps as a value does."""
    subject, key = "note:rtl\u202eexe.txt", "k" * 200
    long_value = "approved " + "y" * 130 + " status: \u202eDEVORPPA TON\u200b\u2060\U000e0041\u00a0\u2065\ufff0"
    world.pipe.publish([  # in the key's other tenant: the lists the other tests compare stay as they were
        asserted(subject, "rtl\u202ekey\u200b", "abc\u202edef\u2066x", 1, event_id="ev-rtl",
                 content="rtl\u202eexe.txt \u2800\u3164", tenant=OTHER),
        asserted(subject, key, "v", 1, event_id="ev-wide", content="a long key", tenant=OTHER),
        asserted(subject, "note.long", long_value, 1, event_id="ev-long", content="long", tenant=OTHER),
    ])  # fmt: skip
    world.pipe.settle()
    console = signed_in(tab)
    console.pick_tenant(OTHER)
    assert console.type_subject(subject) == "ready", console.error()
    shown = tab.page.text_content("#app") or ""
    assert "note:rtl\\u202Eexe.txt" in shown and "rtl\\u202Ekey\\u200B" in shown and "abc\\u202Edef\\u2066x" in shown
    for more in tab.page.locator("#facts button.more").all():  # a long value shown whole
        more.click()
    shown = tab.page.text_content("#app") or ""
    assert "DEVORPPA TON\\u200B\\u2060\\uDB40\\uDC41\\u00A0\\u2065\\uFFF0" in shown, shown[-400:]
    titles = tab.page.evaluate("[...document.querySelectorAll('[title]')].map((n) => n.title).join('\\n')")
    assert not _hidden(shown) and not _hidden(titles), (_hidden(shown), _hidden(titles))
    wide = tab.page.evaluate("document.querySelector('#facts').getBoundingClientRect().width")
    assert wide <= tab.page.viewport_size["width"], wide
    assert console.view("asof") == "ready", console.error()
    console.move("asof", "Home")
    notes = " ".join(console.asof_notes())
    assert "rtl\\u202Ekey\\u200B" in notes and not _hidden(notes), notes


def test_a_long_value_is_shortened_and_can_be_shown_whole(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert console.type_subject(LONG_SUBJECT) == "ready", console.error()
    [fact] = api(world, f"/v1/subjects/{LONG_SUBJECT}/facts", tenant=TENANT)["facts"]
    assert fact["value"] == LONG_VALUE and len(LONG_VALUE) > CLIP
    clipped = LONG_VALUE[:CLIP] + "…"
    for table in ("facts", "timeline"):
        cell = tab.page.locator(f'#{table} tbody td[data-field="value"]')
        assert cell.locator(".clipped").text_content() == clipped, table
        assert LONG_VALUE not in (cell.text_content() or "")
        more = cell.get_by_role("button")
        assert more.text_content() == f"show all {len(LONG_VALUE)} characters"
        more.click()
        assert cell.locator(".clipped").text_content() == LONG_VALUE and more.text_content() == "show less"
        more.click()
        assert cell.locator(".clipped").text_content() == clipped
    # a short value is shown whole, with no button
    assert console.open_subject(SUBJECT) == "ready", console.error()
    assert tab.page.locator("#facts button.more, #timeline button.more").count() == 0


def test_an_unknown_subject_says_nothing_is_recorded_and_hints_at_tenant_and_spelling(
    world: ConsoleWorld, tab: OfflinePage
) -> None:
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready" and console.unknown_note() == {}  # a known one has no note

    # user:1 has events in initech (another tenant of this key), none in acme
    assert api(world, "/v1/subjects/user:1/events", tenant=TENANT)["events"] == []
    assert console.type_subject("user:1") == "ready", console.error()
    note = console.unknown_note()
    assert "nothing is recorded" in note["hints"]["unknown"] and f"tenant {TENANT}" in note["hints"]["unknown"]
    prefix = next(
        p
        for p in ("user:1"[:n] for n in range(6, 0, -1))
        if api(world, "/v1/subjects", tenant=TENANT, prefix=p)["subjects"]
    )
    close = api(world, "/v1/subjects", tenant=TENANT, prefix=prefix, limit=5)["subjects"]
    assert close == ["user:42", "user:7"]
    assert note["offers"] == [["initech", "user:1"], *[[TENANT, s] for s in close]]
    assert "initech" in note["hints"]["tenant"] and "Did you mean" in note["hints"]["spelling"]
    tab.page.click('#subject-unknown button[data-tenant="initech"]')
    console.wait_panel("facts", "ready")
    assert console.picker()[0] == "initech" and console.unknown_note() == {}
    facts = api(world, "/v1/subjects/user:1/facts", tenant="initech")["facts"]
    assert facts and facts_shown(console, "facts") == [fact_row(f) for f in facts]

    # a name nothing in the tenant starts like: no offer, a word on the spelling
    console.pick_tenant(TENANT)
    assert console.type_subject("User:42") == "ready", console.error()
    note = console.unknown_note()
    assert note["offers"] == [] and "check the spelling" in note["hints"]["spelling"]


# -- tenancy -------------------------------------------------------------------------------------------------


def test_another_tenants_subject_is_not_reachable(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    assert FOREIGN not in console.tenants()
    for tenant in console.tenants():
        console.pick_tenant(tenant)
        assert SECRET_SUBJECT not in console.subjects()

    # its name typed in the key's own tenant: nothing (the API has no event of it there either)
    console.pick_tenant(TENANT)
    assert console.type_subject(SECRET_SUBJECT) == "ready"
    assert console.rows("facts") == [] and console.rows("timeline") == []
    assert api(world, f"/v1/subjects/{SECRET_SUBJECT}/events", tenant=TENANT)["events"] == []
    hints = console.unknown_note()["hints"]
    assert "nothing is recorded" in hints["unknown"] and "tenant" not in hints  # the hints ask only this key's tenants

    # a direct link into the other tenant: the API's 403, shown, and none of its data
    tab.page.goto("about:blank")
    ConsolePage(tab.page).open(f"#tenant={FOREIGN}&subject={SECRET_SUBJECT}")
    tab.page.wait_for_selector("#error:not([hidden])")
    console.wait_panel("facts", "error")
    body = api(world, f"/v1/subjects/{SECRET_SUBJECT}/facts", tenant=FOREIGN, status=403)
    assert console.error() == error_line(body, 403) and console.error_codes() == ["forbidden_tenant"]
    assert console.rows("facts") == [] and console.rows("timeline") == []
    assert SECRET_VALUE not in tab.page.inner_text("body")

    # the same subject's own user:42 in acme shows acme's values only
    tab.page.goto("about:blank")
    ConsolePage(tab.page).open(f"#tenant={TENANT}&subject={SUBJECT}")
    console.wait_panel("facts", "ready")
    assert SECRET_VALUE not in tab.page.inner_text("body")

    # with globex's own key the subject is there (so the checks above could fail)
    console.sign_out()
    console.login(FOREIGN_KEY)
    assert console.tenants() == [FOREIGN] and SECRET_SUBJECT in console.subjects()


def test_a_link_into_a_forbidden_tenant_shows_that_tenant_and_its_error(world: ConsoleWorld, tab: OfflinePage) -> None:
    """The picker stays on the tenant the link names, flagged, with the API's 403: never silently on another."""
    console = signed_in(tab)
    tab.page.goto("about:blank")
    ConsolePage(tab.page).open(f"#tenant={FOREIGN}&subject={SUBJECT}")
    console.wait_panel("facts", "error")
    value, label = console.picker()
    assert value == FOREIGN and label == f"{FOREIGN} (not this key's)"
    assert console.tenants()[1:] == api(world, "/v1/tenants")["tenants"]  # the key's own, after the flagged one
    body = api(world, f"/v1/subjects/{SUBJECT}/facts", tenant=FOREIGN, status=403)
    assert console.error() == error_line(body, 403) and console.error_codes() == ["forbidden_tenant"]
    assert "not one of this key's tenants" in (tab.page.text_content("#subject-note") or "")
    assert console.subjects() == [] and SECRET_VALUE not in tab.page.inner_text("body")
    # picking one of the key's tenants: the flagged entry goes
    console.pick_tenant(TENANT)
    assert console.picker() == (TENANT, TENANT) and console.tenants() == api(world, "/v1/tenants")["tenants"]
    assert console.subjects() == api(world, "/v1/subjects", tenant=TENANT)["subjects"]


# -- the page itself -----------------------------------------------------------------------------------------


def test_the_console_ships_every_asset_and_writes_no_markup(world: ConsoleWorld) -> None:
    page = httpx.get(f"{world.url}/console", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(not re.match(r"^[a-z]+:|^//", ref) for ref in refs), refs  # relative: this service
    for ref in refs:
        asset = httpx.get(f"{world.url}/{ref}", timeout=30)
        assert asset.status_code == 200, ref
        assert asset.headers["content-security-policy"] == CSP
    # the page under its assets' folder would find none of them (its links are relative): it lives at /console
    moved = httpx.get(f"{world.url}/console/static/index.html", timeout=30)
    assert moved.status_code == 308 and moved.headers["location"] == "/console", moved.status_code
    script = httpx.get(f"{world.url}/console/static/console.js", timeout=30).text
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", script)
    assert not re.search(r"https?://", script + page.text)
