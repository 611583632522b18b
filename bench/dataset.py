"""A realistic, bilingual, reproducible stream of memory events for benchmarks and evaluation.

`generate(n_events, n_subjects, seed)` yields contract-valid event dicts in publish
order: first assertions for each subject, then a mix of updates, late events (an older
valid_from arriving after a newer one), temporary preference overrides (bounded
valid_to), retractions, confirmations and episodic memories. Every fact also carries
questions that should find it (paraphrases in Chinese and English), so evaluation
knows the right answer without a labelled set.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from producers.contract import rfc3339

__all__ = ["ATTRIBUTES", "Attribute", "generate", "unanswerable_questions"]

CITIES = [
    ("北京", "Beijing"),
    ("上海", "Shanghai"),
    ("深圳", "Shenzhen"),
    ("杭州", "Hangzhou"),
    ("成都", "Chengdu"),
    ("Berlin", "Berlin"),
    ("伦敦", "London"),
    ("东京", "Tokyo"),
]
DRINKS = [("咖啡", "coffee"), ("绿茶", "green tea"), ("乌龙茶", "oolong tea"), ("热巧克力", "hot chocolate")]
SEATS = [("靠窗", "window"), ("过道", "aisle")]
STYLES = [("简洁", "concise"), ("详细", "detailed")]
LANGS = [("中文", "Chinese"), ("英文", "English"), ("日文", "Japanese")]
STACKS = ["Go + PostgreSQL", "Java + Kafka", "Python + FastAPI", "Rust + Tokio", "Node.js + Redis"]
NAMES = ["张伟", "王芳", "李娜", "刘洋", "Alice", "Bob", "Carol", "Dmitri"]
STATUSES = [("已发货", "shipped"), ("已退款", "refunded"), ("待支付", "awaiting payment"), ("已签收", "delivered")]
HOSTS = ["db-01.internal", "db-02.internal", "pg-main.prod", "10.0.3.17", "mysql-7.stage"]


@dataclass(frozen=True)
class Attribute:
    """One kind of fact: its key, how people call it, how it is stated and asked."""

    key: str
    subject_kind: str  # project | user | order
    kind: str
    aliases: tuple[str, ...]
    value: Callable[[random.Random], tuple[object, str, str]]  # -> (value, zh text, en text)
    state_zh: str
    state_en: str
    ask: tuple[str, ...]  # question templates ({E} = entity), Chinese and English


def _port(r: random.Random):
    p = r.randint(1025, 65000)
    return p, str(p), str(p)


def _pick(options):
    def f(r: random.Random):
        zh, en = r.choice(options)
        return en, zh, en

    return f


def _plain(options):
    def f(r: random.Random):
        v = r.choice(options)
        return v, v, v

    return f


def _date(r: random.Random):
    d = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=r.randint(0, 700))
    s = d.date().isoformat()
    return s, s, s


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute(
        "project.port",
        "project",
        "state",
        ("后端服务端口", "后端端口", "端口", "服务地址", "backend port", "port"),
        _port,
        "项目 {E} 的后端服务端口是 {zh}",
        "The backend service of project {E} listens on port {en}",
        (
            "{E} 的后端服务端口是多少",
            "{E} 后端端口",
            "what port does the {E} backend use",
            "backend port of project {E}",
        ),
    ),
    Attribute(
        "project.db_host",
        "project",
        "state",
        ("数据库地址", "数据库", "database host", "db host"),
        _plain(HOSTS),
        "项目 {E} 的数据库部署在 {zh}",
        "Project {E}'s database runs on {en}",
        ("{E} 的数据库在哪台机器", "where is the database of {E} hosted"),
    ),
    Attribute(
        "project.tech_stack",
        "project",
        "state",
        ("技术栈", "tech stack", "technology"),
        _plain(STACKS),
        "项目 {E} 使用的技术栈是 {zh}",
        "Project {E} is built with {en}",
        ("{E} 用什么技术栈", "what tech stack does {E} use"),
    ),
    Attribute(
        "project.owner",
        "project",
        "state",
        ("负责人", "owner", "project lead"),
        _plain(NAMES),
        "项目 {E} 的负责人是 {zh}",
        "The owner of project {E} is {en}",
        ("{E} 的负责人是谁", "who owns project {E}"),
    ),
    Attribute(
        "project.deadline",
        "project",
        "event",
        ("截止日期", "上线时间", "deadline", "launch date"),
        _date,
        "项目 {E} 的上线截止日期是 {zh}",
        "Project {E} must launch by {en}",
        ("{E} 什么时候上线", "when is the deadline of {E}"),
    ),
    Attribute(
        "preference.seat",
        "user",
        "preference",
        ("座位偏好", "座位", "seat preference", "seat"),
        _pick(SEATS),
        "用户 {E} 坐飞机喜欢{zh}的座位",
        "User {E} prefers {en} seats on flights",
        ("{E} 喜欢什么座位", "does {E} like window or aisle seats"),
    ),
    Attribute(
        "preference.drink",
        "user",
        "preference",
        ("饮品", "喝什么", "drink", "beverage"),
        _pick(DRINKS),
        "用户 {E} 喜欢喝{zh}",
        "User {E} likes to drink {en}",
        ("{E} 喜欢喝什么", "what does {E} like to drink"),
    ),
    Attribute(
        "preference.answer_style",
        "user",
        "preference",
        ("回答风格", "回复风格", "answer style", "tone"),
        _pick(STYLES),
        "用户 {E} 喜欢{zh}的回答",
        "User {E} prefers {en} answers",
        ("{E} 喜欢什么样的回答", "how should answers to {E} be written"),
    ),
    Attribute(
        "user.city",
        "user",
        "state",
        ("所在城市", "住在哪", "city", "lives in"),
        _pick(CITIES),
        "用户 {E} 住在{zh}",
        "User {E} lives in {en}",
        ("{E} 住在哪个城市", "which city does {E} live in"),
    ),
    Attribute(
        "user.language",
        "user",
        "state",
        ("语言", "母语", "language"),
        _pick(LANGS),
        "用户 {E} 习惯用{zh}交流",
        "User {E} prefers to talk in {en}",
        ("{E} 用什么语言", "what language does {E} speak"),
    ),
    Attribute(
        "order.status",
        "order",
        "state",
        ("订单状态", "状态", "order status", "status"),
        _pick(STATUSES),
        "订单 {E} 的状态是{zh}",
        "Order {E} is {en}",
        ("{E} 的订单状态是什么", "what is the status of order {E}"),
    ),
)

EPISODES = [
    ("{E} 在 {d} 联系客服询问了退款进度", "{E} contacted support on {d} about a refund"),
    ("{E} 在 {d} 的会议上提到下个季度要换工作", "{E} mentioned on {d} they might change jobs next quarter"),
    ("{E} 在 {d} 抱怨了 App 的登录速度", "{E} complained on {d} about slow app logins"),
]


def _entity(kind: str, i: int) -> tuple[str, str]:
    """(subject, entity id) of subject number i of a kind."""
    if kind == "project":
        return f"project:P{i}", f"P{i}"
    if kind == "user":
        return f"user:{i}", f"U{i}"
    return f"order:OD2026{i:06d}", f"OD2026{i:06d}"


def _assert(tenant, subject, entity, attr: Attribute, r, observed: datetime, lang: str, **extra) -> dict:
    value, zh, en = attr.value(r)
    content = attr.state_zh.format(E=entity, zh=zh) if lang == "zh" else attr.state_en.format(E=entity, en=en)
    return {
        "event_id": uuid.UUID(int=r.getrandbits(128)).hex,
        "type": "memory.asserted",
        "tenant": tenant,
        "subject": subject,
        "key": attr.key,
        "value": value,
        "content": content,
        "kind": attr.kind,
        "entities": [entity],
        "aliases": list(attr.aliases),
        "source": {"type": r.choice(["explicit", "explicit", "inferred", "imported"]), "service": "bench"},
        "importance": round(r.random(), 2),
        "observed_at": rfc3339(observed),
        **extra,
    }


def _mark(type_: str, tenant: str, subject: str, attr: Attribute, r: random.Random, observed: datetime) -> dict:
    """A retraction or confirmation of a subject's attribute."""
    return {
        "event_id": uuid.UUID(int=r.getrandbits(128)).hex,
        "type": type_,
        "tenant": tenant,
        "subject": subject,
        "key": attr.key,
        "observed_at": rfc3339(observed),
    }


def generate(
    n_events: int = 100_000,
    n_subjects: int = 10_000,
    seed: int = 7,
    tenants: tuple[str, ...] = ("bench",),
    start: datetime | None = None,
) -> Iterator[dict]:
    """Yield n_events event dicts over n_subjects subjects, reproducibly for a seed."""
    r = random.Random(seed)
    t = start or datetime(2025, 1, 1, tzinfo=UTC)
    step = timedelta(seconds=37)
    kinds = ("project", "user", "order")
    subjects = []
    for i in range(n_subjects):
        kind = kinds[i % 3]
        subject, entity = _entity(kind, i)
        attrs = [a for a in ATTRIBUTES if a.subject_kind == kind]
        subjects.append((tenants[i % len(tenants)], subject, entity, attrs))
    emitted = 0
    # phase 1: one first assertion of each subject's first attribute
    for tenant, subject, entity, attrs in subjects:
        if emitted >= n_events:
            return
        t += step
        yield _assert(tenant, subject, entity, attrs[0], r, t, r.choice("zh en".split()))
        emitted += 1
    # phase 2: a realistic mix
    while emitted < n_events:
        tenant, subject, entity, attrs = subjects[r.randrange(len(subjects))]
        attr = r.choice(attrs)
        t += step
        roll = r.random()
        lang = r.choice(("zh", "en"))
        if roll < 0.60:  # new fact or update (supersedes)
            ev = _assert(tenant, subject, entity, attr, r, t, lang)
        elif roll < 0.68:  # late event: observed now, but about an older time
            ev = _assert(
                tenant, subject, entity, attr, r, t, lang, valid_from=rfc3339(t - timedelta(days=r.randint(30, 300)))
            )
        elif roll < 0.76 and attr.kind == "preference":  # temporary override ("this time ...")
            ev = _assert(
                tenant, subject, entity, attr, r, t, lang, valid_to=rfc3339(t + timedelta(hours=r.randint(1, 72)))
            )
        elif roll < 0.82:
            ev = {**_mark("memory.retracted", tenant, subject, attr, r, t), "reason": "no longer true"}
        elif roll < 0.88:
            ev = _mark("memory.confirmed", tenant, subject, attr, r, t)
        else:
            zh, en = r.choice(EPISODES)
            d = (t - timedelta(days=r.randint(0, 30))).date().isoformat()
            ev = {
                "event_id": uuid.UUID(int=r.getrandbits(128)).hex,
                "type": "memory.asserted",
                "tenant": tenant,
                "subject": subject,
                "kind": "episodic",
                "content": (zh if lang == "zh" else en).format(E=entity, d=d),
                "entities": [entity],
                "observed_at": rfc3339(t),
                "source": {"type": "inferred", "service": "bench"},
                "importance": round(r.random(), 2),
            }
        yield ev
        emitted += 1


def questions_for(key: str, entity: str) -> list[str]:
    """Paraphrases (Chinese and English) that all ask for one fact."""
    attr = next(a for a in ATTRIBUTES if a.key == key)
    return [q.format(E=entity) for q in attr.ask]


def unanswerable_questions(n: int = 50, seed: int = 11) -> list[str]:
    """Questions no stored memory answers: unknown entities, or topics nobody wrote about."""
    r = random.Random(seed)
    topics = [
        "今天中午吃什么",
        "明天会下雨吗",
        "how tall is Mount Everest",
        "推荐一部科幻电影",
        "what is the capital of Australia",
        "怎么做红烧肉",
        "who won the 1998 world cup",
        "how do I bake sourdough bread",
        "量子计算的原理是什么",
        "best hiking trails near the alps",
    ]
    out = list(topics)
    while len(out) < n:
        out.append(
            r.choice(
                [
                    "项目 ZX{0} 的预算是多少",
                    "what is the budget of project ZX{0}",
                    "订单 QQ{0} 的快递单号",
                    "tracking number of parcel QQ{0}",
                ]
            ).format(r.randint(1000, 9999))
        )
    return out[:n]
