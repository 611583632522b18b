"""Cue extraction by rules (DESIGN §5 stage 1): pure functions, no I/O.

A query is cut into *units* (a latin/digit word, or one Han character) after NFKC +
casefold, and every contiguous run of units is looked up in the tenant's vocabulary
(known entity ids, key aliases) and in fixed word lists (time words, event types).
The write side (the indexer) uses the same `normalize_*`, `canonical` and
`event_types_in` functions, so a cue found in a query equals the value stored in the
index, byte for byte.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "Cues",
    "TimeRange",
    "Vocabulary",
    "canonical",
    "embedding_text",
    "event_types_in",
    "extract",
    "key_phrases",
    "normalize_entity",
    "normalize_text",
    "subject_ids",
    "units",
]

_HAN = r"[\u2e80-\u2fdf\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
_UNIT = re.compile(rf"{_HAN}|(?:(?!{_HAN})[^\W_])+")
# entity-looking tokens: namespaced ids (user:42, project:P1) and letters followed by digits (P1, OD20241102)
_NAMESPACED = re.compile(r"(?<![A-Za-z0-9])[A-Za-z][A-Za-z0-9_.-]*:[A-Za-z0-9][A-Za-z0-9_.\-]*(?<![.-])")
_CODE = re.compile(r"(?<![A-Za-z0-9:])[A-Za-z]{1,12}[0-9][A-Za-z0-9_-]*(?![A-Za-z0-9:])")
MAX_SPAN_UNITS = 12  # longest alias/entity looked up, in units


def normalize_text(text: str) -> str:
    """NFKC (full-width -> ASCII) and casefold: the one text normal form for cues."""
    return unicodedata.normalize("NFKC", text).casefold()


def _singular(word: str) -> str:
    """A light English plural/3rd-person rule, so `answers`, `seats`, `prefers` meet `answer`, `seat`, `prefer`."""
    if len(word) < 4 or not word.isalpha() or not word.isascii() or not word.endswith("s"):
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes", "zzes")):
        return word[:-2]
    if word.endswith(("ss", "us", "is")):
        return word
    return word[:-1]


def units(text: str) -> list[str]:
    """Latin/digit words (singular) and single Han characters, normalized; separators are dropped."""
    return [_singular(u) for u in _UNIT.findall(normalize_text(text))]


def canonical(text: str) -> str:
    """The lookup form of a phrase: `Backend-Port` and `backend port` both give `backend port`."""
    return " ".join(units(text))


def normalize_entity(entity: str) -> str:
    """Entity ids compare case- and width-insensitively (`P1` == `p1` == `Ｐ１`)."""
    return normalize_text(entity).strip()


def subject_ids(subject: str) -> list[str]:
    """A subject and its bare id: `project:P1` -> [`project:p1`, `p1`], so `P1` in a query finds it."""
    norm = normalize_entity(subject)
    out = [norm]
    if ":" in norm:
        bare = norm.split(":", 1)[1].strip()
        if bare and bare not in out:
            out.append(bare)
    return out


def key_phrases(key: str | None) -> list[str]:
    """How a dotted key reads as words: `project.backend_port` -> [`project backend port`, `backend port`]."""
    if not key:
        return []
    full = canonical(key)
    last = canonical(key.rsplit(".", 1)[-1])
    return [p for p in dict.fromkeys((full, last)) if p]


# --- fixed word lists (both languages) --------------------------------------------------------------

EVENT_TYPES: dict[str, tuple[str, ...]] = {
    "refund": ("退款", "退钱", "退费", "refund", "refunded", "refunds", "refunding"),
    "purchase": ("下单", "购买", "买了", "订购", "purchase", "purchased", "bought", "ordered"),
    "payment": ("付款", "支付", "缴费", "payment", "paid", "pay"),
    "shipment": ("发货", "寄出", "物流", "送达", "shipped", "shipment", "shipping", "delivered", "delivery"),
    "cancellation": ("取消", "cancel", "cancelled", "canceled", "cancellation"),
    "login": ("登录", "登陆", "login", "logged in", "sign in", "signed in"),
    "deployment": ("部署", "上线", "deploy", "deployed", "deployment"),
    "release": ("发布", "发版", "release", "released"),
    "incident": ("故障", "事故", "宕机", "incident", "outage"),
    "complaint": ("投诉", "complaint", "complained"),
    "meeting": ("会议", "开会", "meeting", "meet"),
}

_STOP_UNITS = frozenset(
    "的 了 吗 呢 是 在 有 和 与 及 我 你 他 她 它 们 这 那 哪 什 么 多 少 怎 样 如 何 为 谁"
    " 吧 啊 呀 个 一 也 都 就 还 把 被 给 对 从 到 用 要 会 能 请 问 几"
    " 里 些 该 过 着 之 其 及 或 并 且 所 以 可 告 诉 下 用 上 中 关 于".split()
    + "a an the is are was were be been being of to in on at for by with and or what which who whom whose where"
    " when how why does do did done use uses used tell me about please my our your their its it this that these"
    " those there any some i we you he she they them us can could would should will shall may might has have had"
    " not no yes as from into than then so if".split()
)
_STOP_UNITS = frozenset(_singular(w) for w in _STOP_UNITS)


def _time_words(now: datetime) -> dict[str, tuple[datetime, datetime]]:
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    week = day - timedelta(days=day.weekday())
    month = day.replace(day=1)
    prev_month = (month - timedelta(days=1)).replace(day=1)
    next_month = (month + timedelta(days=32)).replace(day=1)
    year = day.replace(month=1, day=1)
    ranges = {
        ("今天", "今日", "today"): (day, day + timedelta(days=1)),
        ("昨天", "昨日", "yesterday"): (day - timedelta(days=1), day),
        ("前天", "day before yesterday"): (day - timedelta(days=2), day - timedelta(days=1)),
        ("本周", "这周", "这个星期", "this week"): (week, week + timedelta(days=7)),
        ("上周", "上个星期", "上星期", "last week"): (week - timedelta(days=7), week),
        ("本月", "这个月", "this month"): (month, next_month),
        ("上个月", "上月", "last month"): (prev_month, month),
        ("今年", "this year"): (year, year.replace(year=year.year + 1)),
        ("去年", "last year"): (year.replace(year=year.year - 1), year),
        ("最近", "近期", "recently", "lately"): (now - timedelta(days=7), now + timedelta(seconds=1)),
    }
    return {canonical(w): r for words, r in ranges.items() for w in words}


_DAYS_AGO = re.compile(r"(\d{1,4})\s*(?:天前|days?\s+ago)")
_LAST_DAYS = re.compile(r"(?:最近|过去|近|last|past)\s*(\d{1,4})\s*(?:天|days?)")


# --- the tenant vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """What a tenant's data knows: entity ids, keys reachable through aliases, subject namespaces."""

    entities: dict[str, str] = field(default_factory=dict)  # canonical span -> normalized entity id
    aliases: dict[str, frozenset[str]] = field(default_factory=dict)  # canonical span -> keys
    namespaces: frozenset[str] = frozenset()  # `project` of `project:P1`: not content words
    # multi-word latin phrases, by their first word: they also match in any order ("port ... backend")
    word_sets: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        entities: Iterable[str] = (),
        subjects: Iterable[str] = (),
        key_aliases: Iterable[tuple[str, Iterable[str]]] = (),
    ) -> Vocabulary:
        ents: dict[str, str] = {}
        spaces: set[str] = set()
        for e in entities:
            norm = normalize_entity(e)
            if norm and canonical(norm):
                ents.setdefault(canonical(norm), norm)
        for s in subjects:
            for i, sid in enumerate(subject_ids(s)):
                # a short bare number (`42` of `user:42`) is too common in questions to be a cue by itself;
                # `user:42` still is, and so is `42` when the events list it as an entity
                if canonical(sid) and not (i > 0 and sid.isdigit() and len(sid) < 4):
                    ents.setdefault(canonical(sid), sid)
            if ":" in s:
                spaces.update(units(s.split(":", 1)[0]))
        table: dict[str, set[str]] = {}
        for key, aliases in key_aliases:
            for phrase in [*key_phrases(key), *(canonical(a) for a in aliases)]:
                if phrase:
                    table.setdefault(phrase, set()).add(key)
        bags: dict[str, set[tuple[str, ...]]] = {}
        for phrase in table:
            words = phrase.split(" ")
            if 2 <= len(words) <= 4 and not any(re.match(_HAN, w) for w in words):
                bags.setdefault(min(words), set()).add(tuple(words))
        return cls(
            ents,
            {k: frozenset(v) for k, v in table.items()},
            frozenset(spaces),
            {w: tuple(sorted(b)) for w, b in bags.items()},
        )


# --- the result --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeRange:
    start: datetime
    end: datetime
    words: str


@dataclass(frozen=True)
class Cues:
    """Everything the rules found in one query; `as_dict()` is what the API returns."""

    entities: tuple[str, ...] = ()  # normalized ids, known to the tenant or id-shaped
    known_entities: tuple[str, ...] = ()  # the subset the tenant's data contains
    keys: tuple[str, ...] = ()  # keys reached through aliases
    alias_matches: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (phrase in the query, its keys)
    event_types: tuple[str, ...] = ()
    time: TimeRange | None = None
    terms: tuple[str, ...] = ()  # content units no rule explained (stopwords removed)
    text: str = ""  # the query's words without stopwords and time words, as written (lowercased): what BM25 sees
    content_units: tuple[str, ...] = ()  # the same, as units (singular): what a hit's coverage is measured on

    @property
    def unknown_entities(self) -> tuple[str, ...]:
        return tuple(e for e in self.entities if e not in self.known_entities)

    @property
    def empty(self) -> bool:
        return not (self.entities or self.keys or self.event_types or self.time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "entities": list(self.entities),
            "known_entities": list(self.known_entities),
            "keys": list(self.keys),
            "aliases": [{"phrase": p, "keys": list(k)} for p, k in self.alias_matches],
            "event_types": list(self.event_types),
            "time": None
            if self.time is None
            else {"words": self.time.words, "from": _iso(self.time.start), "to": _iso(self.time.end)},
            "terms": list(self.terms),
        }


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


_EVENT_SPANS: dict[str, str] = {canonical(w): etype for etype, words in EVENT_TYPES.items() for w in words}


def _spans(seq: Sequence[str], table: dict[str, Any], max_len: int = MAX_SPAN_UNITS) -> list[tuple[int, int, str]]:
    """Every (start, end, phrase) whose phrase is in table, longest-first, without spans inside a longer one."""
    found = []
    n = len(seq)
    for i in range(n):
        for j in range(min(n, i + max_len), i, -1):
            phrase = " ".join(seq[i:j])
            if phrase in table:
                found.append((i, j, phrase))
    found.sort(key=lambda s: (-(s[1] - s[0]), s[0]))
    kept: list[tuple[int, int, str]] = []
    for s in found:
        if not any(k[0] <= s[0] and s[1] <= k[1] and (k[1] - k[0]) > (s[1] - s[0]) for k in kept):
            kept.append(s)
    return sorted(kept)


def _word_set_matches(seq: Sequence[str], vocab: Vocabulary, seen: set[str]) -> list[tuple[frozenset[int], str]]:
    """Multi-word latin aliases whose words all occur in the query, in any order and not side by side."""
    where: dict[str, list[int]] = {}
    for i, u in enumerate(seq):
        where.setdefault(u, []).append(i)
    out = []
    for first in where:
        for words in vocab.word_sets.get(first, ()):
            phrase = " ".join(words)
            if phrase not in seen and all(w in where for w in words):
                out.append((frozenset(where[w][0] for w in words), phrase))
    return out


def event_types_in(text: str) -> list[str]:
    """Canonical event types named in a text (write side: content + key + tags; read side: the query)."""
    seq = units(text)
    return sorted({_EVENT_SPANS[p] for _, _, p in _spans(seq, _EVENT_SPANS, 4)})


def _time_range(norm: str, seq: list[str], now: datetime) -> tuple[TimeRange | None, list[tuple[int, int, str]]]:
    words = _time_words(now)
    spans = _spans(seq, words, 6)
    if spans:
        first = spans[0]
        start, end = words[first[2]]
        return TimeRange(start, end, first[2].replace(" ", "") if _is_han(first[2]) else first[2]), spans
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if m := _LAST_DAYS.search(norm):
        n = int(m.group(1))
        return TimeRange(day - timedelta(days=n - 1), now + timedelta(seconds=1), m.group(0)), []
    if m := _DAYS_AGO.search(norm):
        n = int(m.group(1))
        return TimeRange(day - timedelta(days=n), day - timedelta(days=n - 1), m.group(0)), []
    return None, []


def _is_han(phrase: str) -> bool:
    return bool(re.match(_HAN, phrase))


def _id_tokens(text: str) -> list[str]:
    nfkc = unicodedata.normalize("NFKC", text)
    found = [m.group(0) for m in _NAMESPACED.finditer(nfkc)]
    masked = _NAMESPACED.sub(" ", nfkc)
    found += [m.group(0) for m in _CODE.finditer(masked)]
    return [normalize_entity(t) for t in found]


def extract(query: str, vocab: Vocabulary, now: datetime) -> Cues:
    """Cues of one query against one tenant's vocabulary; `now` anchors the time words."""
    norm = normalize_text(query)
    raw = _UNIT.findall(norm)  # as written; `seq` is the same list in lookup form (singular)
    seq = [_singular(u) for u in raw]
    covered = [False] * len(seq)

    def cover(spans: Iterable[tuple[int, int, str]]) -> None:
        for i, j, _ in spans:
            for k in range(i, j):
                covered[k] = True

    # entities: id-shaped tokens plus ids the tenant knows (longest span wins)
    entities: list[str] = []
    known: list[str] = []
    ent_spans = _spans(seq, vocab.entities)
    cover(ent_spans)
    for _, _, phrase in ent_spans:
        e = vocab.entities[phrase]
        if e not in known:
            known.append(e)
    for tok in _id_tokens(query):
        cover(_spans(seq, {canonical(tok): True}))
        for cand in subject_ids(tok):  # `project:P1` is known as such or by its bare id
            if canonical(cand) in vocab.entities and vocab.entities[canonical(cand)] not in known:
                known.append(vocab.entities[canonical(cand)])
        if tok not in entities and not any(tok in subject_ids(k) for k in known):
            entities.append(tok)
    entities = list(dict.fromkeys([*known, *entities]))

    # attribute keys through aliases (longest phrase wins over the shorter ones inside it)
    alias_spans = _spans(seq, vocab.aliases)
    cover(alias_spans)
    found = [(frozenset(range(i, j)), phrase) for i, j, phrase in alias_spans]
    found += _word_set_matches(seq, vocab, {p for _, _, p in alias_spans})
    for positions, _ in found:
        cover((k, k + 1, "") for k in positions)
    found = [(pos, p) for pos, p in found if not any(pos < other for other, _ in found)]
    keys: list[str] = []
    matches: list[tuple[str, tuple[str, ...]]] = []
    for _, phrase in sorted(found, key=lambda f: (min(f[0]), f[1])):
        ks = tuple(sorted(vocab.aliases[phrase]))
        matches.append((phrase, ks))
        keys.extend(k for k in ks if k not in keys)

    time, time_spans = _time_range(norm, seq, now)
    cover(time_spans)
    ev_spans = _spans(seq, _EVENT_SPANS, 4)
    cover(ev_spans)
    event_types = sorted({_EVENT_SPANS[p] for _, _, p in ev_spans})

    timed = [False] * len(seq)  # time words are a filter, not text to match
    for i, j, _ in time_spans:
        timed[i:j] = [True] * (j - i)
    keep = [u not in _STOP_UNITS and not t for u, t in zip(seq, timed, strict=True)]
    content = [u for u, k in zip(seq, keep, strict=True) if k]
    terms = [
        u
        for u, c in zip(seq, covered, strict=True)
        if not c and u not in _STOP_UNITS and u not in vocab.namespaces and not u.isdigit()
    ]
    return Cues(
        entities=tuple(entities),
        known_entities=tuple(known),
        keys=tuple(sorted(keys)),
        alias_matches=tuple(matches),
        event_types=tuple(event_types),
        time=time,
        terms=tuple(terms),
        text=" ".join(u for u, k in zip(raw, keep, strict=True) if k),
        content_units=tuple(content),
    )


def embedding_text(content: str | None, key: str | None, aliases: Sequence[str] = ()) -> str:
    """What gets embedded for a document: the statement, then the key as words, then its aliases.

    Seed 001: embedding only the value, or a dotted key, hurts self-retrieval.
    """
    parts = [content or ""]
    if key:
        parts.append(key.replace(".", " ").replace("_", " "))
    if aliases:
        parts.append("; ".join(aliases))
    return "\n".join(p for p in parts if p)
