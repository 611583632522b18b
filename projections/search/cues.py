"""Cue extraction by rules (the first step of recall): pure functions, no I/O.

A query is cut into units (a latin/digit word, or one Han character) and every run of units is looked up in the
tenant's vocabulary and fixed word lists. The indexer uses the same `normalize_*`, `canonical` and
`event_types_in`, so a cue found in a query equals the value stored in the index, byte for byte.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from producers.contract import rfc3339
from projections import shapes
from projections.search.dates import DateCue, find_dates

__all__ = [
    "Cues",
    "TimeRange",
    "Vocabulary",
    "about_entries",
    "about_entry",
    "canonical",
    "embedding_text",
    "event_types_in",
    "extract",
    "key_phrases",
    "look_alike_forms",
    "DEFAULT_IGNORABLE",
    "normalize_entity",
    "normalize_text",
    "scope_phrases",
    "subject_ids",
    "units",
]

_HAN = r"[\u2e80-\u2fdf\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"


def _word_mark(code: int) -> bool:
    """A combining mark that belongs to a word (a vowel sign, an accent): not an emoji's variation selector or a
    keycap, nor a mark for symbols, which sit next to a word without being part of it (`⚠️P1` is the id `P1`)."""
    return (
        unicodedata.category(chr(code)) in ("Mn", "Mc")
        and not 0xFE00 <= code <= 0xFE0F
        and not 0x20D0 <= code <= 0x20FF
    )


def _mark_class() -> str:
    """The word marks (`_word_mark`) of the Basic Multilingual Plane as a character class's ranges: `\\w` leaves them
    out, so a word would break at a vowel sign (`नमस्ते`) or an accent NFKC does not compose, and its pieces read
    as words of their own (an id `a1` inside `नमस्तेa1`)."""
    marks = [c for c in range(0x300, 0x10000) if _word_mark(c)]
    ranges, start = [], marks[0]
    for prev, cur in itertools.pairwise([*marks, -1]):
        if cur != prev + 1:
            ranges.append(f"\\u{start:04x}-\\u{prev:04x}" if prev > start else f"\\u{start:04x}")
            start = cur
    return "".join(ranges)


# the letters of scripts written without spaces between words beside the Han class: Thai, Lao, Myanmar, Khmer, the
# Hangul jamo, CJK symbols (々 〆 〇), Bopomofo, the katakana extensions, the supplementary planes' ideographs
_SPACELESS = (
    "[\\u0e00-\\u0eff\\u1000-\\u109f\\u1780-\\u17ff\\u1100-\\u11ff\\u3000-\\u303f\\u3100-\\u318f\\u31a0-\\u31ff"
    "\\U00020000-\\U0003ffff]"
)
# units: a Han character, a run of another spaceless script's letters, or a word of letters, digits and word marks;
# a spaceless script never glues to latin (`ลูกค้าP1` is `ลูกค้า` and `p1`)
_MARKS = f"[{_mark_class()}]"
_UNIT = re.compile(rf"{_HAN}|(?:(?=[^\W_]|{_MARKS}){_SPACELESS})+|(?:(?!{_HAN}|{_SPACELESS})[^\W_]|{_MARKS})+")
# entity-looking tokens: namespaced ids (user:42, project:P1) and letters followed by digits (P1, OD20241102)
# a subject may hold `/` and `:` (`team:x/y:z`): read whole, the id before them (`team:x`) is not one the question
# names
_NAMESPACED = re.compile(r"(?<![A-Za-z0-9])[A-Za-z][A-Za-z0-9_.-]*:[A-Za-z0-9][A-Za-z0-9_./:\-]*(?<![./:-])")
_CODE = re.compile(r"(?<![A-Za-z0-9:])[A-Za-z]{1,12}[0-9][A-Za-z0-9_-]*(?![A-Za-z0-9:])")
MAX_SPAN_UNITS = 12  # longest alias/entity looked up, in units
# Bounds on what one query can produce: a 2,000-character query of repeated short tokens
# must cost what a short one costs per unit, and yield an Elasticsearch query of bounded size.
MAX_ID_CHARS = 128  # a run of id characters longer than this is not an id (and is never scanned by the id regexes)
MAX_ENTITIES = 32  # entity cues kept (known ones first): they become `terms` filters
MAX_KEYS = 32  # keys (and alias matches) kept
MAX_TERMS = 64  # unexplained content units reported
MAX_TEXT_WORDS = 64  # words handed to BM25; past this, repeats are dropped first


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


# what a look-alike of an id drops or reads otherwise (an erasure's look-alike check: `look_alike_subjects`): the
# default-ignorable code points, which show as nothing (soft hyphen, zero-width, joiners, bidi controls, tags), and
# the hyphens and minus signs that show as `-`
# Unicode's Default_Ignorable_Code_Point ranges, unassigned ones included (a fixed list: the standard keeps them
# so), as a regex character class's body (api.context escapes them too)
DEFAULT_IGNORABLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
_IGNORABLE = re.compile(f"[{DEFAULT_IGNORABLE}]")
_DASHES = str.maketrans(
    dict.fromkeys("\u02d7\u058a\u1806\u2010\u2011\u2012\u2013\u2014\u2015\u2043\u2212\u2e3a\u2e3b\ufe58\ufe63", "-")
)


def look_alike_forms(subject: str) -> list[str]:
    """The normal forms an id shown like `subject` may have: its own (`normalize_entity`), and that of `subject`
    without its invisible characters and with its dashes as `-` (`user:42\u200b`, `user\u2011x` read as `user:42`,
    `user-x` on a screen)."""
    own = normalize_entity(subject)  # NFKC first: a compatibility form of a dash (`︲`) becomes the dash it is
    forms = [own, normalize_entity(_IGNORABLE.sub("", own).translate(_DASHES))]
    return list(dict.fromkeys(forms))


def subject_ids(subject: str) -> list[str]:
    """A subject and its bare id: `project:P1` -> [`project:p1`, `p1`], so `P1` in a query finds it."""
    norm = normalize_entity(subject)
    out = [norm]
    if ":" in norm:
        bare = norm.split(":", 1)[1].strip()
        if bare and bare not in out:
            out.append(bare)
    return out


def about_entry(id_: str, key: str | None = None) -> str:
    """One entry of what a version is about, as PostgreSQL indexes it (schema.sql's `fact_versions.about`):
    `length:id`, or with a key `length:id:key` (the length keeps `p1` with key `x:y` apart from `p1:x` with key `y`;
    code points, as PostgreSQL counts characters)."""
    return f"{len(id_)}:{id_}" if key is None else f"{len(id_)}:{id_}:{key}"


def about_entries(subject: str, entities: Iterable[str], key: str | None) -> list[str]:
    """What a version is about for recall's exact stage in PostgreSQL: its ids as its search document holds them
    (`subject_ids`, `normalize_entity`), each alone and, when it has a key, with it; its subject's whole id first
    (the look-alike check of an erasure reads it there). Computed here rather than in SQL, whose `lower` differs
    from `casefold` (`ß`, a final `ς`, a dotted `İ`, white space other than spaces)."""
    ids = dict.fromkeys([*subject_ids(subject), *(normalize_entity(e) for e in entities)])
    entries = [about_entry(i) for i in ids]
    if key is not None:
        entries += [about_entry(i, key) for i in ids]
    return entries


def key_phrases(key: str | None) -> list[str]:
    """How a dotted key reads as words: `project.backend_port` -> [`project backend port`, `backend port`]."""
    if not key:
        return []
    full = canonical(key)
    last = canonical(key.rsplit(".", 1)[-1])
    return [p for p in dict.fromkeys((full, last)) if p]


def _reads_as_words(phrase: str) -> bool:
    """Whether a key's phrase names it in a question: two letters at least (one Han character counts). `14` of
    `k.14` or `r` of `k.r` would make every question holding that number or letter name the key."""
    letters = [c for c in phrase if c.isalpha()]
    return len(letters) > 1 or (len(letters) == 1 and not letters[0].isascii())


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

# Scope words: how questions name an environment. A tenant scope belongs to a group when its lookup form,
# or one of its words, is a member ("test", "env-test", "qa"); then every member of the group names it in a question.
# Only the tenant's own scopes are cues (Vocabulary.scopes), so "test" in a tenant without a test scope is a word.
# Left out on purpose: words that mostly mean something else in a question ("live", "local", "stage", 开发 alone).
SCOPE_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("test", "testing", "test env", "test environment", "qa", "测试", "测试环境", "测试服", "测试服务器"),
    ("staging", "staging env", "staging environment", "preprod", "pre production", "uat", "预发", "预发布", "预发环境"),
    ("prod", "production", "prod env", "production environment", "生产", "生产环境", "线上", "线上环境", "正式环境"),
    ("dev", "development", "dev env", "development environment", "开发环境", "本地环境"),
)
_SCOPE_GROUPS = tuple(frozenset(canonical(w) for w in group) for group in SCOPE_SYNONYMS)


def scope_phrases(scope: str) -> list[str]:
    """The lookup forms that name `scope` in a question: its own, and its synonym group's (SCOPE_SYNONYMS)."""
    own = canonical(scope)
    if not own:
        return []
    words = set(own.split(" "))
    out = [own]
    for group in _SCOPE_GROUPS:
        if own in group or words & group:
            out += sorted(group - {own})
    return out


_STOP_UNITS = frozenset(
    "的 了 吗 呢 是 在 有 和 与 及 我 你 他 她 它 们 这 那 哪 什 么 多 少 怎 样 如 何 为 谁"
    " 吧 啊 呀 个 一 也 都 就 还 把 被 给 对 从 到 用 要 会 能 请 问 几"
    " 里 些 该 过 着 之 其 及 或 并 且 所 以 可 告 诉 下 用 上 中 关 于".split()
    + "a an the is are was were be been being of to in on at for by with and or what which who whom whose where"
    " when how why does do did done use uses used tell me about please my our your their its it this that these"
    " those there any some i we you he she they them us can could would should will shall may might has have had"
    " not no yes as from into than then so if s".split()  # `s`: the tail of a possessive (`carol's`)
)
_STOP_UNITS = frozenset(_singular(w) for w in _STOP_UNITS)


def _names_a_cue(phrase: str) -> bool:
    """Whether a phrase of the vocabulary (an id's words, a key's alias) is a cue wherever a question holds it: not
    when it is stop words only (`a` of `ns:a`, `to` of `reports.to`), which nearly every question holds. Such an
    id is still one when the question is nothing but it (`WHO`), or spells it out whole (`ns:a`)."""
    return bool(phrase) and not _STOP_UNITS.issuperset(phrase.split(" "))


# The time words, by the range they name (in the order of `_time_words`'s ranges); their lookup forms are computed
# once here: only the ranges depend on `now`.
_TIME_PHRASES = (
    ("今天", "今日", "today"),
    ("昨天", "昨日", "yesterday"),
    ("前天", "day before yesterday"),
    ("本周", "这周", "这个星期", "this week"),
    ("上周", "上个星期", "上星期", "last week"),
    ("本月", "这个月", "this month"),
    ("上个月", "上月", "last month"),
    ("今年", "this year"),
    ("去年", "last year"),
    ("最近", "近期", "recently", "lately"),
)
_TIME_KEYS = tuple(tuple(canonical(w) for w in words) for words in _TIME_PHRASES)


_EARLIEST, _LATEST = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)


def _or(edge: Callable[[], datetime], beyond: datetime) -> datetime:
    """`edge()`, or `beyond` when it lies past the years a datetime holds (a valid time in year 1 or 9999)."""
    try:
        return edge()
    except (OverflowError, ValueError):
        return beyond


def _time_words(now: datetime) -> dict[str, tuple[datetime, datetime]]:
    """Each time word's lookup form -> the range it names at `now` (cut at the first and last instants a datetime
    holds: "last year" in year 1 starts at its first instant)."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    week = _or(lambda: day - timedelta(days=day.weekday()), _EARLIEST)
    month = day.replace(day=1)
    year = day.replace(month=1, day=1)

    def back(days: int, of: datetime = day) -> datetime:
        return _or(lambda: of - timedelta(days=days), _EARLIEST)

    def ahead(days: int, of: datetime = day) -> datetime:
        return _or(lambda: of + timedelta(days=days), _LATEST)

    ranges = (
        (day, ahead(1)),
        (back(1), day),
        (back(2), back(1)),
        (week, ahead(7, week)),
        (back(7, week), week),
        (month, _or(lambda: (month + timedelta(days=32)).replace(day=1), _LATEST)),
        (_or(lambda: (month - timedelta(days=1)).replace(day=1), _EARLIEST), month),
        (year, _or(lambda: year.replace(year=year.year + 1), _LATEST)),
        (_or(lambda: year.replace(year=year.year - 1), _EARLIEST), year),
        (_or(lambda: now - timedelta(days=7), _EARLIEST), _or(lambda: now + timedelta(seconds=1), _LATEST)),
    )
    return {key: r for keys, r in zip(_TIME_KEYS, ranges, strict=True) for key in keys}


# "the last 3 days", "过去 2 周", "5 hours ago", "3 天前": a number and a unit. Not preceded by a digit or a
# point ("1.5 days" is not "5 days"), any number of digits (so "99999999999 days" is read whole and refused,
# not as its last four digits); the unit word must end there ("weeks", not "weekend").
_N = r"(?<![\d.])(\d+)"
_UNIT_ZH = r"(?:个)?\s*(天|周|星期|礼拜|小时|钟头)"
_UNIT_EN = r"(days?|weeks?|hours?)(?![a-z])"
_LAST_N = re.compile(rf"(?:最近|过去|近|last|past)\s*{_N}\s*(?:{_UNIT_ZH}|{_UNIT_EN})")
_N_AGO = re.compile(rf"{_N}\s*(?:{_UNIT_ZH}\s*前|{_UNIT_EN}\s+ago)")
_TIME_UNITS = {
    **dict.fromkeys(("天", "day", "days"), "day"),
    **dict.fromkeys(("周", "星期", "礼拜", "week", "weeks"), "week"),
    **dict.fromkeys(("小时", "钟头", "hour", "hours"), "hour"),
}
MAX_TIME_N = 9999  # "the last 10000 days" and beyond: refused (no time filter), never an overflow


def _numeric_range(digits: str, unit: str, ago: bool, now: datetime) -> tuple[datetime, datetime] | None:
    """The range of "last N <unit>" / "N <unit> ago", or None when it would be empty, inverted or out of range.

    N = 0 ("the last 0 days") names no time at all: refused rather than guessed, so the query runs unfiltered.
    """
    if len(digits) > len(str(MAX_TIME_N)) or not 1 <= int(digits) <= MAX_TIME_N:
        return None
    n = int(digits)
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        if unit == "hour":
            hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
            if ago:
                start, end = hour - timedelta(hours=n), hour - timedelta(hours=n - 1)
            else:
                start, end = now - timedelta(hours=n), now + timedelta(seconds=1)
        elif ago and unit == "week":  # the calendar week n weeks back
            start = day - timedelta(days=day.weekday() + 7 * n)
            end = start + timedelta(days=7)
        elif ago:
            start, end = day - timedelta(days=n), day - timedelta(days=n - 1)
        else:  # today counts as one of the last n days (or 7n days)
            days = 7 * n if unit == "week" else n
            start, end = day - timedelta(days=days - 1), now + timedelta(seconds=1)
    except OverflowError:
        return None
    return (start, end) if start < end else None


# --- the tenant vocabulary ---------------------------------------------------------------------------


def _heads(table: Iterable[str]) -> dict[str, int]:
    """First unit of each phrase -> the most units a phrase starting with it has: the span scan's index.

    With it a query position whose unit starts no phrase costs one dict lookup, not MAX_SPAN_UNITS joins.
    """
    heads: dict[str, int] = {}
    for phrase in table:
        words = phrase.split(" ")
        if heads.get(words[0], 0) < len(words):
            heads[words[0]] = len(words)
    return heads


@dataclass(frozen=True)
class Vocabulary:
    """What a tenant's data knows: entity ids, keys reachable through aliases, subject namespaces."""

    # canonical span -> every normalized entity id that reads as it (`alice.smith` and `Alice-Smith` both read as
    # `alice smith`), sorted: a span names them all, an id spelled out in a question names itself
    entities: dict[str, tuple[str, ...]] = field(default_factory=dict)
    aliases: dict[str, frozenset[str]] = field(default_factory=dict)  # canonical span -> keys
    namespaces: frozenset[str] = frozenset()  # `project` of `project:P1`: not content words
    # multi-word latin phrases, by their first word: they also match in any order ("port ... backend")
    word_sets: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)  # canonical span -> the tenant's scope it names
    entity_heads: dict[str, int] = field(init=False, repr=False, compare=False)
    alias_heads: dict[str, int] = field(init=False, repr=False, compare=False)
    scope_heads: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entity_heads", _heads(self.entities))
        object.__setattr__(self, "alias_heads", _heads(self.aliases))
        object.__setattr__(self, "scope_heads", _heads(self.scopes))

    @classmethod
    def build(
        cls,
        *,
        entities: Iterable[str] = (),
        subjects: Iterable[str] = (),
        key_aliases: Iterable[tuple[str, Iterable[str]]] = (),
        scopes: Iterable[str] = (),
    ) -> Vocabulary:
        ents: dict[str, set[str]] = {}
        spaces: set[str] = set()
        for e in entities:
            norm = normalize_entity(e)
            if norm and canonical(norm):
                ents.setdefault(canonical(norm), set()).add(norm)
        for s in subjects:
            for i, sid in enumerate(subject_ids(s)):
                # a short bare number (`42` of `user:42`) or a single character (`x` of `p6:x`) is too common in
                # questions to be a cue by itself; `user:42` still is, and so is `42` when the events list it
                if canonical(sid) and not (i > 0 and (len(sid) == 1 or (sid.isdigit() and len(sid) < 4))):
                    ents.setdefault(canonical(sid), set()).add(sid)
            if ":" in s:
                spaces.update(units(s.split(":", 1)[0]))
        table: dict[str, set[str]] = {}
        for key, aliases in key_aliases:
            named = [p for p in key_phrases(key) if _reads_as_words(p)]
            for phrase in [*named, *(canonical(a) for a in aliases)]:
                if _names_a_cue(phrase):
                    table.setdefault(phrase, set()).add(key)
        bags: dict[str, set[tuple[str, ...]]] = {}
        for phrase in table:
            words = phrase.split(" ")
            if 2 <= len(words) <= 4 and not any(re.match(_HAN, w) for w in words):
                bags.setdefault(min(words), set()).add(tuple(words))
        return cls(
            {span: tuple(sorted(ids)) for span, ids in ents.items()},
            {k: frozenset(v) for k, v in table.items()},
            frozenset(spaces),
            {w: tuple(sorted(b)) for w, b in bags.items()},
            _scope_table(scopes),
        )

    def merged(self, other: Vocabulary) -> Vocabulary:
        """This vocabulary plus `other`'s cues (what was indexed since it was built), without rebuilding it.

        The same as building over both inputs. Costs copies of the dicts (C speed) and a pass over `other` only,
        so an incremental load stays cheap on a tenant with a large vocabulary.
        """
        if not (other.entities or other.aliases or other.namespaces or other.scopes):
            return self
        entities = {**other.entities, **self.entities}
        for span, ids in other.entities.items():
            if span in self.entities and not set(ids) <= set(self.entities[span]):
                entities[span] = tuple(sorted({*self.entities[span], *ids}))
        aliases = dict(self.aliases)
        for phrase, keys in other.aliases.items():
            aliases[phrase] = aliases[phrase] | keys if phrase in aliases else keys
        word_sets = dict(self.word_sets)
        for word, bags in other.word_sets.items():
            word_sets[word] = tuple(sorted(set(word_sets.get(word, ())) | set(bags)))
        scopes = _scope_table([*self.scopes.values(), *other.scopes.values()]) if other.scopes else self.scopes
        merged = object.__new__(Vocabulary)
        for name, value in (
            ("entities", entities),
            ("aliases", aliases),
            ("namespaces", self.namespaces | other.namespaces),
            ("word_sets", word_sets),
            ("scopes", scopes),
            ("scope_heads", _heads(scopes)),
            ("entity_heads", _merged_heads(self.entity_heads, other.entity_heads)),
            ("alias_heads", _merged_heads(self.alias_heads, other.alias_heads)),
        ):
            object.__setattr__(merged, name, value)
        return merged


def _scope_table(scopes: Iterable[str]) -> dict[str, str]:
    """Lookup form -> scope, for the tenant's named scopes (the default scope '' is never named): a scope's own
    name first, then its synonyms (the first scope in sorted order wins a synonym two scopes share)."""
    names = sorted({s for s in scopes if s and canonical(s)})
    table: dict[str, str] = {}
    for own in (True, False):
        for s in names:
            phrases = scope_phrases(s)
            for phrase in phrases[:1] if own else phrases[1:]:
                table.setdefault(phrase, s)
    return table


def _merged_heads(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for head, n in b.items():
        if out.get(head, 0) < n:
            out[head] = n
    return out


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
    scopes: tuple[str, ...] = ()  # the tenant's scopes the query names ("测试环境" -> `test`), in query order
    dates: tuple[DateCue, ...] = ()  # calendar dates the query names ("in June"): a preference (search.dates)

    @cached_property
    def unit_counts(self) -> Counter[str]:
        """`content_units` with their multiplicity: a hit's coverage costs the distinct units, not all of them."""
        return Counter(self.content_units)

    @property
    def unknown_entities(self) -> tuple[str, ...]:
        return tuple(e for e in self.entities if e not in self.known_entities)

    @property
    def empty(self) -> bool:
        return not (self.entities or self.keys or self.event_types or self.time)

    def as_dict(self) -> shapes.RecallCues:
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
            "scopes": list(self.scopes),
            "dates": [d.as_dict() for d in self.dates],
        }


def _iso(t: datetime) -> str:
    return rfc3339(t)  # the one spelling of a time in a response


_EVENT_SPANS: dict[str, str] = {canonical(w): etype for etype, words in EVENT_TYPES.items() for w in words}
_EVENT_HEADS = _heads(_EVENT_SPANS)
_TIME_HEADS = _heads(_time_words(datetime(2000, 1, 1, tzinfo=UTC)))  # the phrases do not depend on `now`


def _spans(
    seq: Sequence[str], table: dict[str, Any], max_len: int = MAX_SPAN_UNITS, heads: dict[str, int] | None = None
) -> list[tuple[int, int, str]]:
    """Every (start, end, phrase) whose phrase is in table, longest-first, without spans inside a longer one.

    Linear in len(seq): only positions whose unit starts a phrase (`heads`) are tried, at most `max_len` lengths
    each, and a span is checked for containment against the kept spans that start at most one span length before it.
    """
    if heads is None:
        heads = _heads(table)
    found = []
    n = len(seq)
    for i, u in enumerate(seq):
        longest = heads.get(u)
        if longest is None:
            continue
        for j in range(min(n, i + min(longest, max_len)), i, -1):
            phrase = " ".join(seq[i:j])
            if phrase in table:
                found.append((i, j, phrase))
    found.sort(key=lambda s: (-(s[1] - s[0]), s[0]))
    reach: dict[int, int] = {}  # start -> the furthest end of a kept span starting there
    kept: list[tuple[int, int, str]] = []
    widest = found[0][1] - found[0][0] if found else 0
    for s in found:
        i, j = s[0], s[1]
        # kept spans are at least as long as s and at most `widest` long; one that contains s is longer (spans
        # are unique), so s is dropped exactly when a kept span starting in [j - widest, i] reaches j
        if any(reach.get(k, -1) >= j for k in range(max(0, j - widest), i + 1)):
            continue
        kept.append(s)
        reach[i] = max(reach.get(i, -1), j)
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


def _maximal(found: list[tuple[frozenset[int], str]]) -> list[tuple[frozenset[int], str]]:
    """The matches whose positions are no proper subset of another match's (a superset covers their first one)."""
    at: dict[int, list[int]] = {}
    for n, (positions, _) in enumerate(found):
        for p in positions:
            at.setdefault(p, []).append(n)
    return [
        (positions, phrase)
        for positions, phrase in found
        if not any(positions < found[o][0] for o in at[min(positions)])
    ]


def event_types_in(text: str) -> list[str]:
    """Canonical event types named in a text (write side: content + key + tags; read side: the query)."""
    seq = units(text)
    return sorted({_EVENT_SPANS[p] for _, _, p in _spans(seq, _EVENT_SPANS, 4, _EVENT_HEADS)})


def _time_range(norm: str, seq: list[str], now: datetime) -> tuple[TimeRange | None, list[tuple[int, int, str]]]:
    """The query's time cue, and the spans of its time words (a filter, not text to match).

    A number and a unit ("the last 3 days", "最近3天", "2 周前") is the most specific cue and is read first; when
    its range would be empty or out of range ("the last 0 days", "the last 99999999999 days") there is no time cue
    at all (the query runs unfiltered), never an inverted range.
    """
    words = _time_words(now)
    spans = _spans(seq, words, 6, _TIME_HEADS)
    for pattern, ago in ((_LAST_N, False), (_N_AGO, True)):
        if m := pattern.search(norm):
            rng = _numeric_range(m.group(1), _TIME_UNITS[m.group(2) or m.group(3)], ago, now)
            return (None if rng is None else TimeRange(rng[0], rng[1], m.group(0))), spans
    if spans:
        first = spans[0]
        start, end = words[first[2]]
        return TimeRange(start, end, first[2].replace(" ", "") if _is_han(first[2]) else first[2]), spans
    return None, []


def _is_han(phrase: str) -> bool:
    return bool(re.match(_HAN, phrase))


_ID_RUN = re.compile(r"[A-Za-z0-9_.:/\-]+")  # every character an id token can have: ids never cross a run's ends


def _id_runs(nfkc: str) -> Iterator[str]:
    """The runs of id characters in `nfkc` that stand as words: a run glued to another letter, digit or combining
    mark (`zq7` of `Cafézq7`, `a1` of `Νίκοςa1` or of `नमस्तेa1`) is part of a word the run's characters do not
    cover, no id of its own."""
    for run in _ID_RUN.finditer(nfkc):
        start, end = run.span()
        if (start and _in_a_word(nfkc[start - 1])) or (end < len(nfkc) and _in_a_word(nfkc[end])):
            continue
        yield run.group(0)


# scripts written without spaces between words (Chinese, Japanese, Korean particles, Thai, Lao, Khmer, Myanmar): an
# id written against them is a word of its own, as `订单OD99990001` or `P1의` write it
_UNSPACED = re.compile(rf"{_HAN}|{_SPACELESS}")


def _in_a_word(char: str) -> bool:
    """Whether `char` next to a run of id characters makes the run part of its word: a letter, digit or word mark
    (`_word_mark`) of a script written with spaces between words."""
    if _UNSPACED.match(char):
        return False
    return unicodedata.category(char)[0] in "LN" or _word_mark(ord(char))


def _id_tokens(text: str) -> list[str]:
    """Id-shaped tokens, namespaced ones first; runs longer than MAX_ID_CHARS are not ids and are not scanned.

    Scanning run by run is what the two regexes do on the whole text (their look-arounds see a non-id character
    or an end either way), but a start inside a long run can then rescan at most MAX_ID_CHARS characters.
    """
    spaced: list[str] = []
    codes: list[str] = []
    for r in _id_runs(unicodedata.normalize("NFKC", text)):
        if len(r) > MAX_ID_CHARS:
            continue
        if ":" in r:
            spaced += [m.group(0) for m in _NAMESPACED.finditer(r)]
            r = _NAMESPACED.sub(" ", r)
        codes += [m.group(0) for m in _CODE.finditer(r)]
    return [normalize_entity(t) for t in spaced + codes]


def _date_positions(seq: list[str], dates: Sequence[DateCue]) -> set[int]:
    """The places in `seq` of each date cue's own words: wherever its units stand together (`march` of "march in
    March 2023" is the second one, `月` of "月饼 in 2023年5月" the last)."""
    taken: set[int] = set()
    for date in dates:
        words = units(date.words)
        for i in range(len(seq) - len(words) + 1):
            place = range(i, i + len(words))
            if seq[i : i + len(words)] == words and taken.isdisjoint(place):
                taken.update(place)  # every place the date is written: "in June ... in June" is one cue, twice
    return taken


def _bounded_words(words: list[str], limit: int) -> list[str]:
    """At most `limit` items: a longer list loses its repeats first, then its tail (short queries are untouched)."""
    if len(words) <= limit:
        return words
    return list(dict.fromkeys(words))[:limit]


def extract(query: str, vocab: Vocabulary, now: datetime) -> Cues:
    """Cues of one query against one tenant's vocabulary; `now` anchors the time words.

    Linear in the query's length (every table lookup goes through a prefix index, id tokens are deduplicated),
    and the result is bounded (MAX_ENTITIES, MAX_KEYS, MAX_TERMS, MAX_TEXT_WORDS), so the search it drives is too.
    """
    norm = normalize_text(query)
    raw = _UNIT.findall(norm)  # as written; `seq` is the same list in lookup form (singular)
    seq = [_singular(u) for u in raw]
    covered = [False] * len(seq)

    def cover(spans: Iterable[tuple[int, int, str]]) -> None:
        for i, j, _ in spans:
            for k in range(i, j):
                covered[k] = True

    # entities: id-shaped tokens plus ids the tenant knows (longest span wins)
    known: dict[str, None] = {}
    known_ids: set[str] = set()  # every subject_ids() of a known entity: an id token that is one adds nothing

    def know(entity: str) -> None:
        if entity not in known:
            known[entity] = None
            known_ids.update(subject_ids(entity))

    tokens = list(dict.fromkeys(_id_tokens(query)))  # "P1 P1 P1 ...": one token, every occurrence covered

    def is_known(entity: str) -> bool:
        return entity in vocab.entities.get(canonical(entity), ())

    def candidates(token: str) -> list[str]:
        # a namespaced id known whole names itself, not also the bare id inside it (`usr:carol.jones9` is not
        # `team:carol.jones9`); `project:P1` known only by its bare id `P1` is still found by it
        ids = subject_ids(token)
        return ids[:1] if is_known(ids[0]) else ids

    # an id the question spells out names itself, not every id its words read as: `user:alice.smith` is not
    # `user:Alice-Smith`, though a question saying "alice smith" names both. Any run of id characters can spell
    # one (`carol.jones9` is no id-shaped token, yet a known id as written)
    runs = (r.strip(".:-_") for r in _id_runs(unicodedata.normalize("NFKC", query)))
    spelled: dict[str, dict[str, None]] = {}
    marked: set[str] = set()  # of those, the ids written with more than letters (`item:weight`, `P1`), not as words
    for written in [*tokens, *(normalize_entity(r) for r in runs if r and len(r) <= MAX_ID_CHARS)]:
        for cand in candidates(written):
            if is_known(cand):
                spelled.setdefault(canonical(cand), {})[cand] = None
                if not written.isalpha():
                    marked.add(canonical(cand))

    def named(phrase: str) -> Iterable[str]:
        return spelled[phrase] if phrase in spelled else vocab.entities.get(phrase, ())

    # an id's words inside an alias the question uses (`weight` of `item:weight` in "what is the weight", `backend`
    # of `project:backend` in "the backend port of P1") are that alias, the attribute asked about, not an entity: as
    # both, the question was narrowed to that entity and missed the attribute everyone else has. An id written out
    # with its marks (`item:weight`) still names itself
    alias_spans = _spans(seq, vocab.aliases, heads=vocab.alias_heads)
    token_table = {c: True for c in map(canonical, tokens) if c}
    token_spans = _spans(seq, token_table)
    # and an id the question writes out names itself, not the known id its first words spell: a namespaced one
    # (`team:a/zzz` and `user:alice-smith` are ids of their own, unknown: nothing exact, not `team:a` and
    # `user:alice`), and one known as written (`p7-beta/2` is not also `p7-beta`). An unknown bare code is left
    # alone: `P1-P2`, `P1-related` and `Q3-2024` name P1 and Q3 as often as a code of their own
    whole = {canonical(t): True for t in tokens if ":" in t} | dict.fromkeys(marked, True)
    reach_before = [-1] * (len(seq) + 1)  # the furthest end of such an id starting before each place
    longest_at: dict[int, int] = {}  # the furthest end of one starting there
    for a, b, _ in _spans(seq, whole):
        reach_before[a + 1] = max(reach_before[a + 1], b)
        longest_at[a] = max(longest_at.get(a, -1), b)
    for k in range(1, len(reach_before)):
        reach_before[k] = max(reach_before[k], reach_before[k - 1])

    def inside_an_id(i: int, j: int) -> bool:  # strictly inside one: linear in the query, whatever it repeats
        return reach_before[i] >= j or longest_at.get(i, -1) > j

    ent_spans = [  # of stop words only, a span names its ids only as the whole question (`_names_a_cue`)
        (i, j, phrase)
        for i, j, phrase in _spans(seq, vocab.entities, heads=vocab.entity_heads)
        if (_names_a_cue(phrase) or (i, j) == (0, len(seq)))
        and (phrase in marked or not any(a <= i and j <= b for a, b, _ in alias_spans))
        and not inside_an_id(i, j)
    ]
    cover(ent_spans)
    for _, _, phrase in ent_spans:
        for e in named(phrase):
            know(e)
    cover(token_spans)
    # and the other way round: an alias's words inside an id the question writes out (`drink` of `p6x:drink`, of
    # `order:drink9`) are part of that name, not the attribute asked about (an alias that is the whole id-shaped
    # token, a product code, is that alias)
    written = [(i, j) for i, j, phrase in ent_spans if phrase in marked] + [(i, j) for i, j, _ in token_spans]
    in_ids = {k for i, j in written for k in range(i, j)}
    alias_spans = [
        (a, b, p) for a, b, p in alias_spans if not any(i <= a and b <= j and (a, b) != (i, j) for i, j in written)
    ]
    unknown: dict[str, None] = {}
    standing = {phrase for i, j, phrase in token_spans if not inside_an_id(i, j)}  # written somewhere on their own
    placed = {phrase for *_, phrase in token_spans}
    for tok in tokens:
        if canonical(tok) in placed and canonical(tok) not in standing:
            continue  # only ever part of a longer id the question writes out (`p7-beta` of `p7-beta/2`)
        for cand in candidates(tok):  # `project:P1` is known as such or by its bare id
            for e in named(canonical(cand)):
                know(e)
        if tok not in known_ids:
            unknown.setdefault(tok)

    # attribute keys through aliases (longest phrase wins over the shorter ones inside it)
    cover(alias_spans)
    found = [(frozenset(range(i, j)), phrase) for i, j, phrase in alias_spans]
    found += [m for m in _word_set_matches(seq, vocab, {p for _, _, p in alias_spans}) if not m[0] <= in_ids]
    for positions, _ in found:
        cover((k, k + 1, "") for k in positions)
    found = _maximal(found)
    phrases = _bounded_words([phrase for _, phrase in sorted(found, key=lambda f: (min(f[0]), f[1]))], MAX_KEYS)
    matches = [(phrase, tuple(sorted(vocab.aliases[phrase]))) for phrase in phrases]
    keys = dict.fromkeys(k for _, ks in matches for k in ks)
    # an id-shaped token the tenant knows as an alias (`SKU0AC47`) is that alias, not a new entity besides: as
    # both, it would ask for a fact about an entity of that name under the alias's key, which the fact is not
    explained = {phrase for phrase, _ in matches}
    entities = list(dict.fromkeys([*known, *(t for t in unknown if canonical(t) not in explained)]))[:MAX_ENTITIES]
    known_list = list(known)[:MAX_ENTITIES]

    scope_spans = _spans(seq, vocab.scopes, 6, vocab.scope_heads) if vocab.scopes else []
    cover(scope_spans)  # explained (not terms), still words BM25 sees, like an entity's or an alias's
    scopes = tuple(dict.fromkeys(vocab.scopes[p] for _, _, p in scope_spans))

    time, time_spans = _time_range(norm, seq, now)
    cover(time_spans)
    ev_spans = _spans(seq, _EVENT_SPANS, 4, _EVENT_HEADS)
    cover(ev_spans)
    event_types = sorted({_EVENT_SPANS[p] for _, _, p in ev_spans})

    timed = [False] * len(seq)  # time words are a filter, not text to match
    for i, j, _ in time_spans:
        timed[i:j] = [True] * (j - i)
    keep = [u not in _STOP_UNITS and not t for u, t in zip(seq, timed, strict=True)]
    content = [u for u, k in zip(seq, keep, strict=True) if k]
    dates = find_dates(norm)
    dated = _date_positions(seq, dates)  # a calendar date's words are its cue, not unexplained terms
    terms = [
        u
        for k, (u, c) in enumerate(zip(seq, covered, strict=True))
        if not c and u not in _STOP_UNITS and u not in vocab.namespaces and not u.isdigit() and k not in dated
    ]
    text = [u for u, k in zip(raw, keep, strict=True) if k]
    return Cues(
        entities=tuple(entities),
        known_entities=tuple(known_list),
        keys=tuple(sorted(list(keys)[:MAX_KEYS])),
        alias_matches=tuple(matches),
        event_types=tuple(event_types),
        time=time,
        terms=tuple(_bounded_words(terms, MAX_TERMS)),
        text=" ".join(_bounded_words(text, MAX_TEXT_WORDS)),
        content_units=tuple(content),
        scopes=scopes,
        dates=dates,
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
