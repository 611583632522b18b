"""The audit console's Operations view in a real headless Chromium against the real stack.

The world (tests.support.console_world): the scenario published through the SDK, projected by the worker, indexed by
the indexer, the API under uvicorn, all on private names. Malformed records are written straight to the ledger topic
(`produce_malformed`, as a client that skips the SDK and the API would) and the worker dead-letters them. What the
view shows is read back as text and compared with the API's own JSON (`/v1/health`, `/v1/stats`,
`/v1/dead-letters`, `/v1/stats/consistency`), never with numbers written here. Every request to anything but the
service is aborted and must not happen, and no script error may occur.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import unique
from tests.support import Worker, asserted
from tests.support.browser import OfflinePage
from tests.support.console_page import ConsolePage, short
from tests.support.console_world import (
    AUDITOR_KEY,
    FOREIGN,
    MALFORMED,
    ConsoleWorld,
    console_world,
    produce_malformed,
)

TENANT = "acme"


@pytest.fixture(scope="module")
def world(base_settings) -> Iterator[ConsoleWorld]:
    with console_world(base_settings.private(unique("cops"))) as w:
        yield w


def api(world: ConsoleWorld, path: str, status: int = 200, **params: Any) -> dict[str, Any]:
    r = httpx.get(world.url + path, params=params, headers={"X-API-Key": AUDITOR_KEY}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def in_ops(tab: OfflinePage) -> ConsolePage:
    console = ConsolePage(tab.page).open()
    console.login(AUDITOR_KEY)
    assert console.signed_in(), console.login_error()
    assert console.ops() == "ready", console.error()
    return console


def letter_row(d: dict[str, Any]) -> dict[str, str]:
    """What a row of the dead letters' table must show for this letter of the API (resolution aside)."""
    return {
        "ledger": f"{d['partition']}/{d['offset']}",
        "state": d["state"],
        "code": d["reason"]["code"],
        "field": d["reason"]["field"] or "—",
        "message": d["reason"]["message"],
        "event_id": d["event_id"] or "—",
        "recorded_at": short(d["recorded_at"]),
    }


def letters_shown(console: ConsolePage) -> list[dict[str, str]]:
    return [
        {k: r[k] for k in ("ledger", "state", "code", "field", "message", "event_id", "recorded_at")}
        for r in console.letters()
    ]


def test_health_lag_and_backlogs_are_what_the_api_says(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = in_ops(tab)
    health = api(world, "/v1/health")
    shown = console.health_shown()
    assert shown.pop("_status") == {"status": health["status"]} and health["status"] == "ok"
    assert set(shown) == set(health["parts"]) == {"postgres", "elasticsearch", "kafka"}
    for name, part in health["parts"].items():
        assert (shown[name]["ok"], shown[name]["state"]) == (str(part["ok"]).lower(), "up" if part["ok"] else "down")
    assert "cluster " + health["parts"]["elasticsearch"]["status"] in shown["elasticsearch"]["answer"]

    stats = api(world, "/v1/stats", tenant=TENANT)
    pipeline = console.kv("ops-pipeline")
    search = stats["search"]
    # each stage by its backlog: caught up when it has none
    stages = {r["_data"]["stage"]: (r["state"], r["_data"]["backlog"]) for r in console.rows("ops-stages")}
    backlogs = {
        "projector": stats["total_lag"],
        "indexer": search["outbox_pending"],
        "embedder": search["vectors_pending"],
    }
    assert stages == {k: ("behind" if n else "caught up", str(n)) for k, n in backlogs.items()}
    assert set(stages.values()) == {("caught up", "0")}  # the world is settled
    assert pipeline["total_lag"] == str(stats["total_lag"])
    assert pipeline["events_applied"] == str(stats["events_applied"]) and stats["events_applied"] > 0
    assert (pipeline["pg_versions"], pipeline["es_documents"]) == (
        str(search["pg_versions"]),
        str(search["es_documents"]),
    )
    assert pipeline["outbox_pending"].startswith(f"{search['outbox_pending']}, ")
    assert pipeline["vectors_pending"].startswith(f"{search['vectors_pending']}, ")
    assert pipeline["dlq_count"] == str(stats["dlq_count"])
    # Kafka lag: one row per partition, as the API counts it
    lag = {r["partition"]: (r["end_offset"], r["position"], r["lag"]) for r in console.rows("ops-lag")}
    assert lag == {p: (str(v["end_offset"]), str(v["position"]), str(v["lag"])) for p, v in stats["lag"].items()}
    assert sum(int(v[0]) for v in lag.values()) >= stats["events_applied"]
    note = tab.page.text_content("#ops-lag-note") or ""
    assert stats["consumer"] in note and stats["topic"] in note
    # the erasures box: as the API lists them (none in this world: encryption is off)
    assert api(world, "/v1/erasures", tenant=TENANT)["erasures"] == []
    assert tab.page.text_content("#ops-erasures-summary") == "no erasure record"


def test_a_stopped_worker_shows_as_lag_per_partition_and_a_stage_behind(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = in_ops(tab)
    assert world.pipe.worker is not None
    world.pipe.worker.stop()
    try:
        world.pipe.publish([asserted(f"lag:{i}", "k", i, i, event_id=f"ev-lag-{i}") for i in range(6)])
        assert console.refresh_ops() == "ready", console.error()
        stats = api(world, "/v1/stats", tenant=TENANT)
        assert stats["total_lag"] >= 6, stats  # the API counts the backlog too (so the page's could be wrong)
        lag = {r["partition"]: r["lag"] for r in console.rows("ops-lag")}
        assert lag == {p: str(v["lag"]) for p, v in stats["lag"].items()} and sum(map(int, lag.values())) >= 6
        behind = tab.page.locator('#ops-lag td[data-field="lag"].behind').count()
        assert behind == sum(1 for v in stats["lag"].values() if v["lag"])
        projector = next(r for r in console.rows("ops-stages") if r["_data"]["stage"] == "projector")
        assert projector["state"] == "behind" and projector["backlog"].startswith(f"{stats['total_lag']} records ")
    finally:
        world.pipe.worker = Worker(world.settings).start()
    world.pipe.settle()
    assert console.refresh_ops() == "ready", console.error()
    assert {r["state"] for r in console.rows("ops-stages")} == {"caught up"}
    assert {r["lag"] for r in console.rows("ops-lag")} == {"0"}


def test_a_malformed_record_is_listed_opened_redriven_and_applied(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = in_ops(tab)
    before = {r["ledger"] for r in console.letters("")}
    partition, offset = produce_malformed(world, "missing-content")
    assert f"{partition}/{offset}" not in before
    assert console.refresh_ops() == "ready", console.error()

    listed = api(world, "/v1/dead-letters", tenant=TENANT, state="open")["dead_letters"]
    [letter] = [d for d in listed if (d["partition"], d["offset"]) == (partition, offset)]
    assert letter["reason"]["code"] == "missing_field" and letter["reason"]["field"] == "content", letter
    assert letters_shown(console) == [letter_row(d) for d in listed]

    # opened: the record's fields as the API decodes them
    assert console.open_letter(partition, offset) == "ready", console.error()
    record = api(world, f"/v1/dead-letters/{partition}/{offset}", tenant=TENANT)["record"]
    assert console.letter_fields() == {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
    assert record == MALFORMED["missing-content"]
    assert tab.page.locator("#dead-letters tr.selected").get_attribute("data-position") == f"{partition}:{offset}"

    # re-driven with the content it lacked: the page follows the event until the worker applied it
    corrected = {**json.loads(tab.page.input_value("#redrive-event")), "content": "ticket T-100 has high priority"}
    assert corrected == {**record, "content": "ticket T-100 has high priority"}  # the draft is the record
    assert console.redrive(json.dumps(corrected)) == "applied", tab.page.text_content("#letter-outcome")
    status = api(world, f"/v1/events/{record['event_id']}", tenant=TENANT)
    assert status["status"] == "applied"
    outcome = tab.page.text_content("#letter-outcome") or ""
    assert f"event {record['event_id']} applied at {status['partition']}/{status['offset']}" in outcome
    # the letter reads re-driven, by that event, in the list and in its detail; the fact holds
    resolved = next(
        d
        for d in api(world, "/v1/dead-letters", tenant=TENANT)["dead_letters"]
        if d["partition"] == partition and d["offset"] == offset
    )
    assert resolved["state"] == "redriven" and resolved["resolution"]["event_id"] == record["event_id"]
    row = next(r for r in console.letters() if r["ledger"] == f"{partition}/{offset}")
    assert row["state"] == "redriven" and row["resolution"].startswith(
        f"by {record['event_id']} at {status['partition']}/{status['offset']}"
    )
    assert tab.page.get_attribute("#letter-detail", "data-letter-state") == "redriven"
    assert not tab.page.is_visible("#letter-actions")  # resolved: nothing more to do
    facts = api(world, "/v1/subjects/ticket:T-100/facts", tenant=TENANT)["facts"]
    assert [(f["key"], f["value"]) for f in facts] == [("ticket.priority", "high")]


def test_a_malformed_record_is_discarded_with_its_reason(world: ConsoleWorld, tab: OfflinePage) -> None:
    partition, offset = produce_malformed(world, "bad-time")
    console = in_ops(tab)
    assert console.open_letter(partition, offset) == "ready", console.error()
    assert console.letter_fields()["valid_from"] == "last tuesday"
    reason = "an import test, not a real ticket"
    assert console.discard(reason) == "applied", tab.page.text_content("#letter-outcome")
    letters = api(world, "/v1/dead-letters", tenant=TENANT, state="discarded")["dead_letters"]
    [letter] = [d for d in letters if (d["partition"], d["offset"]) == (partition, offset)]
    assert (
        letter["resolution"]["reason"] == reason
        and letter["resolution"]["event_id"] == f"deadletter:{partition}:{offset}"
    )
    row = next(r for r in console.letters("discarded") if r["ledger"] == f"{partition}/{offset}")
    assert row["state"] == "discarded" and row["resolution"].endswith(f": {reason}")
    assert letters_shown(console) == [letter_row(d) for d in letters]
    assert reason in (tab.page.text_content("#letter-note") or "")
    # nothing was deleted: every letter is still listed, in its state
    every = api(world, "/v1/dead-letters", tenant=TENANT)["dead_letters"]
    assert letters_shown_all(console) == [letter_row(d) for d in every]


def letters_shown_all(console: ConsolePage) -> list[dict[str, str]]:
    console.letters("")
    return letters_shown(console)


def test_an_action_the_api_refuses_is_shown_as_it_words_it(world: ConsoleWorld, tab: OfflinePage) -> None:
    partition, offset = produce_malformed(world, "wrong-kind")
    console = in_ops(tab)
    assert console.open_letter(partition, offset) == "ready", console.error()
    # the corrected event still of another tenant: the API's 422, and the letter stays open
    draft = json.loads(tab.page.input_value("#redrive-event"))
    said = console.redrive(json.dumps({**draft, "kind": "state", "tenant": FOREIGN}))
    r = httpx.post(
        f"{world.url}/v1/dead-letters/redrive",
        json={"tenant": TENANT, "partition": partition, "offset": offset, "event": {**draft, "tenant": FOREIGN}},
        headers={"X-API-Key": AUDITOR_KEY},
        timeout=30,
    )
    assert r.status_code == 422, r.text
    item = r.json()["detail"][0]
    assert said == f"error: 422 {item['code']} · {item['field']}: {item['message']}"
    # not JSON at all: said before anything is sent
    assert console.redrive("{not json").startswith("error: not_json · event: ")
    assert api(world, f"/v1/dead-letters/{partition}/{offset}", tenant=TENANT)["state"] == "open"


def test_the_consistency_check_runs_on_demand(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = in_ops(tab)
    assert tab.page.locator("#consistency").count() == 0  # not run until asked: it scans everything
    assert console.consistency() == "ready", console.error()
    check = api(world, "/v1/stats/consistency", tenant=TENANT)
    shown = console.kv("consistency")
    assert shown["consistent"] == ("consistent" if check["consistent"] else "inconsistent") and check["consistent"]
    assert shown["invariants"] == ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in check["invariants"].items())
    assert shown["counter_drift"] == "all equal" and check["counter_drift"] == {}
    search = check["search"]
    assert shown["orphans"].startswith(f"{search['missing_in_es']} / {search['missing_in_pg']}")
    rows = check["scanned"]["postgres_rows"]
    assert shown["scanned"] == ", ".join(f"{k} {v}" for k, v in rows.items()) + (
        f"; {check['scanned']['elasticsearch_documents']} index documents"
    )


def test_a_dead_letter_can_be_linked(world: ConsoleWorld, tab: OfflinePage) -> None:
    partition, offset = produce_malformed(world, "wrong-kind")
    console = in_ops(tab)
    assert console.open_letter(partition, offset) == "ready", console.error()
    assert f"letter={partition}%3A{offset}" in tab.page.url and "view=ops" in tab.page.url
    tab.page.reload()
    console.wait_panel("ops", "ready")
    assert tab.page.get_attribute("#letter-detail", "data-position") == f"{partition}:{offset}"
    assert tab.page.is_visible("#letter-detail")


def test_a_linked_letter_that_is_no_place_asks_nothing(world: ConsoleWorld, tab: OfflinePage) -> None:
    """A link's `letter` went into a request path as it stood: `..%2Fstats%2Fconsistency%23%3A1` made the operator's
    browser run the whole-tenant consistency scan on every load. Only `partition:offset` numbers are a letter."""
    console = in_ops(tab)
    asked: list[str] = []
    tab.page.on("request", lambda request: asked.append(request.url))
    for letter in ("..%2Fstats%2Fconsistency%23%3A1", "1%3A..", "x%3A1", "1%3A2%3A3"):
        tab.page.goto(f"/console#tenant={TENANT}&view=ops&letter={letter}")
        tab.page.reload()  # a link opened anew (signed in for this tab)
        console.wait_panel("ops", "ready")
        assert tab.page.is_hidden("#letter-detail"), letter
        assert any("/v1/dead-letters?" in url for url in asked), asked  # the view did load
        assert not [url for url in asked if "/consistency" in url or "/dead-letters/" in url], (letter, asked)


def test_the_view_of_a_tenant_the_key_may_not_use_is_the_apis_403(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = ConsolePage(tab.page).open(f"#tenant={FOREIGN}&view=ops")
    console.login(AUDITOR_KEY)
    console.wait_panel("ops", "error")
    body = api(world, "/v1/stats", tenant=FOREIGN, status=403)
    item = body["detail"][0]
    for box in ("ops-stats", "ops-letters", "ops-erasures"):
        assert tab.page.get_attribute(f"#{box}", "data-state") == "error", box
        assert (tab.page.text_content(f"#{box} .box-error") or "").startswith(f"403 {item['code']}")
    assert tab.page.get_attribute("#ops-health", "data-state") == "ready"  # health names no tenant
    assert console.rows("dead-letters") == [] and console.rows("ops-lag") == []


def test_a_letter_whose_bytes_an_erasure_withheld_says_so(world: ConsoleWorld, tab: OfflinePage) -> None:
    """A refused record of an erased subject sent under another subject's key keeps its letter but not its bytes:
    the detail says they went with the subject, instead of showing a record of 0 bytes and an empty draft."""
    from kafka.partitioner.default import murmur2

    from producers.contract import kafka_key
    from tests.support import publish_raw, wait_for, wire

    subject = "ticket:T-gone"
    own = kafka_key(TENANT, subject)
    other = next(
        k
        for k in (kafka_key(TENANT, f"ticket:T-{n}") for n in range(100))
        if (murmur2(k) & 0x7FFFFFFF) % 6 != (murmur2(own) & 0x7FFFFFFF) % 6
    )
    refused = wire(subject, tenant=TENANT, event_id="ev-dl-gone", key="ticket.owner", value="ann", content=...)
    erasure = {"type": "subject.erased", "tenant": TENANT, "subject": subject, "event_id": "ev-dl-gone-erase"}
    [(partition, offset)] = publish_raw(world.settings, [(other, json.dumps(refused).encode())])
    [(erased_in, _)] = publish_raw(world.settings, [(own, json.dumps(erasure).encode())])
    assert erased_in != partition

    def withheld() -> bool:
        r = httpx.get(
            f"{world.url}/v1/dead-letters/{partition}/{offset}",
            params={"tenant": TENANT},
            headers={"X-API-Key": AUDITOR_KEY},
            timeout=30,
        )
        return r.status_code == 200 and r.json().get("withheld") is True

    wait_for(withheld, 90, 0.3, "the letter withheld")
    console = in_ops(tab)
    assert console.open_letter(partition, offset) == "ready", console.error()
    note = tab.page.text_content("#letter-note") or ""
    assert "went with its erased subject" in note and "0 bytes" not in note, note
    assert console.letter_fields() == {} and not tab.page.is_visible("#letter-raw")


def test_a_letters_raw_bytes_and_its_draft_cannot_reorder_the_page(world: ConsoleWorld, tab: OfflinePage) -> None:
    """The class (tests/test_console.py shows it for facts): a record the worker could not read as an object is
    shown as its raw text, and a right-to-left override in it turned the text around ("tenant: globex" read from
    a record of this tenant); a hidden character in a record's field came back raw in the re-drive draft. Both are
    shown spelled out now, the draft still the same JSON."""
    import json

    from producers.contract import kafka_key
    from tests.support import publish_raw, wait_for
    from tests.test_console import _hidden

    subject = "ticket:T-rtl"
    deep = "[" * 2000 + "]" * 2000
    head = json.dumps({"tenant": TENANT, "event_id": "ev-dl-rtl", "subject": subject, "z": "\u202e)xebolg :tnanet"},
                      ensure_ascii=False)  # fmt: skip
    raw = head[:-1] + ', "x": ' + deep + "}"
    odd = {"type": "memory.asserted", "tenant": TENANT, "subject": subject, "event_id": "ev-dl-rtl2",
           "key": "ticket.note", "value": "a\u202eb\u200bc", "content": "x", "bogus": 1}  # fmt: skip
    letters = publish_raw(world.settings, [(kafka_key(TENANT, subject), raw.encode()),
                                           (kafka_key(TENANT, subject), json.dumps(odd).encode())])  # fmt: skip

    def listed() -> bool:
        r = httpx.get(f"{world.url}/v1/dead-letters", params={"tenant": TENANT}, headers={"X-API-Key": AUDITOR_KEY},
                      timeout=30)  # fmt: skip
        return set(letters) <= {(d["partition"], d["offset"]) for d in r.json()["dead_letters"]}

    wait_for(listed, 90, 0.3, "both letters listed")
    console = in_ops(tab)
    (partition, offset), (partition2, offset2) = letters
    assert console.open_letter(partition, offset) == "ready", console.error()
    text = tab.page.text_content("#letter-raw") or ""
    assert "\\u202E)xebolg :tnanet" in text and not _hidden(text), _hidden(text)
    assert console.open_letter(partition2, offset2) == "ready", console.error()
    draft = tab.page.input_value("#redrive-event")
    assert "a\\u202Eb\\u200Bc" in draft and not _hidden(draft), draft
    assert json.loads(draft)["value"] == "a\u202eb\u200bc"  # the same JSON
