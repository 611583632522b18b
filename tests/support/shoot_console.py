"""Screenshots of the audit console's main views: `python -m tests.support.shoot_console [--out docs/console]`.

Runs the console's world (tests.support.console_world: the real Kafka, PostgreSQL and Elasticsearch
on private names, the worker, the indexer, the API as a server; all cleaned up after) and drives a
headless Chromium through it with the same page object as tests/test_console.py, with every request
to another origin blocked. Writes facts-timeline.png, version-chain.png, as-of.png and recall.png; then, with
malformed records written to the ledger and dead-lettered by the worker, operations.png (the Operations view) and
dead-letter.png (one of them opened, a correction typed in); then, in the erasure world
(tests.support.erasure_world: encryption on, subjects erased), erasures.png.
Needs the stack `python -m infra up` starts; docs/console.md shows the pictures.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from pathlib import Path

# the local stack runs with the development key and password, as under the tests and `python -m bench`
os.environ.setdefault("LEDGER_DEVELOPMENT", "1")

from producers.settings import REPO_ROOT, get_settings  # noqa: E402
from tests.support.browser import OfflinePage, chromium  # noqa: E402
from tests.support.console_page import ConsolePage  # noqa: E402
from tests.support.console_world import AUDITOR_KEY, MALFORMED, SUBJECT, console_world, produce_malformed  # noqa: E402
from tests.support.erasure_world import AUDITOR_KEY as ERASURE_KEY  # noqa: E402
from tests.support.erasure_world import GONE, erasure_settings, erasure_world  # noqa: E402

RECALL_QUERY = "P1 的后端服务地址是什么"  # "what is P1's backend address?": the alias cue finds it exactly
AS_OF, KNOWN_AT = "2026-03-06T00:00:00Z", "2026-03-11T00:00:00Z"  # inside the trip override


def shoot(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    settings = get_settings().private(f"shots_{uuid.uuid4().hex[:8]}")
    with (
        console_world(settings) as world,
        chromium() as browser,
        OfflinePage(browser, world.url, width=1600, height=1000) as tab,
    ):
        console = ConsolePage(tab.page)

        def picture(name: str) -> None:
            path = out / name
            tab.page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring
            tab.page.screenshot(path=str(path), full_page=True)
            written.append(path)

        console.open()
        console.login(AUDITOR_KEY)
        assert console.open_subject(SUBJECT) == "ready", console.error()
        picture("facts-timeline.png")
        assert console.chain_of("pref.seat") == "ready", console.error()
        picture("version-chain.png")
        assert console.view("asof") == "ready", console.error()
        console.move_to("asof", AS_OF)
        console.move_to("known", KNOWN_AT)
        picture("as-of.png")
        console.recall(RECALL_QUERY)
        picture("recall.png")

        letters = {name: produce_malformed(world, name) for name in MALFORMED}
        assert console.ops() == "ready", console.error()
        picture("operations.png")
        partition, offset = letters["missing-content"]
        assert console.open_letter(partition, offset) == "ready", console.error()
        draft = json.loads(tab.page.input_value("#redrive-event"))
        tab.page.fill("#redrive-event", json.dumps({**draft, "content": "ticket T-100 has high priority"}, indent=2))
        tab.page.evaluate("document.activeElement && document.activeElement.blur()")
        # the letters' list and the open letter: from the list's top to the letter's bottom, in page coordinates
        top, bottom = tab.page.evaluate(
            "() => [document.querySelector('#ops-letters').getBoundingClientRect().top + scrollY,"
            " document.querySelector('#letter-detail').getBoundingClientRect().bottom + scrollY]"
        )
        path = out / "dead-letter.png"
        tab.page.screenshot(
            path=str(path), full_page=True, clip={"x": 0, "y": top - 8, "width": 1600, "height": bottom - top + 24}
        )
        written.append(path)
        if tab.blocked or tab.errors:
            raise SystemExit(f"the console reached outside the service or threw: {tab.blocked} {tab.errors}")
    return [*written, shoot_erasures(out)]


def shoot_erasures(out: Path) -> Path:
    """erasures.png: an erased subject, its note and its erasure record."""
    path = out / "erasures.png"
    settings = erasure_settings(get_settings(), f"shots_{uuid.uuid4().hex[:8]}")
    with (
        erasure_world(settings) as world,
        chromium() as browser,
        OfflinePage(browser, world.url, width=1600, height=800) as tab,
    ):
        console = ConsolePage(tab.page)
        console.open()
        console.login(ERASURE_KEY)
        assert console.type_subject(GONE) == "ready", console.error()
        assert console.follow_erasure(world.erasures[GONE]) == "ready", console.error()
        tab.page.evaluate("document.activeElement && document.activeElement.blur()")
        tab.page.screenshot(path=str(path), full_page=True)
        if tab.blocked or tab.errors:
            raise SystemExit(f"the console reached outside the service or threw: {tab.blocked} {tab.errors}")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "console", help="folder for the PNGs")
    for path in shoot(parser.parse_args(argv).out):
        print(path)


if __name__ == "__main__":
    main()
