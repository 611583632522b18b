"""The console's Receipt view in a real headless Chromium against the real stack (tests.support.console_world).

The world signs receipts with a key of the test's. A fact is written, recalled in the playground, and its receipt
opened from there: the page shows what `POST /v1/receipts/verify` and `/replay` answer (valid, signed by a trusted
key, each cited event held at its partition/offset with its chain link, the replay the same). After a newer version
of the fact, the same receipt still verifies and replays the same, and the cited version shows as superseded by the
new one. A receipt pasted with one byte changed shows invalid; another tenant's receipt is not found.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from producers.contract import version_id_for
from producers.keys.signing import new_signing_key
from tests.conftest import unique
from tests.support.browser import OfflinePage
from tests.support.console_page import ConsolePage
from tests.support.console_world import AUDITOR_KEY, ConsoleWorld, console_world
from tests.support.events import asserted, at

TENANT, SUBJECT = "acme", "project:R7"


@pytest.fixture(scope="module")
def world(base_settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleWorld]:
    key_file = tmp_path_factory.mktemp("console-receipts") / "chain-key"
    key_file.write_bytes(new_signing_key())
    key_file.chmod(0o600)
    with console_world(base_settings.private(unique("consolercpt"), chain_key_file=key_file)) as w:
        yield w


def _port(value: int, day: float, event_id: str, **fields: Any) -> Any:
    return asserted(
        SUBJECT, "project.db_port", value, day, entities=["R7"], aliases=["database port"], event_id=event_id,
        content=f"project R7 database port is {value}", **fields,
    )  # fmt: skip


def _verify(world: ConsoleWorld, receipt: dict[str, Any], tenant: str = TENANT) -> httpx.Response:
    return httpx.post(
        f"{world.url}/v1/receipts/verify",
        json={"tenant": tenant, "receipt": receipt},
        headers={"X-API-Key": AUDITOR_KEY},
        timeout=60,
    )


def signed_in(tab: OfflinePage) -> ConsolePage:
    console = ConsolePage(tab.page).open()
    console.login(AUDITOR_KEY)
    assert console.signed_in(), console.login_error()
    return console


def test_a_recall_receipt_opens_verified_and_replays_the_same(world: ConsoleWorld, tab: OfflinePage) -> None:
    world.pipe.publish([_port(5432, 1, "ev-r7-port-1")])
    world.pipe.settle()
    written = version_id_for(TENANT, "ev-r7-port-1")
    console = signed_in(tab)
    got = console.recall("R7 database port").json()
    receipt = got["receipt"]
    assert receipt["signature"] and receipt["cited"], receipt
    assert written in [c["version_id"] for c in receipt["cited"]]

    assert console.open_receipt() == "ready", console.error()
    seen = console.receipt_shown()
    assert seen["valid"] == "true" and "valid" in seen["title"], seen
    assert seen["summary"]["signature"].startswith("valid"), seen["summary"]
    assert seen["summary"]["answer"] == "matches the answer given"
    # each cited event, in the receipt's order: its place, its chain link, held; as the API verifies it
    checks = _verify(world, receipt).json()["cited"]
    assert [r["_data"]["versionId"] for r in seen["cited"]] == [c["version_id"] for c in receipt["cited"]]
    for row, cited, check in zip(seen["cited"], receipt["cited"], checks, strict=True):
        assert row["_data"]["state"] == check["state"] == "held", (row, check)
        assert row["ledger"] == f"{cited['partition']}/{cited['offset']}"
        assert cited["link"] and row["link"] == cited["link"][:12] + "…"
        assert row["state"].startswith("held") and f"offset {cited['offset']}" in row["state"]
    mine = next(r for r in seen["cited"] if r["_data"]["versionId"] == written)
    assert mine["now"] == "active"
    assert seen["replay"] == "true" and "same" in seen["replay_text"], seen
    assert seen["parts"] and all(v == "same" for v in seen["parts"].values()), seen["parts"]

    # a newer version told since: the receipt still holds and replays the same, its version is superseded now
    world.pipe.publish([_port(6543, 2, "ev-r7-port-2", observed_at=datetime.now(UTC))])
    world.pipe.settle()
    newer = version_id_for(TENANT, "ev-r7-port-2")
    request = {k: v for k, v in console_request(tab).items() if k != "tenant"}
    assert console.check_receipt(json.dumps(receipt), json.dumps(request)) == "ready", console.error()
    again = console.receipt_shown()
    assert again["valid"] == "true", again
    mine = next(r for r in again["cited"] if r["_data"]["versionId"] == written)
    assert mine["_data"]["state"] == "held"
    assert mine["now"] == "superseded by " + newer[:12] + "…", mine
    assert again["replay"] == "true", (again["replay_text"], again["parts"])
    assert again["summary"]["answer"] == "no answer given"

    # a version the ledger is told only now but observed before the receipt was issued: logged after the receipt's
    # positions, it is no part of the answer the receipt signed, which replays the same
    world.pipe.publish([_port(7654, 3, "ev-r7-port-late", observed_at=at(3))])
    world.pipe.settle()
    assert console.check_receipt(json.dumps(receipt), json.dumps(request)) == "ready", console.error()
    late = console.receipt_shown()
    assert late["valid"] == "true" and late["replay"] == "true", (late["replay_text"], late["parts"])

    # the subject erased since: the replay gives another answer, and the page says so, part by part
    erased = httpx.delete(
        f"{world.url}/v1/subjects/{SUBJECT}", params={"tenant": TENANT}, headers={"X-API-Key": AUDITOR_KEY}
    )
    assert erased.status_code == 202, erased.text
    world.pipe.settle()
    assert console.check_receipt(json.dumps(receipt), json.dumps(request)) == "ready", console.error()
    gone = console.receipt_shown()
    assert gone["replay"] == "false", gone
    assert "another answer" in gone["replay_text"] and gone["parts"]["exact"] == "differs", gone["parts"]


def test_a_subjects_facts_receipt_opens_verified_and_replays_the_same(world: ConsoleWorld, tab: OfflinePage) -> None:
    """The facts panel opens its answer's receipt too: every fact holding is cited, held, and replays the same."""
    world.pipe.publish([_port(5433, 1, "ev-r7-facts-1")])
    world.pipe.settle()
    console = signed_in(tab)
    assert console.open_subject(SUBJECT) == "ready", console.error()
    facts = httpx.get(
        f"{world.url}/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT}, headers={"X-API-Key": AUDITOR_KEY}
    ).json()["facts"]
    assert console.open_receipt("facts") == "ready", console.error()
    seen = console.receipt_shown()
    assert seen["valid"] == "true" and "facts" in seen["title"], seen
    assert seen["summary"]["answer"] == "matches the answer given"
    assert sorted(r["_data"]["versionId"] for r in seen["cited"]) == sorted(f["version_id"] for f in facts)
    assert all(r["_data"]["state"] == "held" for r in seen["cited"]), seen["cited"]
    assert console_request(tab) == {"subject": SUBJECT}
    assert seen["replay"] == "true" and "same" in seen["replay_text"], seen


def console_request(tab: OfflinePage) -> dict[str, Any]:
    """The request the Receipt view was given with the recall it opened (its second box)."""
    return json.loads(tab.page.input_value("#receipt-request"))


def test_a_receipt_with_one_byte_changed_shows_invalid(world: ConsoleWorld, tab: OfflinePage) -> None:
    console = signed_in(tab)
    receipt = console.recall("backend port P1").json()["receipt"]
    text = json.dumps(receipt)
    at = text.index(receipt["answer_digest"]) + 5
    changed = text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1 :]  # one byte of the answer's digest
    assert len(changed) == len(text) and sum(a != b for a, b in zip(changed, text, strict=True)) == 1
    assert _verify(world, json.loads(changed)).json()["signature"] == "invalid"

    assert console.check_receipt(changed) == "ready", console.error()
    seen = console.receipt_shown()
    assert seen["valid"] == "false" and "invalid" in seen["title"], seen
    assert seen["summary"]["signature"].startswith("invalid"), seen["summary"]
    assert seen["replay"] == "" and "signature does not hold" in seen["replay_text"]
    # the events it cites are still the ledger's: only the signature fails
    assert seen["cited"] and all(r["_data"]["state"] == "held" for r in seen["cited"]), seen["cited"]

    # the unchanged receipt verifies; the same receipt under another tenant is not found (nothing shown of it)
    assert console.check_receipt(text) == "ready" and console.receipt_shown()["valid"] == "true"
    console.pick_tenant("initech")
    assert console.check_receipt(text) == "error"
    assert console.error_codes() == ["not_found"] and console.rows("receipt-cited") == []
    console.pick_tenant(TENANT)
    assert console.check_receipt(text) == "ready" and console.receipt_shown()["valid"] == "true"
    for refused in ('{"receipt": 1}', '{"answer": "recall"}'):  # the verdict checked before goes with it
        assert console.check_receipt(refused) == "error"
        shown = console.receipt_shown()
        assert (shown["valid"], shown["title"], shown["cited"]) == ("", "Receipt", []), (refused, shown)
        assert console.page.text_content("#receipt-count") == "", refused


def test_a_cited_event_erased_since_shows_erased_and_nothing_of_it(world: ConsoleWorld, tab: OfflinePage) -> None:
    gone, secret = "user:r8", "r8-secret@example.org"
    world.pipe.publish(
        [asserted(gone, "contact.email", secret, 1, entities=["R8"], aliases=["r8 mail"], event_id="ev-r8-mail")]
    )
    world.pipe.settle()
    console = signed_in(tab)
    receipt = console.recall("R8 mail").json()["receipt"]
    vid = version_id_for(TENANT, "ev-r8-mail")
    assert vid in [c["version_id"] for c in receipt["cited"]]
    r = httpx.delete(
        f"{world.url}/v1/subjects/{gone}", params={"tenant": TENANT}, headers={"X-API-Key": AUDITOR_KEY}, timeout=60
    )
    assert r.status_code == 202, r.text
    world.pipe.settle()
    check = next(c for c in _verify(world, receipt).json()["cited"] if c["version_id"] == vid)
    assert check["state"] == "erased" and check["detail"].startswith("erased at "), check

    assert console.check_receipt(json.dumps(receipt)) == "ready", console.error()
    seen = console.receipt_shown()
    assert seen["valid"] == "true" and seen["summary"]["erased"] == "1", seen
    row = next(r for r in seen["cited"] if r["_data"]["versionId"] == vid)
    assert row["_data"]["state"] == "erased" and row["now"] == "erased", row
    assert row["state"].startswith("erased erased at ") and "partition" in row["state"], row
    shown = tab.page.eval_on_selector("#panel-receipt", "p => [...p.querySelectorAll('table, h3')].map(e =>"
                                      " e.textContent).join(' ')")  # fmt: skip
    assert secret not in shown and gone not in shown and "contact.email" not in shown
