"""Bad input: raw malformed records on the ledger topic, and a fuzzed HTTP API.

1. The malformed corpus (tests/malformed.py: truncated JSON, wrong types, huge payloads, unknown
   types, invalid times, empty strings, odd unicode, ...) plus a tombstone (no value) is written
   raw with kafka-python, as a client that bypasses the SDK would, interleaved in ONE partition
   with valid events whose text is odd but legal unicode (emoji ZWJ sequences, RTL scripts,
   zero-width characters, CJK, combining marks). Every invalid record must reach the DLQ topic
   with its expected reason; every valid one around them must be applied, byte for byte.
2. schemathesis generates requests for every operation of the app's OpenAPI spec (ASGI, a
   private settings with a known API key, authenticating through the spec's declared security
   schemes `ApiKeyAuth`/`BearerAuth`, more examples for POST /v1/events and POST /v1/recall):
   no response may be a 5xx, and no valid (positive) request is refused as unauthenticated.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import psycopg
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis.errors import Unsatisfiable
from kafka import KafkaConsumer, TopicPartition
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from api.main import create_app
from producers.contract import kafka_key
from producers.settings import Settings
from projections.embedding import load_embedder
from tests.conftest import unique
from tests.faults.support import TALLY
from tests.malformed import malformed_corpus
from tests.support import RecorderWriter, Worker, cleanup, drain_all, private_store, publish_raw, wait_caught_up

TENANT = "acme"  # a tenant of the default dev-key; the schema is private anyway
SUBJECT = "user:unicode"
ODD_TEXTS = [
    "👩‍💻 writes code with ☕️ and 🏳️‍🌈 flags; family 👨‍👩‍👧‍👦",  # emoji with zero-width joiners
    "مرحبا بالعالم — المنفذ هو 8080",  # Arabic, right to left
    "שלום עולם, port ‏8080‏",  # Hebrew with right-to-left marks
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",  # zero-width space, ZWNJ, ZWJ, BOM inside
    "后端服务端口是 8080，数据库在上海机房",  # CJK
    "日本語のテキストと한국어 텍스트",  # Japanese and Korean
    "cafe\u0301 nai\u0308ve Zalgo: Z\u0336\u0353a\u0337l\u0338g\u0335o",  # combining marks
    "नमस्ते दुनिया",  # Devanagari
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and \U0001f9ec outside the BMP",  # astral plane
]


def valid_event(i: int, text: str) -> dict:
    return {
        "event_id": f"uni-{i}-{uuid.uuid4().hex[:8]}",
        "type": "memory.asserted",
        "tenant": TENANT,
        "subject": SUBJECT,
        "key": f"note.{i}",
        "value": {"text": text, "n": i},
        "content": text,
        "aliases": [text[:20].strip() or "alias"],
        "observed_at": "2026-02-03T04:05:06Z",
    }


@pytest.fixture
def raw_settings(base_settings: Settings) -> Iterator[Settings]:
    settings = base_settings.private(unique("badin"))
    try:
        yield settings
    finally:
        cleanup(settings)


def read_dlq(settings: Settings, expected: int, timeout: float = 60.0) -> list[dict]:
    """Every envelope on the DLQ topic (bounded by `expected` records or `timeout`)."""
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False, consumer_timeout_ms=1000
    )
    try:
        parts = consumer.partitions_for_topic(settings.dlq_topic) or set()
        tps = [TopicPartition(settings.dlq_topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(orjson.loads(r.value) for r in records)
        return out
    finally:
        consumer.close()


def test_malformed_records_go_to_the_dlq_and_valid_unicode_around_them_applies(raw_settings: Settings) -> None:
    settings = raw_settings
    corpus = malformed_corpus(TENANT, SUBJECT) + [(None, "empty")]  # a tombstone record: no value at all
    key = kafka_key(TENANT, SUBJECT)  # one key: valid and invalid records strictly interleaved in one partition
    records: list[tuple[bytes, bytes | None]] = []
    valid: list[dict] = []
    for i, (raw, _code) in enumerate(corpus):
        event = valid_event(i, ODD_TEXTS[i % len(ODD_TEXTS)])
        valid.append(event)
        records += [(key, orjson.dumps(event)), (key, raw)]
    tail = valid_event(len(corpus), ODD_TEXTS[0])
    valid.append(tail)
    records.append((key, orjson.dumps(tail)))
    positions = publish_raw(settings, records)
    assert len({p for p, _ in positions}) == 1
    expected = {positions[2 * i + 1]: code for i, (_raw, code) in enumerate(corpus)}
    TALLY.add(events_injected=len(valid), malformed_injected=len(corpus))

    with Worker(settings) as worker:
        wait_caught_up(settings, timeout=90, worker=worker)
    letters = read_dlq(settings, len(corpus))
    got = {(d["partition"], d["offset"]): d["code"] for d in letters}
    wrong = {pos: (code, got.get(pos)) for pos, code in expected.items() if got.get(pos) != code}
    TALLY.add(dlq_count=len(got), dlq_wrong_reason=len(wrong))
    assert not wrong, f"records without their expected reason (expected, got): {wrong}"
    assert set(got) == set(expected), "only the invalid records are dead letters"
    assert all(d["message"] and d["topic"] == settings.topic for d in letters)

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT event_id, content, value, aliases FROM "{settings.pg_schema}".fact_versions'
        ).fetchall()
        dead = conn.execute(f'SELECT count(*) FROM "{settings.pg_schema}".dead_letters').fetchone()[0]
    stored = {eid: (content, value, aliases) for eid, content, value, aliases in rows}
    missing = [e["event_id"] for e in valid if e["event_id"] not in stored]
    TALLY.add(events_lost=len(missing))
    assert not missing, f"valid events around the bad ones were not applied: {missing}"
    for e in valid:
        assert stored[e["event_id"]] == (e["content"], e["value"], e["aliases"]), "unicode must survive byte for byte"
    assert dead == len(corpus)

    with TestClient(create_app(settings)) as client:  # and the API returns them as they were written
        r = client.get(f"/v1/subjects/{SUBJECT}/facts", params={"tenant": TENANT}, headers={"X-API-Key": "dev-key"})
        TALLY.add(http_requests=1, http_5xx=int(r.status_code >= 500))
        assert r.status_code == 200, r.text
        assert sorted(f["content"] for f in r.json()["facts"]) == sorted(e["content"] for e in valid)


# -- schemathesis against the app -----------------------------------------------------------------------

FUZZ_KEY = "fuzz-key"
FUZZ_TENANT = "fuzz"


@pytest.fixture(scope="module")
def fuzz_settings(base_settings: Settings) -> Iterator[Settings]:
    """A private schema and index holding a few real facts, and a key bound to the fuzz tenant."""
    settings = base_settings.private(unique("fuzz"), api_keys={FUZZ_KEY: [FUZZ_TENANT]})
    try:
        with private_store(settings) as (conn, es), RecorderWriter(settings) as writer:
            t = datetime(2026, 1, 5, tzinfo=UTC)
            writer.assert_fact(FUZZ_TENANT, "project:P1", "project.port", "P1 backend port is 8080", 8080, valid_from=t)
            writer.assert_fact(FUZZ_TENANT, "project:P1", "project.db", "P1 数据库在上海", "shanghai", entities=["P1"])
            writer.assert_fact(FUZZ_TENANT, "user:42", "pref.drink", "user 42 prefers tea", "tea", kind="preference")
            drain_all(settings, conn, es, load_embedder(settings))
            yield settings
    finally:
        cleanup(settings)


EXAMPLES = {GenerationMode.POSITIVE: 50, GenerationMode.NEGATIVE: 25}  # per operation; derandomized
# the write and the search door take the most varied input: more examples there (the whole test stays ~2 min)
MORE_EXAMPLES = {
    "POST /v1/events": {GenerationMode.POSITIVE: 300, GenerationMode.NEGATIVE: 150},
    "POST /v1/recall": {GenerationMode.POSITIVE: 300, GenerationMode.NEGATIVE: 150},
}
# schemathesis authenticates with the schemes the spec declares (api.deps), as any client reading it would
AUTH = SchemathesisConfig.from_dict(
    {"auth": {"openapi": {"ApiKeyAuth": {"api_key": FUZZ_KEY}, "BearerAuth": {"bearer": FUZZ_KEY}}}}
)


def own_tenant(case) -> None:
    """Name the key's tenant wherever a valid request names one, so generated requests get past tenancy
    (403) and into the handlers; invalid (negative) requests are left exactly as generated."""
    if isinstance(case.query, dict) and "tenant" in case.query:
        case.query["tenant"] = FUZZ_TENANT
    if isinstance(case.body, dict):
        if "tenant" in case.body:
            case.body["tenant"] = FUZZ_TENANT
        for event in case.body.get("events") or []:
            if isinstance(event, dict):
                event["tenant"] = FUZZ_TENANT


def fuzz_operation(operation, mode: GenerationMode, examples: int) -> tuple[list[int], list[str]]:
    """Run `examples` generated requests of one operation; (status codes, descriptions of 5xx answers)."""
    made: list[int] = []
    failures: list[str] = []

    @hsettings(
        max_examples=examples,
        derandomize=True,  # the same examples on every run
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if mode is GenerationMode.POSITIVE:
            own_tenant(case)
        response = case.call()
        made.append(response.status_code)
        if response.status_code >= 500:  # collected, not raised: every 5xx is reported, none shrunk away
            failures.append(f"{response.status_code} {response.text[:300]!r}\n    {case.as_curl_command()}")

    try:
        run()
    except Unsatisfiable:  # an operation with nothing to get wrong (no parameters, no body) has no invalid request
        if mode is not GenerationMode.NEGATIVE:
            raise
    return made, failures


def test_fuzzed_requests_never_get_a_5xx(fuzz_settings: Settings) -> None:
    """schemathesis (valid and invalid requests per the OpenAPI spec) against every operation: no 5xx."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(fuzz_settings), config=AUTH)
    assert set(schema.raw_schema["components"]["securitySchemes"]) == {"ApiKeyAuth", "BearerAuth"}
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = sorted(op.label for op in operations)
    for must in ("POST /v1/events", "POST /v1/recall", "DELETE /v1/subjects/{subject}", "GET /v1/stats"):
        assert must in labels, f"{must} missing from the OpenAPI spec: {labels}"
    t0 = time.monotonic()
    report: dict[str, int] = {}
    statuses: Counter[int] = Counter()
    failures: dict[str, list[str]] = {}
    unauthenticated: dict[str, int] = {}
    for op in operations:
        for mode, examples in MORE_EXAMPLES.get(op.label, EXAMPLES).items():
            made, bad = fuzz_operation(op, mode, examples)
            report[f"{op.label} ({mode.value})"] = len(made)
            statuses.update(made)
            if mode is GenerationMode.POSITIVE and 401 in made:
                unauthenticated[op.label] = made.count(401)
            TALLY.add(http_requests=len(made), http_5xx=len(bad))
            if bad:
                failures[f"{op.label} ({mode.value})"] = bad
    TALLY.timings_s["schemathesis"] = round(time.monotonic() - t0, 1)
    TALLY.notes.append(
        f"schemathesis: {sum(report.values())} requests over {len(operations)} operations, "
        f"status codes {dict(sorted(statuses.items()))}"
    )
    listing = "\n".join(f"{k}: {len(v)}\n  " + "\n  ".join(v[:3]) for k, v in failures.items())
    assert not failures, f"5xx answers:\n{listing}"
    positive = {k: n for k, n in report.items() if k.endswith("(positive)")}
    assert all(positive.values()), f"an operation got no generated request: {positive}"
    assert not unauthenticated, f"valid requests refused as unauthenticated (the declared scheme): {unauthenticated}"
    assert report["POST /v1/events (positive)"] >= 200 and report["POST /v1/recall (positive)"] >= 200, report


def test_fuzz_reached_the_handlers(fuzz_settings: Settings) -> None:
    """Guard against a fuzz run that only ever hit 401/422: a valid call per endpoint still works."""
    with TestClient(create_app(fuzz_settings)) as client:
        h = {"X-API-Key": FUZZ_KEY}
        calls = [
            client.get("/v1/health"),
            client.get("/v1/subjects/project:P1/facts", params={"tenant": FUZZ_TENANT}, headers=h),
            client.get("/v1/subjects/project:P1/events", params={"tenant": FUZZ_TENANT}, headers=h),
            client.get("/v1/stats", params={"tenant": FUZZ_TENANT}, headers=h),
            client.post("/v1/recall", json={"tenant": FUZZ_TENANT, "query": "P1 port"}, headers=h),
        ]
        TALLY.add(http_requests=len(calls), http_5xx=sum(r.status_code >= 500 for r in calls))
        assert [r.status_code for r in calls] == [200] * len(calls), [r.text[:200] for r in calls]
        assert calls[1].json()["facts"] and calls[4].json()["hits"]
