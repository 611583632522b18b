"""Structured logs (producers.logs, api.request_id): the formatters and the id filter alone, then real processes.

Unit: every JSON line parses whatever the message holds (NUL, newlines, quotes, lone surrogates, line separators,
huge integers, bytes, objects that refuse str()), the ids of `log_context` and `extra=` are on the line, a bad
format string still gives a line; the request-id middleware keeps a plausible X-Request-ID and replaces others.

Real: a projector worker (`python -m stream_processors`) with LEDGER_LOG_FORMAT=json reads a valid and an invalid
record; every line it wrote parses as JSON, its batch lines carry a batch_id and the dead-letter line names the
record's event_id, partition and offset. `ledger serve` with JSON logs: uvicorn's own access lines come through
the same configuration and carry the request's X-Request-ID.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.request_id import install as install_request_id
from api.request_id import plausible
from producers.logs import (
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    current_ids,
    dumps_line,
    log_context,
    logging_config,
    record_ids,
)
from producers.records import decode_record
from producers.settings import Settings
from tests.conftest import unique
from tests.support import Process, Worker, asserted, cleanup, pg, publish, publish_raw, wait_caught_up, wait_for

HOSTILE = [
    'quote " backslash \\ brace } end',
    "new\nline\r\nand\ttab",
    "nul \x00 byte",
    "lone surrogate \ud800 here",
    "separators \u2028 \u2029 \x85 \x1c\x1d\x1e",
    "中文 and emoji \U0001f600",
    "",
]


def capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    """A private logger writing through `formatter` and the id filter into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(unique("test.logs"))
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def lines(text: str) -> list[dict[str, Any]]:
    """Each line as JSON: splitlines() breaks on every Unicode line boundary, so a stray one fails here."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


@pytest.mark.unit
@pytest.mark.parametrize("text", HOSTILE)
def test_json_line_is_valid_for_a_hostile_message(text: str) -> None:
    logger, out = capture(JsonFormatter("test"))
    with log_context(request_id="r-1", tenant="acme"):
        logger.warning("message: %s", text, extra={"event_id": text, "partition": 3, "offset": 17})
    (line,) = lines(out.getvalue())
    representable = "\ud800" not in text
    if representable:
        assert line["message"] == f"message: {text}" and line["event_id"] == text
    else:  # a lone surrogate cannot be UTF-8: spelled with a backslash, the rest kept
        assert line["message"] == "message: lone surrogate \\ud800 here"
    assert (line["request_id"], line["tenant"], line["partition"], line["offset"]) == ("r-1", "acme", 3, 17)
    assert (line["level"], line["process"], line["logger"]) == ("WARNING", "test", logger.name)
    assert line["ts"].endswith("Z")


@pytest.mark.unit
def test_json_line_survives_values_json_has_no_type_for() -> None:
    logger, out = capture(JsonFormatter("test"))
    extra = {"raw": b"\xff\x00ok", "big": 2**80, "obj": Unprintable(), "ids": {1: "one"}, "tags": {"b", "a"}}
    logger.info("values", extra=extra)
    logger.info("bad format %d", "not a number")  # a format that does not fit its arguments
    first, second = lines(out.getvalue())
    assert first["raw"] == "\\xff\x00ok" and first["big"] == str(2**80) and first["ids"] == {"1": "one"}
    assert first["tags"] == ["a", "b"] and "Unprintable" in first["obj"]
    assert "bad format %d" in second["message"] and "not formattable" in second["message"]


@pytest.mark.unit
def test_json_line_carries_the_exception_text() -> None:
    logger, out = capture(JsonFormatter("test"))
    try:
        raise ValueError('hostile "reason"\nsecond line \x00')
    except ValueError:
        logger.exception("failed")
    (line,) = lines(out.getvalue())
    assert line["exc_type"] == "ValueError"
    assert 'ValueError: hostile "reason"\nsecond line \x00' in line["exception"]
    assert line["exception"].startswith("Traceback (most recent call last):")


@pytest.mark.unit
def test_extra_wins_over_the_context_and_contexts_nest() -> None:
    logger, out = capture(JsonFormatter("test"))
    with log_context(batch_id="b-1", partition=0):
        with log_context(request_id="r-2", tenant=None):  # None values are not bound
            assert current_ids() == {"batch_id": "b-1", "partition": 0, "request_id": "r-2"}
            logger.info("inner", extra={"partition": 5})
        logger.info("outer")
    logger.info("none")
    inner, outer, none = lines(out.getvalue())
    assert (inner["batch_id"], inner["request_id"], inner["partition"]) == ("b-1", "r-2", 5)
    assert "tenant" not in inner and "request_id" not in outer and outer["partition"] == 0
    assert not {"batch_id", "partition", "request_id"} & set(none)
    assert list(inner)[:6] == ["ts", "level", "logger", "process", "pid", "message"]


@pytest.mark.unit
def test_text_line_names_the_ids() -> None:
    logger, out = capture(TextFormatter("worker"))
    with log_context(batch_id="b-9"):
        logger.warning("dead letter", extra={"partition": 2, "offset": 40, "event_id": "e-1"})
    text = out.getvalue()
    assert "WARNING [worker]" in text and text.rstrip().endswith("{event_id=e-1 batch_id=b-9 partition=2 offset=40}")


@pytest.mark.unit
def test_dumps_line_escapes_every_line_boundary() -> None:
    line = dumps_line({"m": "a\u2028b\u2029c\x85d\ne"})
    assert len(line.splitlines()) == 1 and json.loads(line) == {"m": "a\u2028b\u2029c\x85d\ne"}


@pytest.mark.unit
def test_record_ids_of_a_refused_record_are_what_it_claims() -> None:
    raw = json.dumps({"type": "memory.asserted", "tenant": "acme", "event_id": "e\n7", "subject": 5}).encode()
    bad = decode_record("t.events", 4, 99, raw, timestamp_ms=int(time.time() * 1000))
    assert bad.error is not None
    assert record_ids(bad) == {"topic": "t.events", "partition": 4, "offset": 99, "tenant": "acme", "event_id": "e\n7"}
    garbage = decode_record("t.events", 1, 2, b"\xff not json", timestamp_ms=None)
    assert record_ids(garbage) == {"topic": "t.events", "partition": 1, "offset": 2}


@pytest.mark.unit
def test_logging_config_sends_uvicorn_through_the_root_handler(base_settings: Settings) -> None:
    config = logging_config(base_settings.model_copy(update={"log_format": "json"}), "api", level="warning")
    assert config["root"]["level"] == logging.WARNING and config["disable_existing_loggers"] is False
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        assert config["loggers"][name] == {"handlers": [], "propagate": True}
    assert config["formatters"]["ledger"]["()"] is JsonFormatter


@pytest.mark.unit
def test_request_id_is_kept_when_plausible_and_replaced_otherwise() -> None:
    assert plausible("trace-7f3a:span/2") and plausible("x" * 128)
    # as the server hands header bytes over: latin-1, so UTF-8 text arrives as other non-ASCII characters
    for hostile in ("has space", 'quote"', "x" * 129, "", "zh\u4e2d".encode().decode("latin-1"), "a\nb"):
        assert not plausible(hostile)


@pytest.mark.unit
def test_middleware_echoes_the_id_and_binds_it_while_the_request_runs() -> None:
    logger, out = capture(JsonFormatter("api"))
    app = FastAPI()
    install_request_id(app)

    @app.get("/x")
    async def x() -> dict[str, Any]:
        logger.info("inside the route")
        return current_ids()

    with TestClient(app) as client:
        given = client.get("/x", headers={"X-Request-ID": "abc-123"})
        fresh = client.get("/x", headers={"X-Request-ID": "not plausible!"})
        other = client.get("/x")
    assert given.headers.get_list("X-Request-ID") == ["abc-123"] and given.json() == {"request_id": "abc-123"}
    assert fresh.headers["X-Request-ID"] == fresh.json()["request_id"] != "not plausible!"
    assert len(fresh.json()["request_id"]) == 32 and other.json()["request_id"] not in {fresh.json()["request_id"], ""}
    ids = [line["request_id"] for line in lines(out.getvalue())]
    assert ids == ["abc-123", fresh.json()["request_id"], other.json()["request_id"]]
    assert current_ids() == {}  # nothing leaks out of the request


# -- real processes ------------------------------------------------------------------------------------------


def test_worker_json_logs_name_the_dead_letter(base_settings: Settings) -> None:
    settings = base_settings.private(unique("lg"))
    worker = Worker(settings, log_format="json")
    try:
        publish(settings, [asserted("user:1", "pref.drink", "tea", 0)])
        hostile_id = 'bad "id"\nwith a newline'
        invalid = json.dumps({"type": "memory.asserted", "tenant": "acme", "event_id": hostile_id, "subject": 5})
        ((part, off),) = publish_raw(settings, [(b"k", invalid.encode())])
        worker.start()
        wait_caught_up(settings, timeout=90, worker=worker)
        with pg(settings) as conn:
            assert conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 1

        def dead_letter_line() -> dict[str, Any] | None:
            return next((x for x in lines(worker.log()) if x["message"].startswith("dead letter")), None)

        line = wait_for(dead_letter_line, 30, 0.2, "the dead-letter line")
        worker.stop()
        everything = lines(worker.log())  # every line of the process, faust's and aiokafka's included
    finally:
        worker.stop()
        cleanup(settings)
    assert (line["event_id"], line["partition"], line["offset"], line["tenant"]) == (hostile_id, part, off, "acme")
    assert line["code"] and line["level"] == "WARNING" and line["process"] == "worker" and line["batch_id"]
    batches = [x for x in everything if x["message"].startswith("batch:")]
    assert batches and all(len(x["batch_id"]) == 32 for x in batches)
    assert line["batch_id"] in {x["batch_id"] for x in batches}
    assert {x["logger"] for x in everything} > {"projections.postgres.recorder", "stream_processors.agents"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_api_json_logs_carry_the_request_id(base_settings: Settings) -> None:
    port = _free_port()
    settings = base_settings.private(unique("lga"), api_port=port, api_keys={"k-logs": ["acme"]})
    server = Process(settings, ["-m", "infra.cli", "serve"], log_format="json")
    server.name = "api"
    url = f"http://127.0.0.1:{port}"
    try:
        server.start()

        def up() -> bool:
            server.check()
            try:
                return httpx.get(f"{url}/v1/health", timeout=5).status_code < 600
            except httpx.HTTPError:
                return False

        wait_for(up, 90, 0.3, "the API to answer")
        given = httpx.get(f"{url}/v1/stats", params={"tenant": "acme"}, headers={"X-Request-ID": "req-42"}, timeout=30)
        fresh = httpx.get(f"{url}/v1/health", timeout=30)
        assert given.status_code == 401 and given.headers["X-Request-ID"] == "req-42"
        generated = fresh.headers["X-Request-ID"]

        def access_lines() -> list[dict[str, Any]] | None:
            found = [x for x in lines(server.log()) if x["logger"] == "uvicorn.access"]
            return found if len(found) >= 3 else None

        access = wait_for(access_lines, 30, 0.2, "uvicorn's access lines")
        server.stop()
        everything = lines(server.log())
    finally:
        server.stop()
    mine = [x for x in access if x.get("request_id") == "req-42"]
    assert len(mine) == 1 and mine[0]["http"]["status"] == 401 and mine[0]["http"]["path"].startswith("/v1/stats")
    assert any(x.get("request_id") == generated and x["http"]["path"] == "/v1/health" for x in access)
    assert all(x["process"] == "api" for x in everything)
    assert {"uvicorn.error", "uvicorn.access"} <= {x["logger"] for x in everything}
