"""The documents' examples, run as a reader runs them: every `bash` and `python` block of README.md and docs/*.md.

The rules a document follows (tests/test_docs_examples.py holds every document to them):

- Every fence names its language. `bash` (or `sh`, `shell`) and `python` blocks are examples: they run, unless
  the line before the fence is `<!-- not run: why -->` (`make demo` itself, settings for another cluster). Blocks
  of any other language (json, text, promql, ...) are data, never run; a `json` block is one JSON document.
- A document's bash blocks share one shell, as a terminal does (a variable set in one block is there in the
  next), started afresh for each document, in a scratch folder, with the venv's `bin` first on PATH and the
  caller's environment without LEDGER_DEVELOPMENT (`make` sets it for its own children, not for a reader's
  shell). Each command runs on its own, its stdin empty, and must exit 0; `curl` is the real curl with
  `--fail-with-body --show-error` added, so an HTTP error status fails the command and shows the answer.
- A python block runs as a file of its own with the venv's python, in the same folder and environment.
- Placeholders (`PLACEHOLDERS`): `MEMORY_ID` in a command is what a reader pastes there, the `memory_id` of the
  latest answer above that has one.
- After each command and each python block, `settle()` waits until everything published is applied and
  indexed, as it is by the time a person has read an answer and typed the next command.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from producers.settings import REPO_ROOT

__all__ = [
    "DOCUMENTS",
    "EXAMPLES",
    "PLACEHOLDERS",
    "Block",
    "Ran",
    "Shell",
    "blocks",
    "commands",
    "fill",
    "json_documents",
    "run_document",
    "user_env",
]

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell"}
PYTHON = {"python", "py"}
EXAMPLES = SHELLS | PYTHON  # the languages that run
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(.*)$")
PLACEHOLDERS = {"MEMORY_ID": "memory_id"}  # placeholder -> the answer field a reader copies it from
VENV_BIN = Path(sys.executable).parent
PRELUDE = 'set -o pipefail\ncurl() { command curl --fail-with-body --show-error "$@"; }\n'
TIMEOUT_S = 180.0  # one command or block (a first recall loads the models' sessions)


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str  # the fence's info string's first word ("" when it has none)
    text: str
    not_run: str | None  # the reason given by `<!-- not run: ... -->`, if any

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in EXAMPLES and self.not_run is None


@dataclass
class Ran:
    block: Block
    commands: list[str] = field(default_factory=list)  # as run, placeholders filled
    outputs: list[str] = field(default_factory=list)


def blocks(document: Path) -> list[Block]:
    """Every fenced block of `document`, in order (indented fences too: their indentation is removed)."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, info = opening.group(1), opening.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{document}:{i + 1}: a fence that is never closed"
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = NOT_RUN.match(before)
        language = info.split()[0] if info else ""
        found.append(Block(document, i + 1, language, body, marked.group(1) if marked else None))
        i = end + 1
    return found


def commands(text: str) -> Iterator[str]:
    """The commands of a bash block, one by one: a command continues over a trailing `\\`, `|`, `&&` or `||` and
    over a quote still open; comment lines are skipped. A here-document is refused (none is documented)."""
    pending: list[str] = []
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        assert "<<" not in line.replace("<<<", ""), f"a here-document is not supported by the runner: {line}"
        pending.append(line)
        joined = "\n".join(pending)
        if re.search(r"(\\|\||&&)\s*$", line):
            continue
        try:
            shlex.split(joined, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        yield joined
        pending = []
    assert not pending, f"an unfinished command at the end of the block: {pending}"


def fill(command: str, answers: list[str]) -> str:
    """`command` with each placeholder replaced by the field it names, from the latest answer that has it."""
    for placeholder, name in PLACEHOLDERS.items():
        if placeholder not in command:
            continue
        pattern = re.compile(rf'"{re.escape(name)}"\s*:\s*"([^"]+)"')
        value = next((m.group(1) for answer in reversed(answers) if (m := pattern.search(answer))), None)
        assert value is not None, f"{placeholder}: no answer above has a {name!r} to fill it with"
        command = command.replace(placeholder, value)
    return command


def user_env() -> dict[str, str]:
    """A reader's shell: the caller's environment without LEDGER_DEVELOPMENT, the venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_DEVELOPMENT"}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


class Shell:
    """One bash, fed one command at a time (stdin empty for the command itself); `run` returns (status, output)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        status, output = self.run(PRELUDE)
        assert status == 0, output

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, command: str, timeout: float = TIMEOUT_S) -> tuple[int, str]:
        assert self.proc.stdin is not None
        marker = f"__done_{uuid.uuid4().hex}"
        # braces: the whole command reads /dev/null, so nothing can swallow what is sent after it
        self.proc.stdin.write(f"{{\n{command}\n}} < /dev/null\nprintf '\\n{marker} %s\\n' \"$?\"\n")
        self.proc.stdin.flush()
        output: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no end after {timeout:g}s of:\n{command}\n{''.join(output)}") from None
            if line is None:
                raise AssertionError(f"the shell exited running:\n{command}\n{''.join(output)}")
            if line.startswith(marker):
                text = "".join(output)
                return int(line.split()[1]), text[:-1] if text.endswith("\n") else text
            output.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def run_document(document: Path, cwd: Path, settle: Callable[[], None], answers: list[str]) -> list[Ran]:
    """Run every block of `document` that runs, in order; AssertionError naming the block and command that failed.

    `answers` (every output so far, oldest first) is where placeholders are filled from, and grows."""
    shell = Shell(cwd, user_env())
    ran: list[Ran] = []
    try:
        for block in blocks(document):
            if not block.runs:
                continue
            done = Ran(block)
            ran.append(done)
            if block.language in SHELLS:
                for command in commands(block.text):
                    command = fill(command, answers)
                    status, output = shell.run(command)
                    assert status == 0, f"{block.where}: exit {status}:\n$ {command}\n{output}"
                    done.commands.append(command)
                    done.outputs.append(output)
                    answers.append(output)
                    settle()
            else:
                source = fill(block.text, answers)
                script = cwd / f"{document.stem}_{block.line}.py"
                script.write_text(source, encoding="utf-8")
                proc = subprocess.run(
                    [sys.executable, script.name],
                    cwd=cwd,
                    env=user_env(),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT_S,
                )
                assert proc.returncode == 0, f"{block.where}: exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
                done.commands.append(source)
                done.outputs.append(proc.stdout)
                answers.append(proc.stdout)
                settle()
    finally:
        shell.close()
    return ran


def json_documents(document: Path) -> list[tuple[Block, object]]:
    """Each `json` block of `document` parsed as one JSON document (ValueError naming the block if it is not)."""
    parsed = []
    for block in blocks(document):
        if block.language == "json":
            try:
                parsed.append((block, json.loads(block.text)))
            except ValueError as exc:
                raise ValueError(f"{block.where}: not one JSON document: {exc}") from None
    return parsed
