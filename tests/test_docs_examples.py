"""README.md and docs/*.md run as written: a document whose example stops working fails here.

Every `bash` and `python` block of every document runs, in order (the README first, then docs/ by name), as a
reader following the documents runs it after `make demo`: against the services on the ports the documents
name (the API on 8000, MCP on 8001, with the development key `dev-key` and tenant `demo`), started here by
infra's own launcher (`infra.stack.up`, what `python -m infra up --service` runs) and stopped at the end
(`make test` stops the demo's services before the suite, and the fault tests that come last stop servers).
How a block runs, what `curl` must answer, how a placeholder is filled, and how a block that must not run is
marked: tests/support/docs.py. A new block runs by default; the test checks that every unmarked example ran.

The unit tests hold the documents to the rules that need no server: every fence names its language, every
`json` block is one JSON document (a configuration a reader pastes), every `not run` mark gives a reason and
stands before an example, and the runner splits commands as bash does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import service, stack
from producers.settings import Settings
from tests.support import wait_caught_up, wait_for
from tests.support.docs import (
    DOCUMENTS,
    EXAMPLES,
    Block,
    Ran,
    Shell,
    blocks,
    commands,
    fill,
    json_documents,
    run_document,
    user_env,
)
from tests.support.pipeline import drain_search
from tests.support.servers import free_port


@pytest.mark.unit
def test_every_fence_names_its_language() -> None:
    unnamed = [b.where for d in DOCUMENTS for b in blocks(d) if not b.language]
    assert not unnamed, f"name the language of these blocks (`bash`, `python`, `json`, `text`...): {unnamed}"


@pytest.mark.unit
def test_each_json_block_is_one_json_document() -> None:
    for document in DOCUMENTS:
        json_documents(document)  # ValueError naming the block


@pytest.mark.unit
def test_a_not_run_mark_gives_a_reason_and_stands_before_an_example() -> None:
    for document in DOCUMENTS:
        lines = document.read_text(encoding="utf-8").splitlines()
        examples = {b.line for b in blocks(document) if b.language in EXAMPLES}
        marked = {b.line for b in blocks(document) if b.not_run is not None}
        for number, line in enumerate(lines, start=1):
            if re.match(r"\s*<!--\s*not run", line):  # a line of its own (a mention in the text is no mark)
                fence = next(n for n in range(number + 1, len(lines) + 1) if lines[n - 1].strip())
                where = f"{document.name}:{number}"
                assert fence in marked, f"{where}: `<!-- not run: why -->`, on the line before a fence"
                assert fence in examples, f"{where}: only a bash or python block runs; the mark is not needed"


@pytest.mark.unit
def test_the_runner_splits_commands_as_bash_does() -> None:
    block = """H='X-API-Key: dev-key'
# a comment, with an apostrophe: it's skipped
curl -s -H "$H" localhost:8000/v1/events -d '{"events": [{"type": "memory.asserted",
  "subject": "project:P1"}]}' -H 'content-type: application/json'
printf '%s\\t%s\\n' 'a|b' '{"x": 1}' |
  java -cp "$CP" Tool \\
    --property key.separator=$'\\t'
a && \\
  b
echo "it's" # trailing comment's apostrophe
"""
    assert [c.splitlines()[0] for c in commands(block)] == [
        "H='X-API-Key: dev-key'",
        """curl -s -H "$H" localhost:8000/v1/events -d '{"events": [{"type": "memory.asserted",""",
        "printf '%s\\t%s\\n' 'a|b' '{\"x\": 1}' |",
        "a && \\",
        """echo "it's" # trailing comment's apostrophe""",
    ]
    assert len(list(commands(block))[1].splitlines()) == 2 and len(list(commands(block))[2].splitlines()) == 3


@pytest.mark.unit
def test_a_placeholder_is_the_field_of_the_latest_answer_that_has_it() -> None:
    answers = ['{"facts": [{"memory_id": "m-old"}]}', '{"hits": []}', '{"facts": [{"memory_id": "m-new", "x": 1}]}']
    assert fill("curl 'h/v1/facts/MEMORY_ID/history'", answers) == "curl 'h/v1/facts/m-new/history'"
    assert fill("curl 'h/v1/stats'", []) == "curl 'h/v1/stats'"
    with pytest.raises(AssertionError, match="memory_id"):
        fill("curl 'h/v1/facts/MEMORY_ID/history'", ['{"hits": []}'])


@pytest.mark.unit
def test_curl_in_a_documents_shell_fails_on_an_http_error_status(tmp_path: Path) -> None:
    """`curl -s` alone exits 0 on a 404 or a 503: in the documents' shell it fails and shows the answer."""
    (tmp_path / "here.json").write_text('{"ok": true}')
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port := free_port())],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    shell = Shell(tmp_path, user_env())
    try:
        wait_for(lambda: shell.run(f"curl -s localhost:{port}/here.json")[0] == 0, 30, 0.2, "the file server")
        assert shell.run(f"curl -s localhost:{port}/here.json") == (0, '{"ok": true}')
        status, output = shell.run(f"curl -s localhost:{port}/missing")
        assert status == 22 and "404" in output, (status, output)
        assert shell.run("X=1")[0] == 0 and shell.run('echo "$X"') == (0, "1\n")  # one shell: variables carry over
        assert shell.run("cat")[0] == 0  # a command reading stdin gets nothing, not the runner's next lines
    finally:
        shell.close()
        server.kill()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def services(base_settings: Settings) -> Iterator[Settings]:
    """The worker, indexer, embedder, API and MCP server on the documents' ports, by infra's launcher; whatever
    this fixture started is stopped at the end, so nothing of it still listens on 8000 or 8001."""
    s = base_settings
    assert (s.api_host, s.api_port, s.mcp_port) == ("127.0.0.1", 8000, 8001), "the documents use these ports"
    started = [name for name in stack.SERVICE_ORDER if service.pid(s, name) is None]
    try:
        stack.up(s, started, report=lambda part, what: print(f"{part}: {what}"))
        yield s
    finally:
        stack.down(s, started)
        assert all(service.pid(s, name) is None for name in started), "a service the test started still runs"


def settled(s: Settings) -> None:
    """Everything published is applied and searchable; fails at once if one of the services has died."""

    def alive() -> None:
        dead = [name for name in stack.SERVICE_ORDER if service.pid(s, name) is None]
        if dead:
            logs = {name: service.describe(s, name)["log"] for name in dead}
            tails = "\n".join(f"{name}:\n{Path(log).read_text(errors='replace')[-2000:]}" for name, log in logs.items())
            raise AssertionError(f"{dead} exited:\n{tails}")

    alive()
    wait_caught_up(s, timeout=90)
    drain_search(s, 90, alive)


def test_every_example_runs_as_written(services: Settings, tmp_path: Path) -> None:
    answers: list[str] = []
    ran: list[Ran] = []
    failed: dict[str, str] = {}
    for document in DOCUMENTS:
        try:
            ran += run_document(document, tmp_path, lambda: settled(services), answers)
        except AssertionError as exc:  # the other documents still run: one report names every failing example
            failed[document.name] = str(exc)[-4000:]
    for r in ran:  # what ran, in the log of a passing run too
        for command, output in zip(r.commands, r.outputs, strict=True):
            print(f"{r.block.where} $ {command.splitlines()[0][:110]}\n    -> {' '.join(output.split())[:200]}")
    assert not failed, "\n\n".join(f"{name}: {error}" for name, error in failed.items())

    expected: list[Block] = [b for d in DOCUMENTS for b in blocks(d) if b.runs]
    assert [r.block for r in ran] == expected and all(r.commands for r in ran), "an example did not run"
    # what the README's examples promise each other: the history of a fact found above, a Python example that still
    # finds the fact the curl block published (the erasure comes after it, of a subject of its own), and an erasure
    history = next(o for r in ran for c, o in zip(r.commands, r.outputs, strict=True) if "/history?" in c)
    assert json.loads(history)["versions"], history
    readme_python = next(r for r in ran if r.block.document.name == "README.md" and r.block.language == "python")
    # the port as it stands: 8080 as the curl block published it, or a later value where `make demo` corrected it
    asked = "/project:P1/facts?tenant=demo&after="  # read with the publish's token: the port it published or later
    facts = next(o for r in ran for c, o in zip(r.commands, r.outputs, strict=True) if asked in c)
    port = next(f["value"] for f in json.loads(facts)["facts"] if f["key"] == "project.port")
    assert str(port) in readme_python.outputs[0], (port, readme_python.outputs[0])
    for r in ran:  # a subject an example erases has no facts in the rest of its block
        erased: set[str] = set()
        for command, output in zip(r.commands, r.outputs, strict=True):
            erased |= set(re.findall(r"-X DELETE '[^']*/v1/subjects/([^?']+)", command))
            asked = re.search(r"/v1/subjects/([^/?']+)/facts", command)
            if asked and asked.group(1) in erased:
                assert json.loads(output)["facts"] == [], f"{r.block.where}: {command}\n{output}"
