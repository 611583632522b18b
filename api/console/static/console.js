/* memory-ledger audit console: vanilla JS over the /v1 API (api/console/__init__.py, docs/console.md).
 *
 * Every value from the API is hostile input: it reaches the page only as text (el() below appends
 * strings as text nodes, attributes are set with setAttribute; nothing is ever parsed as markup, and
 * tests/test_console.py fails on any of the DOM's HTML-parsing calls in this file).
 * The page is served with a CSP that allows only this service's script, styles and API.
 *
 * State lives in the URL hash (#tenant=..&subject=..&view=..&erasure=..&letter=..), so a view can be linked and
 * reloaded; the API key lives in sessionStorage (this tab only) and goes out as X-API-Key.
 * Each panel carries data-state (empty | loading | ready | error): the browser test waits on it.
 */
"use strict";

(() => {
  const KEY_STORE = "memory-ledger.console.api-key";
  const SIGNED_OUT_STORE = "memory-ledger.console.signed-out"; // why the last key was signed out, for the login
  const API = new URL("v1/", document.baseURI); // the page is <root>/console, the API <root>/v1/
  const VIEWS = ["facts", "chain", "asof", "recall", "erasures", "receipt", "ops"];
  const SUBJECTS_LIMIT = 50; // subjects listed per request; "More" pages on with the API's cursor
  const ERASURES_LIMIT = 100; // records listed per request; "More" pages on with the API's cursor
  const LETTERS_LIMIT = 50; // dead letters listed per request; "More" pages on with the API's cursor
  const CLIP = 120; // characters of a value shown before "show all" (a memory can be pages long)
  const FOLLOW_MS = 60000; // how long an action's event is followed until the worker applied it
  const RECEIPT_FACTS = 50; // the cited facts whose chain the Receipt view reads for "now" (a replay cites thousands)

  const $ = (id) => document.getElementById(id);

  /** An element with properties and children; strings become text nodes (never markup). */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : k === "title" ? visible(String(v)) : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : visible(String(c)));
    }
    return node;
  }

  // what stored text could reorder or hide the page with: Unicode's control characters (but tab, line feed and
  // carriage return), format characters (bidirectional controls, zero-width, word joiners, tags...), separators (but
  // the space), private-use characters, the default-ignorable code points, which show as nothing (unassigned ones
  // too: a fixed list, the standard keeps those ranges so), every noncharacter, the hieroglyph format controls, and a blank braille
  // pattern and the object replacement character. A right-to-left override read "txt.exe" for "exe.txt", the
  // console's own words around it too; a zero-width space made two subjects look the same. The server's context
  // blocks escape the same set (api/context.py)
  const HIDDEN =
    /[\p{Cc}\p{Cf}\p{Z}\p{Co}\u00AD\u034F\u061C\u115F\u1160\u17B4\u17B5\u180B-\u180F\u200B-\u200F\u202A-\u202E\u2060-\u206F\u3164\uFE00-\uFE0F\uFEFF\uFFA0\uFFF0-\uFFF8\u{1BCA0}-\u{1BCA3}\u{1D173}-\u{1D17A}\u{E0000}-\u{E0FFF}\uFDD0-\uFDEF\u2800\uFFFC\u{13430}-\u{1343F}]|\p{Noncharacter_Code_Point}/gu;
  const KEPT = new Set([" ", "\t", "\n", "\r"]);
  const escaped = (c) =>
    Array.from({ length: c.length }, (_, i) => "\\u" + c.charCodeAt(i).toString(16).toUpperCase().padStart(4, "0"));

  /** Text as it is shown: every hidden character spelled out as a JSON escape (`\u202E`; one outside the BMP as its
   * surrogate pair), so stored text cannot reorder the page or hide in it, and a JSON text stays the same JSON. */
  function visible(text) {
    return text.replace(HIDDEN, (c) => (KEPT.has(c) ? c : escaped(c).join("")));
  }

  /** A node's text, as it is shown (`visible`): the one way the console writes text that may hold stored text. */
  function say(node, text) {
    node.textContent = visible(String(text ?? ""));
  }

  /** Replace a node's children, as el() takes them (nested lists flattened, strings as text nodes). */
  const fill = (node, ...children) =>
    node.replaceChildren(
      ...children
        .flat(Infinity)
        .filter((c) => c !== undefined && c !== null && c !== false)
        .map((c) => (c instanceof Node ? c : visible(String(c)))),
    );

  /** A JSON value as text: strings as they are, anything else as compact JSON. */
  const show = (v) => (typeof v === "string" ? v : JSON.stringify(v));

  // RFC 3339 times as the API writes them: microseconds, mostly zeros. Shown without the zero digits of the
  // fraction (".000000Z" -> "Z", ".712000Z" -> ".712Z"): the same instant, still RFC 3339, still typeable.
  const TIME_RE = /(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d*?)0*(Z|[+-]\d\d:\d\d)/gi;
  const shortTimes = (text) =>
    String(text).replace(TIME_RE, (_, hms, frac, tz) => hms + (frac === "." ? "" : frac) + tz);

  /** A time, shortened as above (the API's exact text in the tooltip); it may wrap only after the "T". */
  function time(t) {
    if (!t) return el("span", { class: "time" }, "—");
    const text = shortTimes(t);
    const cut = text.indexOf("T") + 1;
    return cut > 0
      ? el("span", { class: "time", title: t }, text.slice(0, cut), el("wbr"), text.slice(cut))
      : el("span", { class: "time", title: t }, text);
  }

  /** A score for reading: at most 4 decimals, as the API rounds a hit's scores (a stage's raw score, e.g. a float32
   * from the index, loses its noise); the exact number stays in the tooltip. */
  const score = (v) => (typeof v === "number" && Number.isFinite(v) ? String(Number(v.toFixed(4))) : show(v));

  /** A value that may be long: its first CLIP characters and a button that shows all of it (and less again). */
  function clip(text) {
    const chars = Array.from(String(text)); // code points: a cut never splits a character
    if (chars.length <= CLIP) return String(text);
    const short = chars.slice(0, CLIP).join("") + "…";
    const shown = el("span", { class: "clipped" }, short);
    const toggle = el("button", { type: "button", class: "more quiet small", "aria-expanded": "false" });
    const all = `show all ${chars.length} characters`;
    say(toggle, all);
    toggle.addEventListener("click", () => {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      say(shown, open ? String(text) : short);
      say(toggle, open ? "show less" : all);
      toggle.setAttribute("aria-expanded", String(open));
    });
    return el("span", { class: "long" }, shown, " ", toggle);
  }
  const shortId = (id) =>
    id ? el("code", { class: "id", title: id }, id.length > 12 ? id.slice(0, 12) + "…" : id) : "—";
  const badge = (text, kind) => el("span", { class: `badge ${kind || text}` }, text);
  const ledger = (p, o) => el("code", { class: "ledger", title: "partition/offset" }, `${p}/${o}`);

  function source(src) {
    if (!src || typeof src !== "object") return "—";
    const parts = [src.type, src.service, src.ref].filter((x) => x !== undefined && x !== null && x !== "");
    return el("span", { class: "source", title: JSON.stringify(src) }, parts.map(show).join(" · ") || "—");
  }

  // -- the API -------------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, items) {
      super(items.map((i) => i.message).join("; "));
      this.status = status;
      this.items = items;
    }
  }

  const apiKey = () => sessionStorage.getItem(KEY_STORE) || "";

  /** Call the API; a status in `accept` (e.g. 503 from /health, whose body says which part is down) is an answer.
   * `raw`: a body that is JSON text already, sent as it is; `withText`: answer {data, text} (the JSON as received). */
  async function api(method, path, { params, body, raw, accept, withText } = {}) {
    const url = new URL(path, API);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
    }
    const headers = { "X-API-Key": apiKey(), Accept: "application/json" };
    if (body !== undefined || raw !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(url, {
        method,
        headers,
        body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
        cache: "no-store",
        credentials: "omit",
      });
    } catch (exc) {
      throw new ApiError(0, [{ code: "unreachable", field: null, message: `the service did not answer (${exc})` }]);
    }
    let data = null;
    const text = await response.text().catch(() => "");
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
    if (!response.ok && !(accept || []).includes(response.status)) {
      const items =
        data && Array.isArray(data.detail) && data.detail.length
          ? data.detail
          : [{ code: `http_${response.status}`, field: null, message: response.statusText || "error" }];
      if (response.status === 401) signOut(items);
      throw new ApiError(response.status, items);
    }
    return withText ? { data, text } : data;
  }

  const subjectPath = (subject, tail) => `subjects/${encodeURIComponent(subject)}/${tail}`;

  // -- errors ----------------------------------------------------------------------------------------------------

  function errorNode(err) {
    const items = err instanceof ApiError ? err.items : [{ code: "error", field: null, message: String(err) }];
    const status = err instanceof ApiError && err.status ? `${err.status} ` : "";
    return items.map((i) =>
      el(
        "div",
        { class: "error-item", dataset: { code: String(i.code), status: String(err.status ?? "") } },
        el("strong", null, `${status}${i.code}`),
        i.field ? [" · ", el("code", null, i.field)] : null,
        ": ",
        i.message,
      ),
    );
  }

  function showError(err) {
    const box = $("error");
    box.replaceChildren(...errorNode(err));
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").replaceChildren();
  }

  /** Run a panel's load: data-state loading -> ready, or error (shown in the banner); a load no longer `current`
   * (the panel was emptied or asked again meanwhile) leaves the panel as it is. */
  async function guarded(panel, fn, current = () => true) {
    panel.dataset.state = "loading";
    try {
      await fn();
      if (current()) panel.dataset.state = "ready";
    } catch (err) {
      if (!current()) return;
      panel.dataset.state = "error";
      showError(err);
    }
  }

  // -- state and the URL hash ------------------------------------------------------------------------------------

  const state = {
    tenants: [],
    tenant: null,
    subject: null,
    view: "facts",
    facts: [],
    events: [],
    chainMemory: null,
    asofSeq: 0,
    valid: [], // as-of change points: [{t, what: [..]}], the last is "now"
    known: [], // known-at points, the last is "everything"
    erasure: null, // the erasure record shown in the Erasures view (its erasure id)
    subjectsSeq: 0, // the latest subject search: an earlier one that answers late is dropped
    subjectsNext: null, // the API's cursor of the subject finder's next page (null: none)
    erasuresSeq: 0, // the latest Erasures load: an earlier one that answers late is dropped
    erasuresNext: null, // the API's cursor of the Erasures list's next page (null: none)
    opsSeq: 0, // the latest Operations load (likewise)
    letter: null, // the dead letter open in the Operations view: "partition:offset"
    lettersNext: null, // the API's cursor for the next page of dead letters
    recall: null, // the playground's last recall: {body, data} (its receipt can be opened in the Receipt view)
    factsAnswer: null, // the open subject's facts answer: {text, request} (its receipt, likewise)
    receiptSeq: 0, // the latest Receipt check (an earlier one that answers late is dropped)
    recallSeq: 0, // the latest recall (one of another tenant, answering after the switch, is dropped)
  };

  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    return {
      tenant: h.get("tenant"),
      subject: h.get("subject"),
      view: h.get("view"),
      memory: h.get("fact"),
      erasure: h.get("erasure"),
      letter: LETTER_PLACE.test(h.get("letter") ?? "") ? h.get("letter") : null, // a path of ours: numbers only
    };
  }

  const LETTER_PLACE = /^\d{1,10}:\d{1,19}$/; // a dead letter's partition:offset

  function writeHash() {
    const h = new URLSearchParams();
    if (state.tenant) h.set("tenant", state.tenant);
    if (state.subject) h.set("subject", state.subject);
    if (state.view !== "facts") h.set("view", state.view);
    if (state.view === "chain" && state.chainMemory) h.set("fact", state.chainMemory);
    if (state.view === "erasures" && state.erasure) h.set("erasure", state.erasure);
    if (state.view === "ops" && state.letter) h.set("letter", state.letter);
    const next = "#" + h.toString();
    if (location.hash !== next) history.replaceState(null, "", next);
  }

  // -- sign in / out ---------------------------------------------------------------------------------------------

  // Signing out (or a key refused) forgets the key and reloads the page: everything shown or typed with it (answers,
  // receipts, drafts, hidden views) goes with the old page, so the next key starts from an empty one. Why it ended
  // is kept for the login screen of the new page.
  function signOut(items) {
    sessionStorage.removeItem(KEY_STORE);
    if (items) sessionStorage.setItem(SIGNED_OUT_STORE, JSON.stringify(items));
    // the link to what the key had open goes too (a key refused at sign-in keeps the link it was sent to)
    if (!$("app").hidden) history.replaceState(null, "", location.pathname + location.search);
    location.reload();
  }

  function showLogin() {
    const stored = sessionStorage.getItem(SIGNED_OUT_STORE);
    sessionStorage.removeItem(SIGNED_OUT_STORE);
    let items = null;
    try {
      items = stored ? JSON.parse(stored) : null;
    } catch {
      items = null;
    }
    $("app").hidden = true;
    $("who").hidden = true;
    $("login").hidden = false;
    const box = $("login-error");
    if (items) {
      box.replaceChildren(...errorNode(new ApiError(401, items)));
      box.hidden = false;
    } else {
      box.hidden = true;
    }
    $("api-key").focus();
  }

  async function enter() {
    let data;
    try {
      data = await api("GET", "tenants");
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) {
        signOut(err.items || [{ code: "error", field: null, message: String(err) }]);
      }
      return;
    }
    state.tenants = data.tenants;
    $("tenant").replaceChildren(...state.tenants.map((t) => el("option", { value: t }, t)));
    $("login").hidden = true;
    $("login-error").hidden = true;
    $("app").hidden = false;
    $("who").hidden = false;
    const h = readHash();
    await openTenant(h.tenant || state.tenants[0] || null, false);
    state.erasure = h.erasure;
    state.letter = h.letter;
    if (h.view && VIEWS.includes(h.view)) selectView(h.view, false);
    if (h.subject) await openSubject(h.subject, h.memory);
    else writeHash();
    if (state.view === "erasures") await loadErasures();
    if (state.view === "ops") await loadOps();
  }

  // -- tenants and subjects ---------------------------------------------------------------------------------------

  /** The picker shows the tenant asked for, also one the key may not use (flagged): never silently another. */
  function pickerShows(tenant) {
    const picker = $("tenant");
    for (const o of [...picker.options]) if (o.dataset.foreign !== undefined) o.remove();
    if (tenant && !state.tenants.includes(tenant)) {
      picker.prepend(
        el("option", { value: tenant, class: "foreign", dataset: { foreign: "" } }, `${tenant} (not this key's)`),
      );
    }
    picker.value = tenant ?? "";
    picker.classList.toggle("foreign", Boolean(tenant) && !state.tenants.includes(tenant));
  }

  async function openTenant(tenant, write = true) {
    state.tenant = tenant;
    state.subject = null;
    state.erasure = null;
    state.letter = null;
    state.erasuresSeq++; // a load of the previous tenant's erasures still under way is dropped
    state.opsSeq++; // and of its operations view
    pickerShows(tenant);
    resetSubject();
    resetErasures();
    resetOps();
    resetReceipt();
    resetRecall();
    if (write) writeHash();
    await searchSubjects();
    if (write && state.view === "erasures") await loadErasures();
    if (write && state.view === "ops") await loadOps();
  }

  /** The subject finder: the tenant's subjects starting with the prefix; `more`: the page after the ones shown (the
   * API's `next_cursor`), appended. */
  async function searchSubjects(more = false) {
    clearError();
    const list = $("subjects");
    const seq = ++state.subjectsSeq;
    if (!more) {
      list.replaceChildren();
      state.subjectsNext = null;
      $("subjects-more").hidden = true;
    }
    say($("subjects-note"), "");
    if (!state.tenant) return;
    list.dataset.state = "loading";
    try {
      const params = { tenant: state.tenant, prefix: $("prefix").value, limit: SUBJECTS_LIMIT };
      if (more) params.cursor = state.subjectsNext;
      const data = await api("GET", "subjects", { params });
      if (seq !== state.subjectsSeq) return; // a later search answers instead
      const items = data.subjects.map((s) =>
        el(
          "li",
          null,
          el("button", { type: "button", class: "subject", dataset: { subject: s }, onclick: () => openSubject(s) }, s),
        ),
      );
      if (more) list.append(...items);
      else list.replaceChildren(...items);
      state.subjectsNext = data.more ? data.next_cursor : null;
      $("subjects-more").hidden = !state.subjectsNext;
      const n = list.children.length;
      say($("subjects-note"), n
        ? `${n} subject${n === 1 ? "" : "s"}` + (data.more ? ", more" : "")
        : "no subject starts with this prefix");
      list.dataset.state = "ready";
    } catch (err) {
      if (seq !== state.subjectsSeq) return;
      list.dataset.state = "error";
      showError(err);
    }
  }

  function resetSubject() {
    state.facts = [];
    state.events = [];
    state.chainMemory = null;
    say($("subject-title"), "No subject open");
    say($("subject-note"), !state.tenant
      ? "This key has no tenant."
      : state.tenants.includes(state.tenant)
        ? `Tenant ${state.tenant}: find a subject, or try the recall playground.`
        : `Tenant ${state.tenant} is not one of this key's tenants: pick one of them above.`);
    for (const id of ["facts", "timeline", "chain", "asof-facts"]) $(id).tBodies[0].replaceChildren();
    for (const v of ["facts", "chain", "asof"]) $(`panel-${v}`).dataset.state = "empty";
    $("chain-fact").replaceChildren();
    say($("facts-count"), "");
    $("facts-receipt").hidden = true;
    state.factsAnswer = null;
    say($("events-count"), "");
    $("subject-erased").hidden = true;
    $("subject-erased").replaceChildren();
    $("subject-unknown").hidden = true;
    $("subject-unknown").replaceChildren();
  }

  async function openSubject(subject, memory) {
    clearError();
    resetSubject();
    state.subject = subject;
    $("subject-input").value = subject;
    fill($("subject-title"), el("span", { class: "tenant-name" }, state.tenant ?? "—"), " / ", subject);
    say($("subject-note"), state.tenants.includes(state.tenant)
      ? ""
      : `Tenant ${state.tenant} is not one of this key's tenants: pick one of them above.`);
    writeHash();
    const panel = $("panel-facts");
    await guarded(panel, async () => {
      const params = { tenant: state.tenant };
      const [answer, events] = await Promise.all([
        api("GET", subjectPath(subject, "facts"), { params, withText: true }),
        api("GET", subjectPath(subject, "events"), { params }),
      ]);
      const facts = answer.data;
      state.factsAnswer = { text: answer.text, request: { ...params, subject } };
      $("facts-receipt").hidden = !facts.receipt;
      state.facts = facts.facts;
      state.events = events.events;
      renderFacts($("facts"), state.facts);
      say($("facts-count"), `${state.facts.length} holding now`);
      renderTimeline();
      say(
        $("subject-note"),
        `${state.events.length} events, ${state.facts.length} facts holding now (${shortTimes(facts.as_of)})`,
      );
      buildChainChoices();
      buildAsofPoints();
      if (state.events.some((e) => e.type === "subject.erased")) {
        const erased = await api("GET", "erasures", { params: { ...params, subject, limit: ERASURES_LIMIT } });
        renderErasedNote(subject, erased.erasures);
      }
      if (!state.events.length) {
        say($("subject-note"), `Nothing is recorded for this subject in tenant ${state.tenant}.`);
        renderUnknownNote(subject, await unknownHints(subject));
      }
    });
    if (panel.dataset.state !== "ready") return;
    if (memory) state.chainMemory = memory;
    if (state.view === "chain") await loadChain();
    if (state.view === "asof") await loadAsof();
  }

  /** For a subject with no event: the key's other tenants that have it, and the tenant's subjects sharing the
   * longest prefix with the name (a misspelling). The prefix is found by bisection over its length (a prefix that
   * lists something has every shorter one listing something too): a few index walks, never a scan. A hint only:
   * a lookup that fails is left out. */
  async function unknownHints(subject) {
    const list = async (tenant, prefix, limit) =>
      (await api("GET", "subjects", { params: { tenant, prefix, limit } })).subjects;
    const elsewhere = [];
    const others = state.tenants.filter((t) => t !== state.tenant).slice(0, 20);
    await Promise.all(
      others.map(async (t) => {
        try {
          if ((await list(t, subject, 1))[0] === subject) elsewhere.push(t);
        } catch {
          /* only a hint */
        }
      }),
    );
    elsewhere.sort();
    const chars = Array.from(subject);
    let close = [];
    if (state.tenants.includes(state.tenant)) {
      try {
        let lo = 0;
        let hi = chars.length;
        while (lo < hi) {
          const mid = Math.ceil((lo + hi) / 2);
          const found = await list(state.tenant, chars.slice(0, mid).join(""), 5);
          if (found.length) {
            lo = mid;
            close = found;
          } else {
            hi = mid - 1;
          }
        }
      } catch {
        close = [];
      }
    }
    return { elsewhere, close };
  }

  function renderUnknownNote(subject, { elsewhere, close }) {
    const box = $("subject-unknown");
    const open = (tenant, s) =>
      el(
        "button",
        {
          type: "button",
          class: "quiet small hint-link",
          dataset: { tenant, subject: s },
          onclick: async () => {
            if (tenant !== state.tenant) await openTenant(tenant);
            await openSubject(s);
          },
        },
        tenant === state.tenant ? s : `${s} in ${tenant}`,
      );
    fill(
      box,
      el(
        "p",
        { dataset: { hint: "unknown" } },
        badge("unknown", "unknown"),
        ` No event names ${JSON.stringify(subject)} in tenant ${state.tenant}: nothing is recorded about it here. `,
        "Subjects are matched exactly (case and punctuation count).",
      ),
      elsewhere.length
        ? el(
            "p",
            { dataset: { hint: "tenant" } },
            `It has events in another tenant of this key: `,
            elsewhere.map((t) => open(t, subject)),
          )
        : null,
      close.length
        ? el(
            "p",
            { dataset: { hint: "spelling" } },
            `Did you mean one of these subjects of tenant ${state.tenant}? `,
            close.map((s) => open(state.tenant, s)),
          )
        : el("p", { dataset: { hint: "spelling" } }, "No subject of this tenant starts like it; check the spelling."),
    );
    box.hidden = false;
  }

  // -- facts and timeline -------------------------------------------------------------------------------------------

  function status(f) {
    return [
      badge(f.status),
      f.override ? badge("override") : null,
      f.confirmed_count ? badge(`confirmed ×${f.confirmed_count}`, "confirmed") : null,
    ];
  }

  function renderFacts(table, facts) {
    table.tBodies[0].replaceChildren(
      ...facts.map((f) =>
        el(
          "tr",
          { dataset: { memoryId: f.memory_id, versionId: f.version_id } },
          el("td", { dataset: { field: "key" } }, f.key ?? "—"),
          el("td", { dataset: { field: "scope" } }, f.scope),
          el("td", { class: "value", dataset: { field: "value" }, title: f.content }, clip(show(f.value))),
          el("td", { dataset: { field: "kind" } }, f.kind),
          el("td", { dataset: { field: "version" } }, String(f.version)),
          el("td", { dataset: { field: "valid_from" } }, time(f.valid_from)),
          el("td", { dataset: { field: "valid_to" } }, time(f.valid_to)),
          el("td", { dataset: { field: "observed_at" } }, time(f.observed_at)),
          el("td", { dataset: { field: "source" } }, source(f.source)),
          el("td", { dataset: { field: "status" } }, status(f)),
          el(
            "td",
            null,
            el("button", { type: "button", class: "quiet small", onclick: () => showChain(f.memory_id) }, "chain"),
          ),
        ),
      ),
    );
  }

  function renderTimeline() {
    const rows = state.events.map((e) => {
      const ev = e.event || {};
      const asserted = e.type === "memory.asserted";
      const valid = e.valid_from || e.valid_to ? [time(e.valid_from), " → ", time(e.valid_to)] : "—";
      return el(
        "tr",
        { dataset: { eventId: e.event_id, effect: e.effect.effect } },
        el("td", { dataset: { field: "ledger" } }, ledger(e.partition, e.offset)),
        el("td", { dataset: { field: "observed_at" } }, time(e.observed_at)),
        el(
          "td",
          null,
          el("span", { dataset: { field: "type" } }, e.type),
          el("br"),
          el("code", { class: "id event-id", title: e.event_id, dataset: { field: "event_id" } }, e.event_id),
        ),
        el(
          "td",
          { dataset: { field: "key" } },
          e.key ?? "—",
          e.scope ? el("span", { class: "scope" }, ` @${e.scope}`) : null,
        ),
        el("td", { class: "value", dataset: { field: "value" } }, asserted ? clip(show(ev.value)) : "—"),
        el("td", { dataset: { field: "valid" } }, valid),
        el("td", { dataset: { field: "source" } }, source(ev.source)),
        el(
          "td",
          { dataset: { field: "effect" } },
          badge(e.effect.effect),
          " ",
          el("span", { class: "detail", title: e.effect.detail }, shortTimes(e.effect.detail)),
          e.effect.version_id ? [" ", shortId(e.effect.version_id)] : null,
        ),
      );
    });
    $("timeline").tBodies[0].replaceChildren(...rows);
    say($("events-count"), `${state.events.length} events`);
  }

  // -- version chain ------------------------------------------------------------------------------------------------

  function buildChainChoices() {
    const seen = new Map(); // memory_id -> label, from the events (a retracted fact is in no current list)
    for (const e of state.events) {
      if (e.memory_id && !seen.has(e.memory_id))
        seen.set(e.memory_id, `${e.key ?? "(no key)"}${e.scope ? " @" + e.scope : ""}`);
    }
    $("chain-fact").replaceChildren(
      ...[...seen].map(([mid, label]) => el("option", { value: mid }, `${label} — ${mid.slice(0, 12)}…`)),
    );
    if (!state.chainMemory && seen.size) state.chainMemory = seen.keys().next().value;
    if (state.chainMemory) $("chain-fact").value = state.chainMemory;
  }

  async function showChain(memory) {
    state.chainMemory = memory;
    selectView("chain");
  }

  async function loadChain() {
    const panel = $("panel-chain");
    const memory = state.chainMemory;
    if (!memory || !state.tenant) return;
    $("chain-fact").value = memory;
    writeHash();
    await guarded(panel, async () => {
      const data = await api("GET", `facts/${encodeURIComponent(memory)}/history`, {
        params: { tenant: state.tenant },
      });
      const byVersion = new Map(data.versions.map((v) => [v.version_id, v.version]));
      const marks = new Map(); // version_id -> events that ended, confirmed or overrode it
      for (const e of state.events) {
        const vid = e.effect.version_id;
        if (vid && e.type !== "memory.asserted") marks.set(vid, [...(marks.get(vid) || []), e]);
      }
      const first = data.versions[0];
      $("chain-title").replaceChildren(
        "Version chain of ",
        el("code", null, first ? `${first.key ?? "(no key)"}${first.scope ? " @" + first.scope : ""}` : memory),
        ` — ${data.versions.length} version${data.versions.length === 1 ? "" : "s"}`,
      );
      $("chain").tBodies[0].replaceChildren(
        ...data.versions.map((v) =>
          el(
            "tr",
            { dataset: { versionId: v.version_id, status: v.status }, class: v.status },
            el("td", { dataset: { field: "version" } }, String(v.version)),
            el("td", { class: "value", dataset: { field: "value" }, title: v.content }, clip(show(v.value))),
            el("td", { dataset: { field: "valid_from" } }, time(v.valid_from)),
            el("td", { dataset: { field: "valid_to" } }, time(v.valid_to)),
            el("td", { dataset: { field: "observed_at" } }, time(v.observed_at)),
            el("td", { dataset: { field: "ledger" } }, ledger(v.partition, v.offset)),
            el("td", { dataset: { field: "status" } }, status(v)),
            el(
              "td",
              { dataset: { field: "superseded" } },
              v.superseded_by
                ? [`by v${byVersion.get(v.superseded_by) ?? "?"} at `, time(v.superseded_at)]
                : v.override
                  ? "override: wins inside its window, never superseded"
                  : "—",
            ),
            el("td", { dataset: { field: "source" } }, source(v.source)),
            el(
              "td",
              { dataset: { field: "marks" } },
              (marks.get(v.version_id) || []).map((e) =>
                el("div", null, e.type, " ", ledger(e.partition, e.offset), " ", badge(e.effect.effect)),
              ),
            ),
          ),
        ),
      );
    });
  }

  // -- as of --------------------------------------------------------------------------------------------------------

  function buildAsofPoints() {
    const valid = new Map();
    const known = new Map();
    const add = (map, t, what) => {
      if (!t) return;
      map.set(t, [...(map.get(t) || []), what]);
    };
    for (const e of state.events) {
      const what = `${e.type} ${e.key ?? ""} (${e.partition}/${e.offset})`;
      add(valid, e.valid_from, `${what} starts`);
      add(valid, e.valid_to, `${what} ends`);
      add(known, e.observed_at, `${what} observed`);
    }
    const points = (map) => [...map].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([t, what]) => ({ t, what }));
    state.valid = [...points(valid), { t: null, what: ["now"] }];
    state.known = [...points(known), { t: null, what: ["everything the ledger holds"] }];
    for (const [slider, pts] of [
      ["asof-slider", state.valid],
      ["known-slider", state.known],
    ]) {
      $(slider).max = String(pts.length - 1);
      $(slider).value = String(pts.length - 1);
    }
    syncSlider("asof-slider", "asof-valid", "asof-point", state.valid);
    syncSlider("known-slider", "asof-known", "known-point", state.known);
  }

  function syncSlider(sliderId, textId, noteId, points) {
    const p = points[Number($(sliderId).value)] || { t: null, what: [] };
    $(textId).value = p.t ? shortTimes(p.t) : "";
    say($(noteId), `point ${Number($(sliderId).value) + 1} of ${points.length}: ${p.what.join("; ")}`);
  }

  // strict RFC 3339, as the API takes it (seconds and an offset): anything else is left for the API to refuse
  const RFC3339 = /^(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)$/;
  /** Milliseconds since the epoch of a strict RFC 3339 time, or NaN (the fraction past milliseconds is dropped). */
  function instant(text) {
    const m = RFC3339.exec(String(text).trim());
    if (!m) return NaN;
    const frac = m[3] ? m[3].slice(0, 4) : "";
    return Date.parse(`${m[1]}T${m[2]}${frac}${m[4].toUpperCase()}`);
  }

  /** A time typed into a slider's box: the slider moves to the last point at or before it, and its note says
   * where the typed time falls between the points (the box keeps the time as typed; empty = the last point). */
  function placeTyped(sliderId, textId, noteId, points) {
    const typed = $(textId).value.trim();
    const slider = $(sliderId);
    const last = points.length - 1;
    if (!typed) {
      slider.value = String(last);
      syncSlider(sliderId, textId, noteId, points);
      return;
    }
    const at = instant(typed);
    const note = $(noteId);
    if (Number.isNaN(at)) {
      say(note, `typed ${typed}: not an RFC 3339 time (seconds and an offset), so on no point`);
      return;
    }
    if (last === 0) {
      say(note, `typed ${shortTimes(typed)}: the subject has no event, so the slider has no point`);
      return;
    }
    const times = points.map((p) => (p.t ? instant(p.t) : NaN));
    const same = times.indexOf(at);
    if (same >= 0) {
      slider.value = String(same);
      syncSlider(sliderId, textId, noteId, points); // exactly a point: the box shows it as the slider does
      return;
    }
    let before = -1; // the last point before the typed time
    for (let i = 0; i < last; i++) if (times[i] < at) before = i;
    // past the clock too: the last point ("now", which has no time of its own) is at or before it
    const future = before === last - 1 && at > Date.now();
    slider.value = String(future ? last : Math.max(before, 0));
    const where = (i) => `point ${i + 1} (${shortTimes(points[i].t)}: ${points[i].what.join("; ")})`;
    say(
      note,
      `typed ${shortTimes(typed)} (${points.length} points): ` +
      (before < 0
        ? `before the first, ${where(0)}`
        : future
          ? `after ${points[last].what.join("; ")} (the last event: ${where(before)})`
          : before === last - 1
            ? `after the last event, ${where(before)}, and before ${points[last].what.join("; ")}`
            : `between ${where(before)} and ${where(before + 1)}`),
    );
  }

  let asofTimer = null;
  function scheduleAsof() {
    clearTimeout(asofTimer);
    $("panel-asof").dataset.state = "loading";
    asofTimer = setTimeout(loadAsof, 150);
  }

  async function loadAsof() {
    if (!state.subject) return;
    const panel = $("panel-asof");
    const seq = ++state.asofSeq;
    const asOf = $("asof-valid").value.trim();
    const knownAt = $("asof-known").value.trim();
    panel.dataset.state = "loading";
    try {
      const data = await api("GET", subjectPath(state.subject, "facts"), {
        params: { tenant: state.tenant, as_of: asOf, known_at: knownAt },
      });
      if (seq !== state.asofSeq) return; // a later move of the control answers instead
      clearError();
      renderFacts($("asof-facts"), data.facts);
      $("asof-summary").replaceChildren(
        `${data.facts.length} fact${data.facts.length === 1 ? "" : "s"} holding at valid time `,
        time(data.as_of),
        ", as known at ",
        knownAt ? time(knownAt) : "now (everything the ledger holds)",
      );
      panel.dataset.asOf = data.as_of;
      panel.dataset.knownAt = knownAt;
      panel.dataset.state = "ready";
    } catch (err) {
      if (seq !== state.asofSeq) return;
      panel.dataset.state = "error";
      showError(err);
    }
  }

  // -- recall playground --------------------------------------------------------------------------------------------

  const chips = (values) =>
    values && values.length
      ? values.map((v) => el("span", { class: "chip" }, show(v)))
      : el("span", { class: "none" }, "—");

  function renderCues(cues) {
    const rows = [
      ["entities", chips(cues.entities)],
      ["known entities", chips(cues.known_entities)],
      ["keys", chips(cues.keys)],
      [
        "aliases",
        cues.aliases.length
          ? cues.aliases.map((a) => el("span", { class: "chip" }, `${a.phrase} → ${a.keys.join(", ")}`))
          : chips([]),
      ],
      ["event types", chips(cues.event_types)],
      [
        "time",
        cues.time
          ? el("span", { class: "chip" }, `${cues.time.words}: `, time(cues.time.from), " → ", time(cues.time.to))
          : chips([]),
      ],
      ["terms", chips(cues.terms)],
    ];
    $("recall-cues").replaceChildren(
      ...rows.flatMap(([name, value]) => [el("dt", null, name), el("dd", { dataset: { cue: name } }, value)]),
    );
  }

  function renderTrace(trace) {
    const rows = Object.entries(trace.stages_ms).map(([stage, ms]) =>
      el("tr", { dataset: { stage } }, el("th", null, stage), el("td", { dataset: { field: "ms" } }, `${ms} ms`)),
    );
    for (const [k, v] of Object.entries(trace)) {
      if (k.endsWith("_candidates")) {
        rows.push(
          el("tr", { dataset: { candidates: k } }, el("th", null, k.replace("_", " ")), el("td", null, String(v))),
        );
      }
    }
    for (const [stage, found] of Object.entries(trace.candidates || {})) {
      rows.push(
        el(
          "tr",
          { dataset: { stageCandidates: stage } },
          el("th", null, `${stage} found`),
          el(
            "td",
            null,
            found.length
              ? el(
                  "ol",
                  { class: "candidates" },
                  found.map((c) =>
                    el(
                      "li",
                      { dataset: { versionId: c.version_id } },
                      shortId(c.version_id),
                      c.score === null ? "" : el("span", { title: String(c.score) }, ` · ${score(c.score)}`),
                    ),
                  ),
                )
              : "nothing",
          ),
        ),
      );
    }
    rows.push(
      el("tr", { dataset: { total: "" } }, el("th", null, "total"), el("td", null, `${trace.total_ms} ms`)),
      el("tr", null, el("th", null, "embedding computed"), el("td", null, trace.embedding_computed ? "yes" : "no")),
      el("tr", null, el("th", null, "mode"), el("td", null, trace.mode)),
      el("tr", null, el("th", null, "as of"), el("td", null, time(trace.as_of))),
    );
    $("recall-trace").tBodies[0].replaceChildren(...rows);
  }

  function why(match) {
    const cues = Object.entries(match.cues || {}).filter(
      ([, v]) => v !== null && v !== undefined && !(Array.isArray(v) && !v.length),
    );
    const verified = match.verified || {};
    return [
      el(
        "div",
        { dataset: { field: "cues" } },
        cues.length ? "matched " : "no cue of the query matched (fuzzy similarity only)",
        cues.map(([k, v]) =>
          el(
            "span",
            { class: "chip", dataset: { cue: k } },
            `${k.replace("_", " ")}: ${Array.isArray(v) ? v.map(show).join(", ") : show(v)}`,
          ),
        ),
      ),
      el(
        "div",
        { dataset: { field: "scores" } },
        Object.entries(match.scores || {}).map(([k, v]) =>
          el("span", { class: "score", dataset: { score: k }, title: String(v) }, `${k} ${score(v)}`),
        ),
      ),
      el(
        "div",
        { dataset: { field: "verified" } },
        verified.replaced_by
          ? [
              "the index proposed ",
              shortId(verified.candidate),
              "; PostgreSQL holds ",
              shortId(verified.replaced_by),
              " at as_of",
            ]
          : ["verified against PostgreSQL ", shortId(verified.candidate)],
      ),
    ];
  }

  function renderHits(hits) {
    $("recall-hits").tBodies[0].replaceChildren(
      ...hits.map((h, i) =>
        el(
          "tr",
          { dataset: { versionId: h.version_id, stage: h.match.stage } },
          el("td", null, String(i + 1)),
          el("td", { dataset: { field: "score" }, title: String(h.score) }, score(h.score)),
          el("td", { dataset: { field: "stage" } }, badge(h.match.stage, "stage")),
          el("td", { dataset: { field: "subject" } }, h.subject),
          el("td", { dataset: { field: "key" } }, h.key ?? "—"),
          el("td", { class: "value", dataset: { field: "value" } }, clip(show(h.value))),
          el("td", { class: "content", dataset: { field: "content" } }, clip(h.content ?? "")),
          el("td", { dataset: { field: "valid_from" } }, time(h.valid_from)),
          el("td", { class: "why", dataset: { field: "why" } }, why(h.match)),
        ),
      ),
    );
    say($("recall-count"), `${hits.length}`);
  }

  /** The recall playground emptied: another tenant's answer is not this one's. */
  function resetRecall() {
    state.recallSeq++;
    state.recall = null;
    $("panel-recall").dataset.state = "empty";
    $("recall-cues").replaceChildren();
    $("recall-trace").tBodies[0].replaceChildren();
    $("recall-hits").tBodies[0].replaceChildren();
    say($("recall-count"), "");
    $("recall-receipt").hidden = true;
  }

  async function runRecall() {
    clearError();
    const panel = $("panel-recall");
    const body = {
      tenant: state.tenant,
      query: $("recall-query").value,
      mode: $("recall-mode").value,
      top_k: Number($("recall-topk").value) || 5,
      explain: true,
    };
    const asOf = $("recall-asof").value.trim();
    if (asOf) body.as_of = asOf;
    if ($("recall-subject-only").checked && state.subject) body.subject = state.subject;
    state.recall = null;
    $("recall-receipt").hidden = true;
    const seq = ++state.recallSeq;
    const current = () => seq === state.recallSeq;
    await guarded(
      panel,
      async () => {
        const { data, text } = await api("POST", "recall", { body, withText: true });
        if (!current()) return;
        renderCues(data.cues);
        renderTrace(data.trace);
        renderHits(data.hits);
        state.recall = { body, data, text };
        $("recall-receipt").hidden = !data.receipt;
      },
      current,
    );
  }

  // -- receipts: what an answer reflects, checked and replayed ------------------------------------------------------

  const SIGNATURE_KIND = { valid: "active", invalid: "retracted", unsigned: "override", untrusted: "override" };
  const CITED_KIND = { held: "active", erased: "erased", differs: "retracted", missing: "retracted" };

  function resetReceipt() {
    state.receiptSeq++;
    $("panel-receipt").dataset.state = "empty";
    delete $("panel-receipt").dataset.valid;
    for (const id of ["receipt-summary", "receipt-cited", "receipt-parts"]) $(id).tBodies[0].replaceChildren();
    say($("receipt-title"), "Receipt");
    say($("receipt-count"), "");
    $("receipt-replay").replaceChildren();
    $("receipt-replay").dataset.state = "empty";
  }

  /** JSON text laid out on lines, by whitespace outside strings only: every number keeps its spelling. A receipt is
   * signed over its values as the service wrote them, and JavaScript would write some back otherwise (1.0 as 1). */
  function reindent(text) {
    let out = "";
    let depth = 0;
    let inString = false;
    const line = () => "\n" + "  ".repeat(depth);
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (inString) {
        out += c;
        if (c === "\\") out += text[++i] ?? "";
        else if (c === '"') inString = false;
      } else if (c === '"') {
        inString = true;
        out += c;
      } else if (c === "{" || c === "[") {
        const close = c === "{" ? "}" : "]";
        let j = i + 1;
        while (/\s/.test(text[j] ?? "")) j++;
        if (text[j] === close) {
          out += c + close; // {} and [] stay on their line
          i = j;
        } else {
          depth++;
          out += c + line();
        }
      } else if (c === "}" || c === "]") {
        depth--;
        out += line() + c;
      } else if (c === ",") out += "," + line();
      else if (c === ":") out += ": ";
      else if (!/\s/.test(c)) out += c;
    }
    return out;
  }

  /** The text of each member of a JSON object's text, as written (the object is valid JSON: JSON.parse said so). */
  function members(text) {
    const out = {};
    let depth = 0;
    let key = null;
    let start = -1;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (c === '"') {
        const from = i;
        for (i++; text[i] !== '"'; i++) if (text[i] === "\\") i++;
        if (depth === 1 && key === null) key = JSON.parse(text.slice(from, i + 1));
      } else if (c === "{" || c === "[") depth++;
      else if (c === "}" || c === "]") depth--;
      if (depth === 1 && key !== null && start < 0 && c === ":") start = i + 1;
      else if (start >= 0 && ((depth === 1 && c === ",") || depth === 0)) {
        out[key] = text.slice(start, i).trim();
        key = null;
        start = -1;
      }
    }
    return out;
  }

  /** An answer (its JSON text, with its receipt) and the request it answered, opened in the Receipt view. */
  function openReceipt(text, request) {
    const { tenant, ...asked } = request; // the view sends the tenant picked above
    $("receipt-json").value = reindent(text);
    $("receipt-request").value = JSON.stringify(asked, null, 2);
    selectView("receipt");
    checkReceipt();
  }

  /** The receipt typed in: a receipt, or an answer carrying one (then its digest is checked too); each as JSON text
   * as typed, sent as it is (the signature and the digests are over the values as the service wrote them). */
  function readReceipt() {
    const parsed = (id, field) => {
      const text = $(id).value.trim();
      if (!text) return null;
      try {
        const v = JSON.parse(text);
        if (v && typeof v === "object" && !Array.isArray(v)) return v;
      } catch (exc) {
        throw new ApiError(0, [{ code: "not_json", field, message: String(exc.message) }]);
      }
      throw new ApiError(0, [{ code: "not_an_object", field, message: "a JSON object is expected" }]);
    };
    const given = parsed("receipt-json", "receipt");
    if (!given) throw new ApiError(0, [{ code: "missing", field: "receipt", message: "paste a receipt" }]);
    const text = $("receipt-json").value.trim();
    const wrapped = given.receipt && typeof given.receipt === "object";
    const request = parsed("receipt-request", "request");
    return {
      receipt: wrapped ? given.receipt : given,
      receiptText: wrapped ? members(text).receipt : text,
      answerText: wrapped ? text : null,
      requestText: request ? $("receipt-request").value.trim() : null,
    };
  }

  /** A request body of JSON texts as they are: {"tenant": .., name: text, ..}. */
  const rawBody = (parts) =>
    "{" +
    Object.entries({ tenant: JSON.stringify(state.tenant), ...parts })
      .map(([k, v]) => `${JSON.stringify(k)}:${v}`)
      .join(",") +
    "}";

  /** Each cited fact's version as the ledger holds it now (its chain, GET /v1/facts/{id}/history), by version id. */
  async function citedNow(cited, checks) {
    const facts = [
      ...new Set(cited.filter((c, i) => c.memory_id && checks[i]?.state === "held").map((c) => c.memory_id)),
    ].slice(0, RECEIPT_FACTS);
    const chains = await Promise.all(
      facts.map((m) =>
        api("GET", `facts/${encodeURIComponent(m)}/history`, { params: { tenant: state.tenant } })
          .then((h) => h.versions)
          .catch(() => []),
      ),
    );
    return new Map(chains.flat().map((v) => [v.version_id, v]));
  }

  function nowCell(check, version) {
    if (check.state === "erased") return badge("erased");
    if (!version) return "—";
    return [
      badge(version.status),
      version.superseded_by ? [" by ", shortId(version.superseded_by)] : "",
    ];
  }

  function renderVerification(receipt, v, answerGiven) {
    $("panel-receipt").dataset.valid = String(v.valid);
    $("receipt-title").replaceChildren(
      `Receipt of a ${receipt.answer} answer `,
      badge(v.valid ? "valid" : "invalid", v.valid ? "active" : "retracted"),
    );
    kvRows($("receipt-summary"), [
      ["signature", "signature", [badge(v.signature, SIGNATURE_KIND[v.signature]), " ", shortId(receipt.key_id)]],
      [
        "the answer's digest",
        "answer",
        answerGiven ? (v.answer ? "matches the answer given" : badge("differs", "retracted")) : "no answer given",
      ],
      ["issued", "issued_at", time(receipt.issued_at)],
      ["as of (valid time)", "as_of", time(receipt.as_of)],
      ["known at", "known_at", time(receipt.known_at)],
      ["ledger positions", "positions", el("code", { class: "id" }, show(receipt.positions))],
      ["ranked by", "ranking", receipt.ranking ? chips(Object.values(receipt.ranking.models).filter(Boolean)) : "—"],
      ["cited events erased since", "erased", String(v.erased)],
    ]);
  }

  function renderCited(cited, checks, now) {
    $("receipt-cited").tBodies[0].replaceChildren(
      ...cited.map((c, i) => {
        const check = checks[i] || { state: "missing", detail: "not checked" };
        return el(
          "tr",
          { dataset: { versionId: c.version_id, state: check.state } },
          el("td", null, String(i + 1)),
          el("td", { dataset: { field: "version" } }, shortId(c.version_id)),
          el("td", { dataset: { field: "memory" } }, shortId(c.memory_id)),
          el("td", { dataset: { field: "ledger" } }, ledger(c.partition, c.offset)),
          el("td", { dataset: { field: "link" } }, c.link ? shortId(c.link) : "— (before the chain)"),
          el(
            "td",
            { dataset: { field: "state" } },
            badge(check.state, CITED_KIND[check.state]),
            " ",
            el("span", { class: "detail", title: check.detail }, shortTimes(check.detail)),
          ),
          el("td", { dataset: { field: "now" } }, nowCell(check, now.get(c.version_id))),
        );
      }),
    );
    say($("receipt-count"), plural(cited.length, "event"));
  }

  function renderReplay(r) {
    const box = $("receipt-replay");
    box.dataset.same = String(r.same);
    fill(
      box,
      badge(r.same ? "same" : "different", r.same ? "active" : "retracted"),
      r.same ? " the replay gives the same answer" : " the replay gives another answer",
      r.identical ? ", byte for byte" : "",
      r.models_differ.length ? ["; configured differently now: ", chips(r.models_differ)] : "",
    );
    $("receipt-parts").tBodies[0].replaceChildren(
      ...r.parts.map((p) =>
        el(
          "tr",
          { dataset: { part: p.part, same: String(p.same) } },
          el("th", null, p.part),
          el(
            "td",
            { dataset: { field: "same" } },
            p.same === null
              ? badge("not compared", "history")
              : badge(p.same ? "same" : "differs", p.same ? "active" : "retracted"),
          ),
          el("td", { dataset: { field: "detail" } }, p.detail),
        ),
      ),
    );
  }

  /** Verify the receipt typed in, read what its cited facts are now, then replay it (given the request). */
  async function checkReceipt() {
    clearError();
    const seq = ++state.receiptSeq;
    const panel = $("panel-receipt");
    const replayBox = $("receipt-replay");
    await guarded(panel, async () => {
      for (const id of ["receipt-summary", "receipt-cited", "receipt-parts"]) $(id).tBodies[0].replaceChildren();
      replayBox.replaceChildren();
      replayBox.dataset.state = "empty";
      delete panel.dataset.valid;
      // the verdict of the receipt checked before goes with its tables: a refused one must not keep it
      say($("receipt-title"), "Receipt");
      say($("receipt-count"), "");
      const { receipt, receiptText, answerText, requestText } = readReceipt();
      const asked = answerText ? { receipt: receiptText, answer: answerText } : { receipt: receiptText };
      const v = await api("POST", "receipts/verify", { raw: rawBody(asked) });
      const cited = Array.isArray(receipt.cited) ? receipt.cited : [];
      const now = await citedNow(cited, v.cited);
      if (seq !== state.receiptSeq) return;
      renderVerification(receipt, v, Boolean(answerText));
      renderCited(cited, v.cited, now);
      if (!requestText || receipt.answer === "context" || v.signature === "invalid") {
        replayBox.replaceChildren(
          el(
            "p",
            { class: "note" },
            v.signature === "invalid"
              ? "Not replayed: the signature does not hold."
              : receipt.answer === "context"
                ? "A context block is verified, not replayed: replay the recall and facts it was made of."
                : "Not replayed: give the request it answered.",
          ),
        );
        return;
      }
      replayBox.dataset.state = "loading";
      try {
        const r = await api("POST", "receipts/replay", {
          raw: rawBody({ receipt: receiptText, request: requestText }),
        });
        if (seq !== state.receiptSeq) return;
        renderReplay(r);
        replayBox.dataset.state = "ready";
      } catch (err) {
        replayBox.dataset.state = "error";
        replayBox.replaceChildren(el("div", { class: "error box-error" }, errorNode(err)));
      }
    });
  }

  // -- erasures (the records of crypto-shredding) ---------------------------------------------------------

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  /** The link that opens an erasure record in the Erasures view (a real fragment: it can be copied). */
  function erasureLink(id, subject) {
    const h = new URLSearchParams();
    if (state.tenant) h.set("tenant", state.tenant);
    if (state.subject) h.set("subject", state.subject);
    h.set("view", "erasures");
    h.set("erasure", id);
    return el(
      "a",
      {
        href: "#" + h.toString(),
        class: "id erasure-link",
        dataset: { erasureId: id },
        onclick: (ev) => {
          ev.preventDefault();
          showErasure(id, subject);
        },
      },
      id,
    );
  }

  /** The subject head's note for a subject with subject.erased in its timeline: its erasure records. */
  function renderErasedNote(subject, records) {
    const box = $("subject-erased");
    if (!records.length) {
      box.replaceChildren(
        badge("erased"),
        " This subject has an erasure in its timeline but no erasure record: it was applied without a key store ",
        "(encryption off), so no data key was destroyed.",
      );
    } else {
      box.replaceChildren(
        badge("erased"),
        ` This subject was erased (${plural(records.length, "erasure record")}): `,
        ...records.flatMap((r, i) => [
          i ? "; " : "",
          erasureLink(r.erasure_id, subject),
          " applied ",
          time(r.applied_at),
          r.complete ? "" : " (the search index is not purged yet)",
        ]),
      );
    }
    box.hidden = false;
  }

  function showErasure(id, subject) {
    state.erasure = id;
    if (subject !== undefined) $("erasures-subject").value = subject; // from a subject: list its records
    selectView("erasures");
  }

  function resetErasures() {
    $("panel-erasures").dataset.state = "empty";
    for (const id of ["erasures", "erasure-one"]) $(id).tBodies[0].replaceChildren();
    $("erasure-detail").hidden = true;
    say($("erasures-count"), "");
    $("erasures-more").hidden = true;
  }

  /** A purged count as text ("—" for a store that has not reported yet); times as the API spells them. */
  const purgedValue = (k, v) => (v === null || v === undefined ? "—" : k.endsWith("_at") ? time(v) : show(v));

  function erasureRow(r, linked) {
    const led = r.ledger || {};
    const recs = r.records || {};
    const field = (name, ...children) => el("span", { dataset: { field: name } }, ...children);
    const num = (v) => (v === null || v === undefined ? "—" : String(v));
    return el(
      "tr",
      {
        dataset: { erasureId: r.erasure_id, complete: String(r.complete) },
        class: linked && r.erasure_id === state.erasure ? "selected" : null,
      },
      el(
        "td",
        { dataset: { field: "erasure_id" } },
        linked ? erasureLink(r.erasure_id) : el("code", { class: "id" }, r.erasure_id),
      ),
      el(
        "td",
        { dataset: { field: "complete" } },
        r.complete ? badge("yes", "complete") : badge("no", "incomplete"),
      ),
      el(
        "td",
        { class: "when" },
        el("div", null, "requested ", field("requested_at", time(r.requested_at))),
        el("div", null, "applied ", field("applied_at", time(r.applied_at))),
      ),
      el("td", { dataset: { field: "subject_digest" } }, el("code", { class: "digest" }, r.subject_digest)),
      el(
        "td",
        { class: "records" },
        field("records.total", num(recs.total)),
        " records",
        el("br"),
        field("records.sealed", num(recs.sealed)),
        " sealed · ",
        field("records.clear", num(recs.clear)),
        " clear",
      ),
      el(
        "td",
        { class: "keys", dataset: { field: "keys" } },
        (r.keys || []).length
          ? r.keys.map((k) =>
              el(
                "div",
                { class: "key", dataset: { keyId: k.key_id } },
                el("code", { class: "key-id" }, k.key_id),
                el("br"),
                "fingerprint ",
                el("code", { class: "fingerprint" }, k.fingerprint),
              ),
            )
          : el("span", { class: "none" }, "none (no sealed record)"),
      ),
      el(
        "td",
        { class: "purged" },
        Object.entries(r.purged || {}).map(([store, counts]) =>
          el(
            "div",
            { class: "store", dataset: { store } },
            el("strong", null, store),
            Object.entries(counts && typeof counts === "object" ? counts : { count: counts }).map(([k, v], i) => [
              i ? " · " : " ", // outside the count: the line may wrap here
              el(
                "span",
                { class: "purged-count" },
                `${k.replaceAll("_", " ")} `,
                field(`purged.${store}.${k}`, purgedValue(k, v)),
              ),
            ]),
          ),
        ),
      ),
      el(
        "td",
        { class: "ledger-range" },
        field("ledger.topic", el("code", null, led.topic ?? "—")),
        el("br"),
        "partition ",
        field("ledger.partition", num(led.partition)),
        el("br"),
        "offsets ",
        field("ledger.first_offset", num(led.first_offset)),
        " → ",
        field("ledger.erasure_offset", num(led.erasure_offset)),
        " (the erasure)",
      ),
    );
  }

  /** The Erasures view: the tenant's (or one subject's) records, newest first; `more`: the next page after the
   * ones shown (the API's `next_cursor`), appended. */
  async function loadErasures(more = false) {
    const panel = $("panel-erasures");
    if (!state.tenant) return;
    const seq = ++state.erasuresSeq;
    clearError();
    if (!more) resetErasures();
    writeHash();
    const subject = $("erasures-subject").value;
    const wanted = more ? null : state.erasure;
    panel.dataset.state = "loading";
    try {
      const params = { tenant: state.tenant, subject, limit: ERASURES_LIMIT };
      if (more) params.cursor = state.erasuresNext;
      const [list, one] = await Promise.all([
        api("GET", "erasures", { params }),
        wanted
          ? api("GET", `erasures/${encodeURIComponent(wanted)}`, { params: { tenant: state.tenant } })
          : Promise.resolve(null),
      ]);
      if (seq !== state.erasuresSeq) return; // a later load answers instead
      if (one) {
        $("erasure-title").replaceChildren(
          "Erasure record ",
          el("code", null, one.erasure_id),
          one.complete ? " — complete" : " — not complete: the search index is not purged yet",
        );
        $("erasure-one").tBodies[0].replaceChildren(erasureRow(one, false));
        $("erasure-detail").hidden = false;
      }
      const body = $("erasures").tBodies[0];
      const rows = list.erasures.map((r) => erasureRow(r, true));
      if (more) body.append(...rows);
      else body.replaceChildren(...rows);
      $("erasures-title").firstChild.textContent = visible(subject
        ? `Erasure records of subject ${subject} `
        : `Erasure records of tenant ${state.tenant} `);
      state.erasuresNext = list.more ? list.next_cursor : null;
      $("erasures-more").hidden = !state.erasuresNext;
      const n = body.rows.length;
      say($("erasures-count"), (n ? plural(n, "record") : "no erasure record") + (list.more ? ", more" : ""));
      panel.dataset.state = "ready";
    } catch (err) {
      if (seq !== state.erasuresSeq) return;
      panel.dataset.state = "error";
      showError(err);
    }
  }

  // -- operations: the system behind the tenant ------------------------------------------------------------------

  /** A box of the Operations view: its data-state, and its own error line (one store down spoils only its box). */
  async function boxed(id, fn) {
    const box = $(id);
    const error = box.querySelector(":scope > .box-error");
    box.dataset.state = "loading";
    error.hidden = true;
    error.replaceChildren();
    try {
      await fn();
      box.dataset.state = "ready";
      return true;
    } catch (err) {
      box.dataset.state = "error";
      error.replaceChildren(...errorNode(err));
      error.hidden = false;
      return false;
    }
  }

  /** A table of name/value rows: [label, field, value (text or node)]. */
  function kvRows(table, rows) {
    table.tBodies[0].replaceChildren(
      ...rows.map(([label, field, value]) =>
        el("tr", { dataset: { row: field } }, el("th", null, label), el("td", { dataset: { field } }, value)),
      ),
    );
  }

  const seconds = (s) => (s === null || s === undefined ? "none waiting" : `oldest ${score(s)} s`);

  function resetOps() {
    for (const id of ["ops-parts", "ops-stages", "ops-pipeline", "ops-lag", "dead-letters", "letter-fields"]) {
      $(id).tBodies[0].replaceChildren();
    }
    for (const id of ["ops-health", "ops-stats", "ops-letters", "ops-erasures", "ops-consistency", "letter-detail"]) {
      $(id).dataset.state = "empty";
      const error = $(id).querySelector(":scope > .box-error");
      error.hidden = true;
      error.replaceChildren();
    }
    $("panel-ops").dataset.state = "empty";
    $("ops-health-status").replaceChildren();
    say($("ops-when"), "");
    say($("ops-lag-note"), "");
    say($("letters-count"), "");
    $("letters-more").hidden = true;
    $("ops-erasures-summary").replaceChildren();
    $("consistency-out").replaceChildren();
    $("letter-detail").hidden = true;
    say($("ops-title"), state.tenant ? `Operations of tenant ${state.tenant}` : "Operations");
  }

  async function loadHealth() {
    const data = await api("GET", "health", { accept: [503] }); // 503: degraded, the parts say which
    $("ops-health-status").replaceChildren(badge(data.status, data.status === "ok" ? "active" : "retracted"));
    $("ops-health-status").dataset.status = data.status;
    $("ops-parts").tBodies[0].replaceChildren(
      ...Object.entries(data.parts).map(([name, p]) =>
        el(
          "tr",
          { dataset: { part: name, ok: String(p.ok) } },
          el("th", { dataset: { field: "part" } }, name),
          el("td", { dataset: { field: "state" } }, p.ok ? badge("up", "active") : badge("down", "retracted")),
          el(
            "td",
            { dataset: { field: "answer" } },
            p.ok
              ? [
                  `answered in ${p.ms} ms`,
                  p.status ? `, cluster ${p.status}` : "",
                  p.age_s !== undefined && p.age_s !== null ? `, answer ${score(p.age_s)} s old` : "",
                ]
              : el("span", { class: "error" }, p.error ?? "no answer"),
          ),
        ),
      ),
    );
  }

  async function loadStats() {
    const s = await api("GET", "stats", { params: { tenant: state.tenant } });
    const search = s.search;
    const stages = [
      ["projector (worker)", "projector", s.total_lag, `${plural(s.total_lag, "record")} of the topic not applied`],
      [
        "search indexer",
        "indexer",
        search.outbox_pending,
        `${plural(search.outbox_pending, "document")} to write, ${seconds(search.documents_lag_s)}`,
      ],
      [
        "embedder",
        "embedder",
        search.vectors_pending,
        `${plural(search.vectors_pending, "version")} awaiting vectors, ${seconds(search.vectors_lag_s)}`,
      ],
    ];
    $("ops-stages").tBodies[0].replaceChildren(
      ...stages.map(([label, name, backlog, text]) =>
        el(
          "tr",
          { dataset: { stage: name, backlog: String(backlog) } },
          el("th", null, label),
          el(
            "td",
            { dataset: { field: "state" } },
            backlog ? badge("behind", "override") : badge("caught up", "active"),
          ),
          el("td", { dataset: { field: "backlog" } }, text),
        ),
      ),
    );
    const invariants = s.double_active + s.chain_integrity_violations + s.explicit_confidence_violations;
    kvRows($("ops-pipeline"), [
      ["projector lag (records)", "total_lag", String(s.total_lag)],
      ["events applied", "events_applied", String(s.events_applied)],
      ["versions (PostgreSQL)", "pg_versions", String(search.pg_versions)],
      ["documents (Elasticsearch)", "es_documents", String(search.es_documents)],
      [
        "search outbox (documents to write)",
        "outbox_pending",
        `${search.outbox_pending}, ${seconds(search.documents_lag_s)}`,
      ],
      [
        "vector backlog (versions awaiting vectors)",
        "vectors_pending",
        `${search.vectors_pending}, ${seconds(search.vectors_lag_s)}`,
      ],
      ["dead letters of the tenant", "dlq_count", String(s.dlq_count)],
      [
        "invariants broken (bounded check)",
        "invariants",
        `${invariants}${s.invariants_capped ? "+" : ""}` +
          ` (double active ${s.double_active}, chain ${s.chain_integrity_violations},` +
          ` explicit confidence ${s.explicit_confidence_violations})`,
      ],
      ["answered in", "took_ms", `${s.took_ms.total} ms`],
    ]);
    say($("ops-lag-note"), `consumer group ${s.consumer} on topic ${s.topic}, ${s.total_lag} behind in all`);
    $("ops-lag").tBodies[0].replaceChildren(
      ...Object.entries(s.lag).map(([p, l]) =>
        el(
          "tr",
          { dataset: { partition: p } },
          el("td", { dataset: { field: "partition" } }, p),
          el("td", { dataset: { field: "end_offset" } }, l.end_offset === null ? "—" : String(l.end_offset)),
          el("td", { dataset: { field: "position" } }, String(l.position)),
          el(
            "td",
            { dataset: { field: "lag" }, class: l.lag ? "behind" : null },
            l.lag === null ? "—" : String(l.lag),
          ),
        ),
      ),
    );
  }

  function letterRow(d) {
    const r = d.resolution;
    const position = `${d.partition}:${d.offset}`;
    return el(
      "tr",
      {
        dataset: { position, state: d.state },
        class: position === state.letter ? "selected" : null,
      },
      el("td", { dataset: { field: "ledger" } }, ledger(d.partition, d.offset)),
      el("td", { dataset: { field: "state" } }, badge(d.state, `letter-${d.state}`)),
      el("td", { dataset: { field: "code" } }, el("code", null, d.reason.code)),
      el("td", { dataset: { field: "field" } }, d.reason.field ?? "—"),
      el("td", { class: "message", dataset: { field: "message" } }, clip(d.reason.message)),
      el("td", { dataset: { field: "event_id" } }, d.event_id ?? "—"),
      el("td", { dataset: { field: "recorded_at" } }, time(d.recorded_at)),
      el(
        "td",
        { dataset: { field: "resolution" } },
        r
          ? [
              `by ${r.event_id ?? "an event whose subject was erased since"} at `,
              ledger(r.partition, r.offset),
              ", ",
              time(r.resolved_at),
              r.reason ? [": ", clip(r.reason)] : "",
            ]
          : "—",
      ),
      el(
        "td",
        null,
        el("button", { type: "button", class: "quiet small", onclick: () => openLetter(position) }, "open"),
      ),
    );
  }

  async function loadLetters(more = false) {
    const params = { tenant: state.tenant, state: $("letters-state").value, limit: LETTERS_LIMIT };
    if (more && state.lettersNext) params.after = state.lettersNext;
    const data = await api("GET", "dead-letters", { params });
    const body = $("dead-letters").tBodies[0];
    const rows = data.dead_letters.map(letterRow);
    if (more) body.append(...rows);
    else body.replaceChildren(...rows);
    state.lettersNext = data.next;
    $("letters-more").hidden = !data.next;
    const n = body.rows.length;
    const which = $("letters-state").value || "in any state";
    say($("letters-count"), `${n ? plural(n, "letter") : "no letter"} ${which}${data.next ? ", more" : ""}`);
  }

  async function loadErasureSummary() {
    const data = await api("GET", "erasures", { params: { tenant: state.tenant, limit: ERASURES_LIMIT } });
    const n = data.erasures.length;
    const open = data.erasures.filter((r) => !r.complete).length;
    const newest = data.erasures[0];
    fill(
      $("ops-erasures-summary"),
      el("span", { dataset: { field: "erasures" } }, n ? plural(n, "erasure record") : "no erasure record"),
      data.more ? " (the newest)" : "",
      n ? [", ", el("span", { dataset: { field: "incomplete" } }, `${open} not complete`)] : "",
      newest ? [", the newest applied ", time(newest.applied_at)] : "",
    );
  }

  /** Every box of the view, in parallel; the panel is ready when all answered (error if one failed). */
  async function loadOps() {
    if (!state.tenant) return;
    const seq = ++state.opsSeq;
    const panel = $("panel-ops");
    clearError();
    writeHash();
    panel.dataset.state = "loading";
    const done = await Promise.all([
      boxed("ops-health", loadHealth),
      boxed("ops-stats", loadStats),
      boxed("ops-letters", () => loadLetters()),
      boxed("ops-erasures", loadErasureSummary),
    ]);
    if (seq !== state.opsSeq) return;
    if (state.letter) await openLetter(state.letter);
    say($("ops-when"), `as of ${new Date().toISOString().replace(/\.\d+Z$/, "Z")} (this browser's clock)`);
    panel.dataset.state = done.every(Boolean) ? "ready" : "error";
  }

  /** One dead letter with its record's fields (GET /v1/dead-letters/{p}/{o}) and, while open, its actions. */
  async function openLetter(position, keepOutcome = false) {
    const [partition, offset] = position.split(":");
    state.letter = position;
    writeHash();
    for (const tr of $("dead-letters").tBodies[0].rows) {
      tr.classList.toggle("selected", tr.dataset.position === position);
    }
    const box = $("letter-detail");
    box.hidden = false;
    if (!keepOutcome) {
      $("letter-outcome").hidden = true;
      $("letter-outcome").dataset.state = "empty";
    }
    await boxed("letter-detail", async () => {
      const d = await api("GET", `dead-letters/${partition}/${offset}`, { params: { tenant: state.tenant } });
      box.dataset.position = position;
      box.dataset.letterState = d.state;
      $("letter-title").replaceChildren(
        "Dead letter at ",
        ledger(d.partition, d.offset),
        " ",
        badge(d.state, `letter-${d.state}`),
      );
      fill(
        $("letter-note"),
        el("strong", null, d.reason.code),
        d.reason.field ? [" · ", el("code", null, d.reason.field)] : "",
        ": ",
        d.reason.message,
        d.withheld
          ? " — its record's bytes went with its erased subject; recorded "
          : ` — a record of ${d.size} bytes, recorded `,
        time(d.recorded_at),
        d.sealed
          ? d.sealed.opened
            ? `; sealed (key ${d.sealed.key_id}), opened here`
            : `; sealed (key ${d.sealed.key_id}), not opened: ${d.sealed.why ?? ""}`
          : "",
      );
      const record = d.record && typeof d.record === "object" ? d.record : null;
      kvRows(
        $("letter-fields"),
        record ? Object.entries(record).map(([k, v]) => [k, k, clip(show(v))]) : [],
      );
      $("letter-raw").hidden = d.raw_text === null || d.raw_text === undefined;
      say($("letter-raw"), d.raw_text ?? "");
      $("letter-actions").hidden = d.state !== "open";
      if (d.state === "open") {
        const draft = record ? { ...record } : {}; // withheld: nothing to start a correction from
        delete draft.dead_letter; // the API links the correction to this letter itself
        $("redrive-event").value = visible(JSON.stringify(draft, null, 2)); // the same JSON, spelled out
        $("discard-reason").value = "";
      }
      if (d.resolution) {
        const r = d.resolution;
        $("letter-note").append(
          el("br"),
          `${d.state} by ${r.event_id === null ? "an event whose subject was erased since" : `event ${r.event_id}`} at `,
          ledger(r.partition, r.offset),
          ", ",
          time(r.resolved_at),
          r.reason ? `: ${r.reason}` : "",
        );
      }
    });
  }

  /** Follow an action's event, published at `at`, until the worker has applied it, refused that very record, or
   * FOLLOW_MS passed. A re-drive often keeps the refused record's event id, whose status reads `dead_lettered` (the
   * old refusal) until the correction is applied: only a refusal at the new position is the answer. */
  const refusedAt = (s, at) => s.status === "dead_lettered" && s.partition === at.partition && s.offset === at.offset;
  async function follow(eventId, at) {
    const deadline = Date.now() + FOLLOW_MS;
    for (;;) {
      const s = await api("GET", `events/${encodeURIComponent(eventId)}`, { params: { tenant: state.tenant } });
      if (["applied", "duplicate"].includes(s.status) || refusedAt(s, at) || Date.now() > deadline) return s;
      await new Promise((resolve) => setTimeout(resolve, 400));
    }
  }

  /** Publish a re-drive or a discard, say what the door answered, then what the worker made of it; then the
   * list and the letter again, as the worker left them (the outcome's data-state is final only after that). */
  async function act(kind, body) {
    const position = state.letter;
    const out = $("letter-outcome");
    out.hidden = false;
    out.dataset.state = "loading";
    out.dataset.status = "";
    out.replaceChildren(`${kind}: publishing…`);
    let said;
    try {
      const answer = await api("POST", `dead-letters/${kind === "re-drive" ? "redrive" : "discard"}`, { body });
      out.replaceChildren(
        `${kind} published as event ${answer.event_id} at `,
        ledger(answer.partition, answer.offset),
        ` (${answer.effect}); waiting for the worker…`,
      );
      const s = await follow(answer.event_id, answer);
      const refused = refusedAt(s, answer);
      const status = s.status === "dead_lettered" && !refused ? "pending" : s.status; // the old refusal is not news
      out.dataset.status = status;
      said = [
        `${kind}: event ${answer.event_id} `,
        badge(status, status === "applied" ? "active" : refused ? "retracted" : "history"),
        status === "applied" ? [" at ", ledger(s.partition, s.offset)] : "",
        refused ? [" — refused too: ", el("strong", null, s.reason.code), " ", s.reason.message] : "",
        ["pending", "unknown"].includes(status) ? " — not applied yet; refresh later" : "",
      ];
    } catch (err) {
      out.dataset.state = "error";
      out.replaceChildren(...errorNode(err));
      return;
    }
    await boxed("ops-letters", () => loadLetters());
    await openLetter(position, true);
    fill(out, said);
    out.dataset.state = "ready";
  }

  async function redrive() {
    const [partition, offset] = state.letter.split(":").map(Number);
    let event;
    try {
      event = JSON.parse($("redrive-event").value);
    } catch (exc) {
      const out = $("letter-outcome");
      out.hidden = false;
      out.dataset.state = "error";
      const why = [{ code: "not_json", field: "event", message: String(exc.message) }];
      out.replaceChildren(...errorNode(new ApiError(0, why)));
      return;
    }
    await act("re-drive", { tenant: state.tenant, partition, offset, event });
  }

  async function discard() {
    const [partition, offset] = state.letter.split(":").map(Number);
    await act("discard", { tenant: state.tenant, partition, offset, reason: $("discard-reason").value });
  }

  function renderConsistency(c) {
    const inv = Object.entries(c.invariants);
    const drift = Object.entries(c.counter_drift);
    const search = c.search;
    const rows = [
      ["verdict", "consistent", c.consistent ? badge("consistent", "active") : badge("inconsistent", "retracted")],
      ["invariants broken", "invariants", inv.map(([k, v]) => `${k.replaceAll("_", " ")} ${v}`).join(", ")],
      [
        "counters against a recount",
        "counter_drift",
        drift.length ? drift.map(([k, v]) => `${k} ${v > 0 ? "+" : ""}${v}`).join(", ") : "all equal",
      ],
      [
        "only in PostgreSQL / only in the index",
        "orphans",
        `${search.missing_in_es} / ${search.missing_in_pg}` +
          (search.outbox_pending ? ` (${search.outbox_pending} still queued: not held against it)` : ""),
      ],
      [
        "scanned",
        "scanned",
        Object.entries(c.scanned.postgres_rows)
          .map(([k, v]) => `${k} ${v}`)
          .join(", ") + `; ${c.scanned.elasticsearch_documents} index documents`,
      ],
      ["took", "took_ms", `${c.took_ms.total} ms (PostgreSQL ${c.took_ms.postgres}, search ${c.took_ms.search})`],
    ];
    const table = el("table", { class: "grid narrow kv", id: "consistency" }, el("tbody"));
    kvRows(table, rows);
    $("consistency-out").replaceChildren(table);
  }

  async function runConsistency() {
    $("consistency-out").replaceChildren(el("p", { class: "note" }, "scanning…"));
    await boxed("ops-consistency", async () => {
      try {
        renderConsistency(await api("GET", "stats/consistency", { params: { tenant: state.tenant } }));
      } catch (err) {
        $("consistency-out").replaceChildren();
        throw err;
      }
    });
  }

  // -- views --------------------------------------------------------------------------------------------------------

  function selectView(view, load = true) {
    state.view = view;
    for (const b of $("tabs").querySelectorAll("button[data-view]")) {
      b.setAttribute("aria-selected", String(b.dataset.view === view));
    }
    for (const v of VIEWS) $(`panel-${v}`).hidden = v !== view;
    $("subject-head").hidden = view === "ops" || view === "receipt"; // views of no subject
    writeHash();
    if (!load) return;
    if (view === "chain") loadChain();
    if (view === "asof" && $("panel-asof").dataset.state === "empty") loadAsof();
    if (view === "erasures") loadErasures();
    if (view === "ops") loadOps();
  }

  // -- wiring -------------------------------------------------------------------------------------------------------

  function wire() {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = $("api-key").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORE, key);
      $("api-key").value = "";
      $("login-error").hidden = true;
      enter();
    });
    $("sign-out").addEventListener("click", () => signOut());
    $("tenant").addEventListener("change", (ev) => openTenant(ev.target.value));
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      searchSubjects();
    });
    $("subjects-more").addEventListener("click", () => searchSubjects(true));
    $("open-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const s = $("subject-input").value;
      if (s) openSubject(s);
    });
    for (const b of $("tabs").querySelectorAll("button[data-view]")) {
      b.addEventListener("click", () => selectView(b.dataset.view));
    }
    $("chain-fact").addEventListener("change", (ev) => {
      state.chainMemory = ev.target.value;
      loadChain();
    });
    $("asof-slider").addEventListener("input", () => {
      syncSlider("asof-slider", "asof-valid", "asof-point", state.valid);
      scheduleAsof();
    });
    $("known-slider").addEventListener("input", () => {
      syncSlider("known-slider", "asof-known", "known-point", state.known);
      scheduleAsof();
    });
    $("asof-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      placeTyped("asof-slider", "asof-valid", "asof-point", state.valid);
      placeTyped("known-slider", "asof-known", "known-point", state.known);
      loadAsof();
    });
    $("asof-now").addEventListener("click", () => {
      buildAsofPoints();
      loadAsof();
    });
    $("recall-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      runRecall();
    });
    $("recall-receipt").addEventListener("click", () => {
      if (state.recall) openReceipt(state.recall.text, state.recall.body);
    });
    $("facts-receipt").addEventListener("click", () => {
      if (state.factsAnswer) openReceipt(state.factsAnswer.text, state.factsAnswer.request);
    });
    $("receipt-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      checkReceipt();
    });
    $("erasures-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      state.erasure = null;
      loadErasures();
    });
    $("erasures-more").addEventListener("click", () => loadErasures(true));
    $("erasures-all").addEventListener("click", () => {
      $("erasures-subject").value = "";
      state.erasure = null;
      loadErasures();
    });
    $("ops-refresh").addEventListener("click", () => loadOps());
    $("letters-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      boxed("ops-letters", () => loadLetters());
    });
    $("letters-more").addEventListener("click", () => boxed("ops-letters", () => loadLetters(true)));
    $("redrive-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      redrive();
    });
    $("discard-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      discard();
    });
    $("ops-erasures-open").addEventListener("click", () => {
      state.erasure = null;
      $("erasures-subject").value = "";
      selectView("erasures");
    });
    $("consistency-run").addEventListener("click", () => runConsistency());
    window.addEventListener("hashchange", () => {
      if (!apiKey() || $("app").hidden) return;
      const h = readHash();
      const reopen = async () => {
        const before = [state.tenant, state.view, state.erasure, state.letter];
        if (h.tenant && h.tenant !== state.tenant) await openTenant(h.tenant, false);
        if (h.view && VIEWS.includes(h.view) && h.view !== state.view) selectView(h.view, false);
        if (h.subject && h.subject !== state.subject) await openSubject(h.subject, h.memory);
        const moved = before[0] !== state.tenant || before[1] !== "erasures" || h.erasure !== before[2];
        if (h.view === "erasures" && moved) {
          state.erasure = h.erasure;
          await loadErasures();
        }
        if (h.view === "ops" && (before[0] !== state.tenant || before[1] !== "ops" || h.letter !== before[3])) {
          state.letter = h.letter;
          await loadOps();
        }
      };
      reopen();
    });
  }

  wire();
  if (apiKey()) enter();
  else showLogin();
})();
