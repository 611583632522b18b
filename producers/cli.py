"""`ledger publish FILE.jsonl` (or `-` for stdin), `ledger topics` and `ledger schema`.

`publish` streams one event per line through the SDK in batches (from a pipe, a partial batch is sent once its first
line has waited `--linger`), with a progress bar, and ends with a summary: accepted, rejected (line number, code,
field, message), partitions used. An invalid line never stops the run: the valid lines around it are still
published. Exit code 0 when every line was accepted, 1 when any was rejected, 2 when the broker stopped the run or
the settings (or `--topic`) are not usable (one line naming the variable: infra.cli), 3 when the broker could not be
reached (one line naming it and its address: infra.cli), 130 after Ctrl-C (the summary names the lines read and not
sent), 143 after SIGTERM (a service manager's stop: the lines read are sent first), 141 (SIGPIPE) when the
summary's reader went away, 74 when the summary cannot be written otherwise (infra.cli).

Only typer is imported at module level, so `ledger --help` stays fast.
"""

from __future__ import annotations

import io
import os
import select
import signal
import stat
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import typer

__all__ = ["publish", "schema", "topics"]


@dataclass
class Rejection:
    line: int
    code: str
    field: str | None
    message: str


@dataclass
class Summary:
    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    partitions: Counter[int] = field(default_factory=Counter)
    stopped: str | None = None  # why the run stopped early, if it did
    interrupted: bool = False  # by Ctrl-C (exit 130, after the summary)
    terminated: bool = False  # by SIGTERM (exit 143, after the lines read were sent and the summary)
    last_line: int = 0  # the last line read and judged
    unreachable: Exception | None = None  # the SDK's error when that was a broker it could not reach


def _settings(topic: str | None) -> Any:
    from producers.settings import UnsafeSettings, check_names, get_publisher_settings

    s = get_publisher_settings()
    if topic and topic != s.topic:  # the configured ledger topic keeps its configured DLQ and access topics
        s = s.model_copy(update={"topic": topic, "dlq_topic": f"{topic}.dlq", "access_topic": f"{topic}.access"})
        try:  # model_copy does not validate: a bad --topic is refused by the rule a bad LEDGER_TOPIC is
            check_names(s, topics_from="--topic")
        except UnsafeSettings as exc:
            raise typer.BadParameter(str(exc), param_hint="'--topic'") from None
    return s


def _lines(stream: IO[bytes], longest: int):
    """(1-based line number, raw size for the progress bar, stripped bytes) for every line; blank ones are b"", one
    longer than `longest` bytes None: the rest of it is read on and dropped, never held (a file without a line
    break, `/dev/zero`, would otherwise be read whole into memory)."""
    number = 0
    while raw := stream.readline(longest + 1):
        number += 1
        size = len(raw)
        if len(raw) > longest and not raw.endswith(b"\n"):
            while (more := stream.readline(longest + 1)) and not more.endswith(b"\n"):
                size += len(more)
            yield number, size + len(more), None
            continue
        yield number, size, raw.strip()


class _Stopped(Exception):
    """The broker stopped the run while its input was being waited for."""


class _Lingering(io.RawIOBase):
    """A pipe or terminal read so that lines it delivers slowly are not held: a partial batch is sent (`idle`) once
    its first line has waited `linger` seconds, whether the pipe is quiet or trickles, as a Kafka producer's linger
    sends a partial batch. A run the broker stopped ends the reading (else it would wait on a quiet pipe)."""

    def __init__(
        self,
        fd: int,
        linger: float,
        since: Callable[[], float | None],
        idle: Callable[[], None],
        stopped: Callable[[], bool],
    ) -> None:
        super().__init__()
        self.fd, self.linger, self.since, self.idle, self.stopped = fd, linger, since, idle, stopped

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while (since := self.since()) is not None:  # a batch is pending since then
            wait = since + self.linger - time.monotonic()
            if wait > 0 and select.select([self.fd], [], [], wait)[0]:
                break  # more input before its time is up
            self.idle()
        if self.stopped():
            raise _Stopped
        data = os.read(self.fd, len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _waits(stream: IO[bytes]) -> bool:
    """Whether reading `stream` can wait for its writer (a pipe, a terminal, a socket), unlike a file's."""
    try:
        return not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


class _Publisher:
    """Collects decoded events into batches and sends each batch through the SDK."""

    def __init__(self, producer: Any, summary: Summary, batch_size: int) -> None:
        self.producer, self.summary, self.batch_size = producer, summary, batch_size
        self.batch: list[tuple[int, Any]] = []
        self.since: float | None = None  # when the first line of `batch` was read (monotonic)
        self.sending: list[tuple[int, Any]] = []

    def add(self, line: int, event: Any) -> None:
        if not self.batch:
            self.since = time.monotonic()
        self.batch.append((line, event))
        if len(self.batch) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        from producers.contract import InvalidEvent
        from producers.sdk import PublishError

        if not self.batch:
            return
        batch = self.sending = self.batch  # until its outcomes are in: an interrupted run says their fate is unknown
        self.batch, self.since = [], None
        # report_invalid: what only the SDK can judge (encoded size, clock skew, an event_id re-used
        # for other content) rejects that line alone, like a contract refusal
        outcomes = self.producer.send_many((event for _, event in batch), report_invalid=True)
        for (line, _), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, InvalidEvent):
                self.summary.rejected.append(Rejection(line, outcome.code, outcome.field, outcome.message))
            elif isinstance(outcome, PublishError):
                self.summary.rejected.append(Rejection(line, f"publish_{outcome.code}", None, outcome.reason))
                if outcome.code in ("unavailable", "closed"):
                    self.summary.stopped = f"line {line}: {outcome.reason}"
                if outcome.code == "unavailable":
                    self.summary.unreachable = outcome
            else:
                self.summary.accepted += 1
                self.summary.partitions[outcome.partition] += 1
        self.sending = []


def _run(
    stream: IO[bytes], total: int | None, producer: Any, batch_size: int, quiet: bool, linger: float, summary: Summary
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    publisher = _Publisher(producer, summary, batch_size)
    progress = Progress(
        TextColumn("[bold]publishing"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
    )
    with progress:
        task = progress.add_task("publish", total=total, counts="")

        def send_waiting() -> None:
            publisher.flush()
            progress.update(task, counts=f"{summary.accepted} accepted, {len(summary.rejected)} rejected")

        if _waits(stream):
            lingering = _Lingering(
                stream.fileno(), linger, lambda: publisher.since, send_waiting, lambda: summary.stopped is not None
            )
            stream = io.BufferedReader(lingering)
        try:
            _publish_lines(stream, summary, publisher, progress, task)
        except _Terminated:  # a service manager's stop: what was read is sent, then the summary (exit 143)
            unsure = _unsure(publisher)
            publisher.sending = []
            publisher.flush()
            why = f"; {summary.stopped}" if summary.stopped else ""  # the last send's own failure, if it failed
            summary.stopped = (
                f"terminated after line {summary.last_line}: the valid lines up to it were sent, {summary.accepted} "
                f"published as counted{unsure}; nothing after it was read{why}"
            )
            summary.terminated = True
        except KeyboardInterrupt:  # Ctrl-C: say how far it got instead of vanishing (the caller exits 130)
            unsure = _unsure(publisher)
            waiting = [line for line, _ in publisher.batch]  # read and valid, held for the next batch: never sent
            unsent = (
                f"; {len(waiting)} valid lines from line {waiting[0]} to {waiting[-1]} were read and not sent"
                if waiting
                else ""
            )
            summary.stopped = f"interrupted: {summary.accepted} lines published as counted{unsure}{unsent}"
            summary.interrupted = True
        progress.update(task, counts=f"{summary.accepted} accepted, {len(summary.rejected)} rejected")


def _unsure(publisher: _Publisher) -> str:
    """What a stop in the middle of a send leaves unknown, in the summary's words ("" when nothing was being sent)."""
    sending = [line for line, _ in publisher.sending]
    return f"; lines {sending[0]}-{sending[-1]} were being sent, and may or may not be" if sending else ""


class _Terminated(BaseException):
    """SIGTERM (a service manager stopping the command): raised where the main thread is, as Ctrl-C is."""


def _on_terminate(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut the last send short
    raise _Terminated


def _publish_lines(stream: IO[bytes], summary: Summary, publisher: _Publisher, progress: Any, task: Any) -> None:
    """Every line of `stream` decoded and handed to `publisher`, the progress bar following; the last batch sent."""
    from producers.contract import MAX_EVENT_BYTES, InvalidEvent, decode

    longest = 2 * MAX_EVENT_BYTES  # room for spaces around the largest event
    try:
        for number, size, raw in _lines(stream, longest):
            if raw is None:
                message = f"a line of over {longest} bytes: no event is that large"
                summary.rejected.append(Rejection(number, "too_large", None, message))
            elif raw:
                try:  # a line without an id gets one, as at the door
                    publisher.add(number, decode(raw, mint_event_id=True))
                except InvalidEvent as exc:
                    summary.rejected.append(Rejection(number, exc.code, exc.field, exc.message))
            summary.last_line = number
            counts = f"{summary.accepted} accepted, {len(summary.rejected)} rejected"
            progress.update(task, advance=size, counts=counts)
            if summary.stopped:
                return
    except _Stopped:  # stopped while its input was awaited: a line being read then was not whole, and is no line
        return
    publisher.flush()


def _report(summary: Summary, show: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    out.print(f"accepted: {summary.accepted}")
    out.print(f"rejected: {len(summary.rejected)}")
    for r in sorted(summary.rejected, key=lambda r: r.line)[:show]:
        where = f" ({r.field})" if r.field else ""
        out.print(f"  line {r.line}: {r.code}{where}: {escape(r.message)}")
    if len(summary.rejected) > show:
        out.print(f"  ... and {len(summary.rejected) - show} more")
    used = ", ".join(f"{p}:{n}" for p, n in sorted(summary.partitions.items())) or "none"
    out.print(f"partitions used: {used}")
    if summary.stopped:
        out.print(f"[bold red]stopped early[/]: {escape(summary.stopped)}")


def publish(
    file: str = typer.Argument(..., help="a JSONL file with one event per line, or - for stdin"),
    topic: str | None = typer.Option(None, help="topic to write to (default: LEDGER_TOPIC)"),
    batch_size: int = typer.Option(500, min=1, help="events sent per batch before waiting for acks"),
    timeout: float | None = typer.Option(
        None,
        min=0.5,
        max=300.0,
        help="seconds to wait for the broker before giving up (default: LEDGER_PRODUCER_TIMEOUT_S)",
    ),
    show: int = typer.Option(50, min=0, help="how many rejected lines to list in the summary"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    linger: float = typer.Option(
        0.5,
        min=0.0,
        max=3600.0,
        help="seconds the first valid line of a partial batch from a pipe or terminal waits before the batch is sent",
    ),
) -> None:
    """Publish events from a JSONL file (or stdin) to the ledger."""
    from producers.sdk import LedgerProducer

    settings = _settings(topic)
    if file == "-":
        if sys.stdin is None:
            raise typer.BadParameter("- reads standard input, which is closed here", param_hint="FILE")
        stream, total = sys.stdin.buffer, None
    else:
        path = Path(file)
        if path.is_dir():
            raise typer.BadParameter(f"is a directory, not a file: {file}", param_hint="FILE")
        try:  # a pipe (`<(...)`) or a device reads as a file does; its size is no progress bar's total
            stream = path.open("rb")
        except OSError as exc:
            raise typer.BadParameter(f"cannot be read: {file} ({exc.strerror or exc})", param_hint="FILE") from None
        total = path.stat().st_size if path.is_file() else None
    main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
    on_term = signal.signal(signal.SIGTERM, _on_terminate) if main else None
    summary = Summary()
    try:
        with LedgerProducer(settings, timeout_s=timeout) as producer:
            _run(stream, total, producer, batch_size, quiet, linger, summary)
    except (KeyboardInterrupt, _Terminated) as stop:  # connecting to the broker, or closing the producer
        summary.stopped = summary.stopped or (
            f"stopped after line {summary.last_line}" if summary.last_line else "stopped before any line was read"
        )
        summary.interrupted, summary.terminated = isinstance(stop, KeyboardInterrupt), isinstance(stop, _Terminated)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if on_term is None else on_term)
    # everything is sent: a reader of the summary that went away (`| head`) ends the process as it ends a Unix filter,
    # by SIGPIPE (exit 141), not as a verdict's exit 1 without a word
    on_pipe = signal.signal(signal.SIGPIPE, signal.SIG_DFL) if main else None
    try:
        _report(summary, show)
    finally:
        if main:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN if on_pipe is None else on_pipe)
    if summary.interrupted or summary.terminated:
        raise typer.Exit(130 if summary.interrupted else 143)
    if summary.unreachable is not None:  # one line naming the broker and its address, exit 3 (infra.cli)
        raise summary.unreachable
    if summary.stopped:
        raise typer.Exit(2)
    raise typer.Exit(1 if summary.rejected else 0)


def topics(
    topic: str | None = typer.Option(
        None, help="ledger topic (default: LEDGER_TOPIC); another one's DLQ is TOPIC.dlq, its access topic TOPIC.access"
    ),
) -> None:
    """Create the ledger topic, its dead-letter topic and the access topic (idempotent)."""
    from producers.topics import ensure_topics

    settings = _settings(topic)
    # bounded like a producer's waits: a broker that is away is one line (infra.cli) after that long, not a hang
    for status in ensure_topics(settings, timeout_s=settings.producer_timeout_s):
        state = "created" if status.created else "exists"
        typer.echo(f"{status.name}: {state}, {status.partitions} partitions")


def schema(
    write: bool = typer.Option(False, "--write", help="regenerate the checked-in file from the contract"),
    check: bool = typer.Option(False, "--check", help="exit 1 if the checked-in file differs from the contract"),
) -> None:
    """Print the event contract as a JSON Schema (for producers in other languages), or write/check the file."""
    from producers.event_schema import SCHEMA_FILE, render

    text = render()
    if check:
        same = SCHEMA_FILE.exists() and SCHEMA_FILE.read_text(encoding="utf-8") == text
        typer.echo(f"{SCHEMA_FILE}: {'up to date' if same else 'differs from the contract: run ledger schema --write'}")
        raise typer.Exit(0 if same else 1)
    if write:
        SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
        SCHEMA_FILE.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {SCHEMA_FILE}")
        return
    typer.echo(text, nl=False)
