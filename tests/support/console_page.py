"""The audit console as a browser user drives it: one page object for the tests and the screenshot script.

`ConsolePage(page)` clicks, types and moves the controls of api/console/static/ the way a person
would, waits on the panels' `data-state` (empty | loading | ready | error) instead of sleeping, and
reads what is shown back as text (`rows("facts")`: the textContent of each row's `data-field` elements).
`short(text)` is what the page writes for the RFC 3339 times in a text of the API's. `page_size(context, pattern,
n)` turns a list's page size down to `n` on the way to the real API, so a few rows make several pages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from playwright.sync_api import BrowserContext, Page, Response, Route

__all__ = ["ConsolePage", "page_size", "short"]

_FRACTION = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d*?)0*(Z|[+-]\d\d:\d\d)", re.IGNORECASE)


def short(text: str | None) -> str:
    """Every RFC 3339 time in `text` as the console shows it: the fraction's trailing zeros dropped (and the dot
    with them when nothing else is left); "—" for none."""
    if text is None:
        return "—"
    return _FRACTION.sub(lambda m: m[1] + ("" if m[2] == "." else m[2]) + m[3], text)


@contextmanager
def page_size(context: BrowserContext, pattern: str, limit: int) -> Iterator[list[httpx.URL]]:
    """While open, the console's requests matching `pattern` ask the real API for `limit` rows (their `limit`
    rewritten); yields the URLs the console asked, as it asked them."""
    asked: list[httpx.URL] = []

    def rewrite(route: Route) -> None:
        url = httpx.URL(route.request.url)
        asked.append(url)
        route.continue_(url=str(url.copy_set_param("limit", str(limit))))

    context.route(pattern, rewrite)
    try:
        yield asked
    finally:
        context.unroute(pattern, rewrite)


_ROWS_JS = """id => Array.from(document.querySelectorAll(`#${id} tbody tr`)).map(tr => ({
  ...Object.fromEntries(
    Array.from(tr.querySelectorAll('[data-field]')).map(td => [td.dataset.field, td.textContent])),
  _data: {...tr.dataset},
}))"""
_CHIPS = """(el, sel, key) => Object.fromEntries(
  Array.from(el.querySelectorAll(sel)).map(c => [c.dataset[key], c.textContent]))"""
_CUES_JS = """ds => Object.fromEntries(ds.map(d =>
  [d.dataset.cue, Array.from(d.querySelectorAll('.chip')).map(c => c.textContent)]))"""
_WHY_JS = f"""rs => {{ const chips = {_CHIPS}; return rs.map(r => ({{
  version_id: r.dataset.versionId,
  stage: r.querySelector('td[data-field=stage]').textContent,
  cues: chips(r, '[data-field=cues] .chip', 'cue'),
  scores: chips(r, '[data-field=scores] .score', 'score'),
  verified: r.querySelector('[data-field=verified]').textContent,
}})); }}"""


class ConsolePage:
    def __init__(self, page: Page, timeout_ms: float = 60_000) -> None:
        self.page = page
        self.timeout = timeout_ms
        page.set_default_timeout(timeout_ms)

    # -- getting in ----------------------------------------------------------------------------------------

    def open(self, fragment: str = "") -> ConsolePage:
        self.page.goto("/console" + fragment)
        self.page.wait_for_selector("#login:not([hidden]), #app:not([hidden])")
        return self

    def login(self, key: str) -> None:
        """Type the key, sign in, and wait until the app or the login error shows."""
        self.page.fill("#api-key", key)
        self.page.click("#sign-in")
        self.page.wait_for_selector("#app:not([hidden]), #login-error:not([hidden])")

    def sign_out(self) -> None:
        """Click Sign out and wait for the new page's login (signing out reloads the page)."""
        with self.page.expect_navigation():
            self.page.click("#sign-out")
        self.page.wait_for_selector("#login:not([hidden])")

    def signed_in(self) -> bool:
        return self.page.is_visible("#app")

    def login_error(self) -> str:
        return self.page.text_content("#login-error") or ""

    # -- tenants and subjects ----------------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        return self.page.eval_on_selector_all("#tenant option", "os => os.map(o => o.textContent)")

    def pick_tenant(self, tenant: str) -> None:
        self.page.select_option("#tenant", tenant)
        self._wait("#subjects")

    def subjects(self) -> list[str]:
        self._wait("#subjects")
        return self.page.eval_on_selector_all("#subjects button.subject", "bs => bs.map(b => b.textContent)")

    def search(self, prefix: str) -> list[str]:
        self.page.fill("#prefix", prefix)
        self.page.click("#search")
        return self.subjects()

    def open_subject(self, subject: str) -> str:
        """Click the subject in the finder's list; the facts panel's state when it settles."""
        self.page.locator("#subjects").get_by_role("button", name=subject, exact=True).click()
        return self._wait("#panel-facts")

    def type_subject(self, subject: str) -> str:
        """Open a subject by typing its name (the finder's second form)."""
        self.page.fill("#subject-input", subject)
        self.page.click("#open")
        return self._wait("#panel-facts")

    # -- what is shown -----------------------------------------------------------------------------------------

    def rows(self, table: str) -> list[dict[str, Any]]:
        """Each row of table #<table>: {data-field: its textContent, ..., "_data": the row's data-* attributes}."""
        return self.page.evaluate(_ROWS_JS, table)

    def error(self) -> str:
        """The error banner's text ('' when hidden)."""
        return (self.page.text_content("#error") or "") if self.page.is_visible("#error") else ""

    def error_codes(self) -> list[str]:
        return self.page.eval_on_selector_all("#error .error-item", "es => es.map(e => e.dataset.code)")

    def view(self, name: str) -> str:
        """Open a tab (facts, chain, asof, recall, erasures, receipt, ops); the panel's state once it settles."""
        self.page.click(f'#tabs button[data-view="{name}"]')
        return self._wait(f"#panel-{name}", also=("empty",))  # a load starts on the click: empty = nothing to load

    def chain_of(self, key: str) -> str:
        """The version chain of the fact with this key (the "chain" button on its row of current facts)."""
        self.page.click('#tabs button[data-view="facts"]')
        row = self.page.locator("#facts tbody tr").filter(has=self.page.locator('td[data-field="key"]', has_text=key))
        row.get_by_role("button", name="chain").click()
        return self._wait("#panel-chain")

    # -- as of ----------------------------------------------------------------------------------------------------

    def slider(self, which: str = "asof") -> tuple[int, int]:
        """(position, last position) of the valid-time ("asof") or known-at ("known") slider."""
        sid = "#asof-slider" if which == "asof" else "#known-slider"
        value, top = self.page.eval_on_selector(sid, "s => [Number(s.value), Number(s.max)]")
        return value, top

    def move(self, which: str, key: str) -> Response:
        """Press `key` (ArrowLeft, ArrowRight, Home, End) once on a slider, as a person moves it; the facts
        response the page received for it. The slider must be able to move that way (else nothing is asked)."""
        sid = "#asof-slider" if which == "asof" else "#known-slider"
        self.page.focus(sid)
        with self.page.expect_response(lambda r: "/facts?" in r.url and r.request.method == "GET") as answer:
            self.page.keyboard.press(key)
        self._wait("#panel-asof")
        return answer.value

    def move_to(self, which: str, time: str) -> None:
        """Move a slider with the keyboard (Home, then ArrowRight) to the point that shows `time`."""
        field = 0 if which == "asof" else 1
        if self.slider(which)[0] != 0:
            self.move(which, "Home")
        while self.asof_inputs()[field] != time:
            value, top = self.slider(which)
            if value >= top:
                raise AssertionError(f"the {which} slider has no point {time}")
            self.move(which, "ArrowRight")

    def asof_inputs(self) -> tuple[str, str]:
        """The valid time and known-at time the controls show ('' = now / everything)."""
        return self.page.input_value("#asof-valid"), self.page.input_value("#asof-known")

    def asof_notes(self) -> tuple[str, str]:
        """The notes under the valid-time and known-at sliders (which point each is on, or where a typed time falls)."""
        return self.page.text_content("#asof-point") or "", self.page.text_content("#known-point") or ""

    def type_asof(self, valid: str, known: str) -> None:
        """Type a valid time and a known-at time ('' = now / everything) and replay (Enter)."""
        self.page.fill("#asof-valid", valid)
        self.page.fill("#asof-known", known)
        with self.page.expect_response(lambda r: "/facts" in r.url and r.request.method == "GET"):
            self.page.press("#asof-valid", "Enter")
        self._wait("#panel-asof")

    def asof_shown(self) -> dict[str, str]:
        return self.page.eval_on_selector("#panel-asof", "p => ({state: p.dataset.state, asOf: p.dataset.asOf || ''})")

    # -- recall ----------------------------------------------------------------------------------------------------

    def recall(self, query: str, mode: str = "auto", top_k: int = 5) -> Response:
        """Run a recall in the playground; the page's own /v1/recall response."""
        self.page.click('#tabs button[data-view="recall"]')
        self.page.fill("#recall-query", query)
        self.page.select_option("#recall-mode", mode)
        self.page.fill("#recall-topk", str(top_k))
        with self.page.expect_response(lambda r: r.url.endswith("/v1/recall")) as answer:
            self.page.click("#recall-run")
        self._wait("#panel-recall")
        return answer.value

    def trace_shown(self) -> dict[str, str]:
        """The stages table: {stage or row name: its text}."""
        return self.page.eval_on_selector_all(
            "#recall-trace tbody tr",
            "rs => Object.fromEntries(rs.map(r => [r.cells[0].textContent, r.cells[1].textContent]))",
        )

    def candidates_shown(self) -> dict[str, list[str]]:
        """The trace's per-stage candidate lists: {stage: [version id of each item, best first]} (empty: nothing)."""
        return self.page.eval_on_selector_all(
            "#recall-trace tbody tr[data-stage-candidates]",
            "rs => Object.fromEntries(rs.map(r => [r.dataset.stageCandidates,"
            " [...r.querySelectorAll('li')].map(li => li.dataset.versionId)]))",
        )

    def cues_shown(self) -> dict[str, list[str]]:
        """The cues panel: {cue name: its chips' texts}."""
        return self.page.eval_on_selector_all("#recall-cues dd", _CUES_JS)

    def why_shown(self) -> list[dict[str, Any]]:
        """Per hit: the stage, the matched cue chips ({cue: text}), the scores ({name: text}), the verification text."""
        return self.page.eval_on_selector_all("#recall-hits tbody tr", _WHY_JS)

    # -- receipts ----------------------------------------------------------------------------------------

    def open_receipt(self, answer: str = "recall") -> str:
        """Click "Open its receipt" of the playground's last recall (`recall`) or of the open subject's facts
        (`facts`); the Receipt panel's state once it settles."""
        with self.page.expect_response(lambda r: r.url.endswith("/v1/receipts/verify")):
            self.page.click(f"#{answer}-receipt")
        return self._wait("#panel-receipt")

    def check_receipt(self, receipt: str, request: str = "") -> str:
        """In the Receipt view, paste a receipt (or an answer with one) and the request it answered, and check it;
        the panel's state once it settles."""
        self.page.click('#tabs button[data-view="receipt"]')
        self.page.fill("#receipt-json", receipt)
        self.page.fill("#receipt-request", request)
        with self.page.expect_response(lambda r: r.url.endswith("/v1/receipts/verify")):
            self.page.click("#receipt-check")
        return self._wait("#panel-receipt")

    def receipt_shown(self) -> dict[str, Any]:
        """The Receipt view: its verdict (data-valid), the summary ({field: text}), the cited events (rows), the
        replay's verdict (data-same, '' when not replayed) and its parts ({part: same text})."""
        return {
            "valid": self.page.eval_on_selector("#panel-receipt", "p => p.dataset.valid ?? ''"),
            "title": self.page.text_content("#receipt-title") or "",
            "summary": self.kv("receipt-summary"),
            "cited": self.rows("receipt-cited"),
            "replay": self.page.eval_on_selector("#receipt-replay", "b => b.dataset.same ?? ''"),
            "replay_text": self.page.text_content("#receipt-replay") or "",
            "parts": self.page.eval_on_selector_all(
                "#receipt-parts tbody tr",
                "rs => Object.fromEntries(rs.map(r => [r.dataset.part, r.querySelector('[data-field=same]')"
                ".textContent]))",
            ),
        }

    # -- erasures ----------------------------------------------------------------------------------------

    def erasures(self, subject: str = "") -> str:
        """In the Erasures view, list the records of `subject` ('' = every subject); the panel's state."""
        self.page.click('#tabs button[data-view="erasures"]')
        self._wait("#panel-erasures", also=("empty",))
        self.page.fill("#erasures-subject", subject)
        self.page.click("#erasures-find")
        return self._wait("#panel-erasures")

    def erased_note(self) -> dict[str, Any]:
        """The subject head's erasure note: its text and the erasure ids it links to ('' and [] when hidden)."""
        if not self.page.is_visible("#subject-erased"):
            return {"text": "", "links": []}
        links = self.page.eval_on_selector_all(
            "#subject-erased a.erasure-link", "as => as.map(a => [a.dataset.erasureId, a.textContent])"
        )
        return {"text": self.page.text_content("#subject-erased") or "", "links": links}

    def follow_erasure(self, erasure_id: str) -> str:
        """Click the note's link to this erasure record; the Erasures panel's state once it settles."""
        links = self.page.locator("#subject-erased a.erasure-link")
        links.filter(has_text=erasure_id).first.click()
        return self._wait("#panel-erasures")

    def erasure_shown(self) -> str:
        """The id of the record shown on its own above the list ('' when none)."""
        if not self.page.is_visible("#erasure-detail"):
            return ""
        return self.page.eval_on_selector("#erasure-one tbody tr", "tr => tr.dataset.erasureId")

    def erasure_keys(self, table: str = "erasures") -> list[list[tuple[str, str]]]:
        """Per row of an erasures table: the destroyed keys shown, (key id, fingerprint) as text."""
        return [
            [tuple(k) for k in row]
            for row in self.page.eval_on_selector_all(
                f"#{table} tbody tr",
                "rs => rs.map(r => [...r.querySelectorAll('.key')].map(k =>"
                " [k.querySelector('.key-id').textContent, k.querySelector('.fingerprint').textContent]))",
            )
        ]

    # -- the subject head ---------------------------------------------------------------------------------------

    def unknown_note(self) -> dict[str, Any]:
        """The note for a subject nothing is recorded for: its text per hint ("unknown", "tenant", "spelling") and
        the subjects it offers to open, as (tenant, subject); {} when hidden."""
        if not self.page.is_visible("#subject-unknown"):
            return {}
        return self.page.eval_on_selector(
            "#subject-unknown",
            """box => ({
              hints: Object.fromEntries([...box.querySelectorAll('[data-hint]')].map(p => [p.dataset.hint,
                p.textContent])),
              offers: [...box.querySelectorAll('button.hint-link')].map(b => [b.dataset.tenant, b.dataset.subject]),
            })""",
        )

    def picker(self) -> tuple[str, str]:
        """The tenant picker's value and the text of its selected option."""
        value, label = self.page.eval_on_selector("#tenant", "s => [s.value, s.selectedOptions[0]?.textContent ?? '']")
        return value, label

    # -- operations ---------------------------------------------------------------------------------------------

    def ops(self) -> str:
        """Open the Operations view; its state once every box answered."""
        self.page.click('#tabs button[data-view="ops"]')
        return self._wait("#panel-ops")

    def refresh_ops(self) -> str:
        """Click Refresh; the view's state once every box answered again."""
        with self.page.expect_response(lambda r: r.url.endswith("/v1/health")):
            self.page.click("#ops-refresh")
        return self._wait("#panel-ops")

    def health_shown(self) -> dict[str, dict[str, str]]:
        """{part: {"ok": "true"/"false", "state": text, "answer": text}} and the overall status under "_status"."""
        parts = self.page.eval_on_selector_all(
            "#ops-parts tbody tr",
            "rs => Object.fromEntries(rs.map(r => [r.dataset.part, {ok: r.dataset.ok,"
            " state: r.querySelector('[data-field=state]').textContent,"
            " answer: r.querySelector('[data-field=answer]').textContent}]))",
        )
        status = self.page.eval_on_selector("#ops-health-status", "s => s.dataset.status || ''")
        return {**parts, "_status": {"status": status}}

    def kv(self, table: str) -> dict[str, str]:
        """A name/value table of the Operations view: {data-field: text}."""
        return self.page.eval_on_selector_all(
            f"#{table} tbody td[data-field]", "ds => Object.fromEntries(ds.map(d => [d.dataset.field, d.textContent]))"
        )

    def letters(self, state: str | None = None) -> list[dict[str, Any]]:
        """The dead letters listed (rows("dead-letters")); with `state` ('' = all), list that state first."""
        if state is not None:
            self.page.select_option("#letters-state", state)
            self.page.click("#letters-list")
            self._wait("#ops-letters")
        return self.rows("dead-letters")

    def open_letter(self, partition: int, offset: int) -> str:
        """Click "open" on the letter's row; the detail's state once it settles."""
        row = self.page.locator(f'#dead-letters tbody tr[data-position="{partition}:{offset}"]')
        with self.page.expect_response(lambda r: f"/v1/dead-letters/{partition}/{offset}?" in r.url):
            row.get_by_role("button", name="open").click()
        return self._wait("#letter-detail")

    def letter_fields(self) -> dict[str, str]:
        return self.kv("letter-fields")

    def redrive(self, event: str) -> str:
        """Replace the corrected event's JSON, re-drive, and wait until the page followed it; the event's status."""
        self.page.fill("#redrive-event", event)
        self.page.click("#redrive")
        return self._outcome()

    def discard(self, reason: str) -> str:
        self.page.fill("#discard-reason", reason)
        self.page.click("#discard")
        return self._outcome()

    def _outcome(self) -> str:
        """The action's final word: the event's status once the page followed it and showed the letter again."""
        state = self._wait("#letter-outcome")
        if state != "ready":
            return "error: " + (self.page.text_content("#letter-outcome") or "")
        return self.page.eval_on_selector("#letter-outcome", "o => o.dataset.status")

    def consistency(self) -> str:
        """Run the consistency check; the box's state once it answered."""
        with self.page.expect_response(lambda r: "/v1/stats/consistency?" in r.url):
            self.page.click("#consistency-run")
        return self._wait("#ops-consistency")

    # -- waiting ---------------------------------------------------------------------------------------------------

    def wait_panel(self, name: str, state: str) -> None:
        """Until panel `name` (facts, chain, asof, recall, erasures, ops) is in `state`."""
        self.page.wait_for_function(
            "([sel, want]) => document.querySelector(sel)?.dataset.state === want", arg=[f"#panel-{name}", state]
        )

    def _wait(self, selector: str, also: tuple[str, ...] = ()) -> str:
        """Until the element's data-state is ready or error (or one of `also`); that state."""
        settled = ["ready", "error", *also]
        self.page.wait_for_function(
            "([sel, ok]) => { const e = document.querySelector(sel); return e && ok.includes(e.dataset.state); }",
            arg=[selector, settled],
            timeout=self.timeout,
        )
        return self.page.eval_on_selector(selector, "e => e.dataset.state")
