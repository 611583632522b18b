"""One logging configuration for every process: `configure_logging(settings, process)`.

Every entry point calls it once, so each process (and each uvicorn worker, through `logging_config`) writes the
same lines to stderr: text for a person or one JSON object per line for a pipeline. Ids are bound with
`log_context` and copied onto records by `ContextFilter`, never written into message text. Any message is one
valid JSON line, whatever characters it holds. docs/INTERNALS.md, "Logs".
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import orjson

from producers.contract import claimed_fields
from producers.settings import Settings

__all__ = [
    "CONTEXT_FIELDS",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "bind_ids",
    "configure_logging",
    "current_ids",
    "dumps_line",
    "log_context",
    "logging_config",
    "new_id",
    "record_ids",
    "unbind_ids",
]

# the ids a line may carry, in the order a JSON line lists them
CONTEXT_FIELDS = ("request_id", "tenant", "event_id", "batch_id", "topic", "partition", "offset")
# loggers that are too chatty at INFO for a service log (one line per HTTP request to Elasticsearch)
QUIET = {"elastic_transport": logging.WARNING}  # below WARNING: a line per request
# the Kafka clients' DEBUG lines hold each request as sent, a SASL login's password too: INFO at the most
KAFKA_CLIENTS = ("kafka", "aiokafka")
# kafka-python's INFO is each connection's life (a one-shot command's stderr would open with twenty such lines):
# shown only when DEBUG is asked for
CHATTY = ("kafka",)

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: ContextVar[Mapping[str, Any]] = ContextVar("ledger_log_context", default=_EMPTY)
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
_SKIP = frozenset({"color_message"})  # uvicorn's ANSI-coloured copy of the message
_LINE_BREAKS = ("\u2028", "\u2029", "\x85")  # not escaped by JSON, but str.splitlines() breaks on them


def new_id() -> str:
    """A fresh id for a request or a batch (32 hex digits)."""
    return uuid.uuid4().hex


def current_ids() -> dict[str, Any]:
    """The ids bound by the enclosing `log_context` blocks (e.g. the request id of the HTTP request running)."""
    return dict(_context.get())


def bind_ids(**ids: Any) -> Token:
    """Add `ids` (None values are left out) to the bound ids until `unbind_ids(token)`; prefer `log_context`."""
    return _context.set(MappingProxyType({**_context.get(), **{k: v for k, v in ids.items() if v is not None}}))


def unbind_ids(token: Token) -> None:
    """Restore the ids bound before `bind_ids` returned `token`."""
    _context.reset(token)


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Bind `ids` (None values are left out) to every line logged inside the block, nested blocks adding theirs."""
    token = bind_ids(**ids)
    try:
        yield
    finally:
        unbind_ids(token)


def record_ids(record: Any) -> dict[str, Any]:
    """`extra=` for a line about one ledger record (producers.records.Incoming, duck-typed): topic, partition and
    offset, and the tenant and event_id it carries, as decoded or, for a refused record, as its JSON claims them
    (untrusted, cut at 200 characters)."""
    ids: dict[str, Any] = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    event = getattr(record, "event", None)
    if event is not None:
        ids["tenant"], ids["event_id"] = event.tenant, event.event_id
        return ids
    claimed = claimed_fields(record.raw)
    for name in ("tenant", "event_id"):
        value = claimed.get(name)
        if isinstance(value, str):
            ids[name] = value[:200]
    return ids


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (a handler filter, so records of every logger get them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if not hasattr(record, name):  # extra= wins
                setattr(record, name, value)
        return True


def _message(record: logging.LogRecord) -> str:
    """record.getMessage(), or what it held when its arguments do not fit the format (never an exception)."""
    try:
        return record.getMessage()
    except Exception as exc:  # noqa: BLE001 - a bad format string must not cost the line
        return f"{record.msg!r} % {record.args!r} (not formattable: {type(exc).__name__}: {exc})"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ids and the `extra=` fields of a record, ids first."""
    out = {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}
    for name, value in record.__dict__.items():
        if name not in _STANDARD and name not in _SKIP and name not in out and not name.startswith("_"):
            out[name] = value
    return out


def _text(value: str) -> str:
    """A string orjson accepts: lone surrogates (and anything else UTF-8 cannot hold) as backslash escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _scrub(value: Any, depth: int = 0) -> Any:
    """A copy of `value` that orjson can always write (the slow path, after orjson refused it)."""
    if isinstance(value, str):
        return _text(value)
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if depth > 16:
        return _text(repr(value))
    if isinstance(value, Mapping):
        return {_text(str(k)): _scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):  # in a stable order, as _default writes them
        return [_scrub(v, depth + 1) for v in sorted(value, key=str)]
    return _scrub(_default(value), depth + 1)


def _default(value: Any) -> Any:
    """What orjson writes for types JSON has none for: bytes as text (undecodable bytes escaped), the rest str()."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises still gets a line
        return object.__repr__(value)


def dumps_line(obj: Mapping[str, Any]) -> str:
    """One JSON line (no newline in it) for any mapping: the fast path, then the scrubbed one."""
    options = orjson.OPT_NON_STR_KEYS
    try:
        line = orjson.dumps(obj, default=_default, option=options).decode()
    except TypeError:  # orjson.JSONEncodeError: a lone surrogate, an integer beyond 64 bits, a failing default
        line = orjson.dumps(_scrub(obj), option=options).decode()
    for ch in _LINE_BREAKS:
        if ch in line:
            line = line.replace(ch, f"\\u{ord(ch):04x}")
    return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring); `process` names the process (worker, api, ...)."""

    def __init__(self, process: str = "ledger") -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "process": self.process,
            "pid": record.process,
            "message": _message(record),
        }
        out.update(_fields(record))
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            out["http"] = {"method": method, "path": path, "status": status, "client": client, "version": version}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
            out["exc_type"] = getattr(record.exc_info[0], "__name__", None)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return dumps_line(out)


class TextFormatter(logging.Formatter):
    """`<time> <LEVEL> [<process>] <logger>: <message> {id=value ...}`, then the traceback if any."""

    def __init__(self, process: str = "ledger") -> None:
        super().__init__("%(asctime)s %(levelname)s [" + process.replace("%", "%%") + "] %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _message(record)
        line = super().formatMessage(record)
        fields = _fields(record)
        if fields:
            line += " {" + " ".join(f"{k}={v}" for k, v in fields.items()) + "}"
        return line


def logging_config(settings: Settings, process: str, *, level: str | int | None = None) -> dict[str, Any]:
    """The `logging.config.dictConfig` dict of `configure_logging` (uvicorn takes it as `log_config`)."""
    name = level if level is not None else settings.log_level
    number = logging.getLevelName(name.upper()) if isinstance(name, str) else name
    if not isinstance(number, int):
        raise ValueError(f"log level {name!r}: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    formatter = JsonFormatter if settings.log_format == "json" else TextFormatter
    # uvicorn's own loggers: no handlers of their own, so their lines reach the root handler like all others
    through_root = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,  # module loggers created at import time keep logging
        "filters": {"ids": {"()": ContextFilter}},
        "formatters": {"ledger": {"()": formatter, "process": process}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "ledger",
                "filters": ["ids"],
            }
        },
        "root": {"level": number, "handlers": ["stderr"]},
        "loggers": {
            **{name: {"level": lvl} for name, lvl in QUIET.items()},
            **{name: {"level": max(number, logging.INFO)} for name in KAFKA_CLIENTS},
            **{name: {"level": max(number, logging.WARNING)} for name in CHATTY if number > logging.DEBUG},
            **{name: dict(through_root) for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")},
        },
    }


def configure_logging(settings: Settings, process: str, *, level: str | int | None = None) -> None:
    """Configure this process's logging (replacing any earlier configuration); `level` overrides LEDGER_LOG_LEVEL.

    Also routes `warnings` and uncaught exceptions (main thread and other threads) through it, so in JSON
    mode a crash is a JSON line too.
    """
    logging.config.dictConfig(logging_config(settings, process, level=level))
    logging.captureWarnings(True)
    crash = logging.getLogger("ledger.crash")

    def excepthook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        crash.critical("uncaught %s", kind.__name__, exc_info=(kind, value, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        crash.critical(
            "uncaught %s in thread %s",
            args.exc_type.__name__,
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
