"""docs/other-languages.md stays true: its console-producer command, run as written, gets its event projected.

The block after the `<!-- tested: ... -->` marker is run by bash exactly as the document shows it, with
the variables the document's previous block sets pointed at this test's private topic (`KAFKA_CP` from
infra.kafka.tools_classpath, the jars `infra up` resolves). Against the real broker, with the projector
worker and the app on private settings: the fact is projected as the document shows, a second run of the
same command changes nothing (same tenant and event_id), and a confirmation published through the Python
SDK lands in the same partition as the Java producer's record (both hash the key `tenant|subject` alike).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from infra.kafka import tools_classpath
from producers.contract import MemoryEvent, decode
from producers.settings import REPO_ROOT, Settings
from tests.conftest import unique
from tests.support import pipeline, read_topic, wait_for

DOC = REPO_ROOT / "docs" / "other-languages.md"
MARKER = "<!-- tested: tests/test_other_languages.py"
H = {"X-API-Key": "dev-key"}


def block_under_test() -> str:
    """The fenced bash block right after the marker, as the reader copies it."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(MARKER) + r"[^\n]*\n```bash\n(.*?)\n```", text, re.S)
    assert found, f"{DOC} has no ```bash block after {MARKER!r}"
    return found.group(1)


def documented(pattern: str) -> str:
    found = re.search(pattern, DOC.read_text(encoding="utf-8"))
    assert found, pattern
    return found.group(1)


def run_block(settings: Settings, block: str) -> None:
    env = {
        **settings.child_environ(),
        "KAFKA_CP": tools_classpath(settings),
        "BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"the documented command failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    return base_settings.private(unique("ol"))  # the default keys: dev-key may use tenant demo, as in the document


def test_the_documented_console_producer_command_gets_its_event_projected(settings: Settings) -> None:
    block = block_under_test()
    assert "org.apache.kafka.tools.ConsoleProducer" in block and "parse.key=true" in block
    event = json.loads(documented(r"'(\{\"event_id\".*?\})'"))  # the value the block sends
    key = documented(r"printf '%s\\t%s\\n' '([^']+)'")
    assert key == f"{event['tenant']}|{event['subject']}", "the documented key is not tenant|subject"
    facts_url = f"/v1/subjects/{event['subject']}/facts"

    with pipeline(settings, indexer=False, app=True) as pipe:
        run_block(settings, block)

        def projected() -> dict | None:
            pipe.worker.check()
            body = pipe.client.get(facts_url, params={"tenant": event["tenant"]}, headers=H).json()
            return body["facts"][0] if body.get("facts") else None

        fact = wait_for(projected, 60, 0.3, "the console producer's event to be projected")
        assert (fact["key"], fact["value"], fact["content"]) == (event["key"], event["value"], event["content"])
        assert fact["event_id"] == event["event_id"] and fact["source"] == event["source"]
        assert fact["confidence"] == 1.0 and fact["status"] == "active" and fact["version"] == 1

        (record,) = read_topic(settings)  # as the broker holds it: the key the document gives, the value as sent
        assert record.key == key.encode() and decode(record.value).event_id == event["event_id"]
        assert fact["partition"] == record.partition == int(documented(r'"partition": (\d+)')), (
            "the documented partition"
        )

        run_block(settings, block)  # again: the same (tenant, event_id) is applied once
        confirm = MemoryEvent(
            type="memory.confirmed", tenant=event["tenant"], subject=event["subject"], key=event["key"]
        )
        (sdk_result,) = pipe.publish([confirm])  # observed now, like the console record (its broker time)
        assert sdk_result.partition == record.partition, "the SDK and the Java producer put the subject apart"
        pipe.settle()
        events = pipe.client.get(f"/v1/subjects/{event['subject']}/events", params={"tenant": "demo"}, headers=H)
        assert [e["type"] for e in events.json()["events"]] == ["memory.asserted", "memory.confirmed"], events.text
        assert [r.offset for r in read_topic(settings)] == [0, 1, 2]  # both console runs are on the ledger
        (fact,) = pipe.client.get(facts_url, params={"tenant": "demo"}, headers=H).json()["facts"]
        assert fact["version"] == 1 and fact["confirmed_count"] == 1
        stats = pipe.client.get("/v1/stats", params={"tenant": "demo"}, headers=H).json()
        assert stats["dlq_count"] == 0 and stats["double_active"] == 0, stats
