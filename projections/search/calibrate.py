"""Measure the semantic cut-offs of recall on the configured model: `python -m projections.search.calibrate`.

Embeds a fixed bilingual set of facts (the same embedding text the indexer builds) and three
sets of questions: RELATED (each names the fact that answers it), UNRELATED (nothing answers
them), and SAME_ENTITY (about an entity we know, asking something we do not know). Prints
the cosine distributions, the self-retrieval rate at top 1, and what each threshold would let
through. No server is needed: ES cosine on normalized vectors is the same dot product.

Measured on bge-small-zh-v1.5 (2 cores, 2026-11-30), raw queries (no instruction prefix; with the bge
instruction prefix related scores dropped more than unrelated ones):
  model BAAI/bge-small-zh-v1.5: 24 facts, 48 related, 40 unrelated queries
  related  right-fact cosine: min 0.473 p10 0.557 median 0.658 max 0.873; top-1 right 45/48
  unrelated best cosine:      min 0.295 median 0.450 p90 0.568 max 0.625
  same entity, unanswerable:  median 0.601 max 0.668
    cut-off 0.50: related kept 46/48, unrelated let through 16/40
    cut-off 0.55: related kept 43/48, unrelated let through 6/40
    cut-off 0.58: related kept 39/48, unrelated let through 3/40
    cut-off 0.60: related kept 38/48, unrelated let through 2/40
    cut-off 0.62: related kept 33/48, unrelated let through 1/40
    cut-off 0.63: related kept 30/48, unrelated let through 0/40
    cut-off 0.65: related kept 26/48, unrelated let through 0/40
  rule (alone >= SEMANTIC_MIN, or distinct): related right top-1 kept 35/48, unrelated let through 0/40,
    same-entity let through 2/8
  narrowed by entity: related right [0.492, 0.506, 0.566, 0.574, 0.596, 0.633, 0.642, 0.645, 0.652, 0.657, 0.67,
    0.671, 0.677, 0.693, 0.727, 0.743, 0.777, 0.794, 0.808, 0.81, 0.873]
  narrowed by entity: unanswerable best [0.316, 0.319, 0.404, 0.48, 0.512, 0.604, 0.621]
The thresholds chosen from these numbers, and why, are in projections/search/recall/fusion.py.
"""

from __future__ import annotations

import numpy as np

from producers.settings import get_settings
from projections.embedding import load_embedder
from projections.search.cues import embedding_text

# key: (content, key, aliases)
FACTS = {
    "p1_port": ("P1 的后端服务端口是 8080", "project.backend_port", ["端口", "后端服务地址", "backend port"]),
    "p1_host": ("P1 部署在 10.0.0.5 这台机器上", "project.deploy_host", ["部署机器", "deploy host"]),
    "p1_db": (
        "The staging database of P1 is PostgreSQL on db-staging:5432",
        "project.staging_db",
        ["staging database"],
    ),
    "p1_owner": ("P1 的负责人是王磊", "project.owner", ["负责人", "owner"]),
    "seat": ("用户 42 喜欢靠窗的座位", "preference.seat", ["座位偏好", "seat preference"]),
    "style": ("用户 42 希望回答简洁，不要太长", "preference.answer_style", ["回答风格"]),
    "drink": ("Alice prefers green tea in the morning", "preference.drink", ["饮料", "drink"]),
    "refund": ("订单 OD20241102 已退款", "order.status", ["订单状态", "order status"]),
    "party": ("公司年会在 12 月 20 日举行", "company.annual_party", ["年会"]),
    "expense": ("报销需要在 30 天内提交", "policy.expense_deadline", ["报销期限"]),
    "vpn": ("公司 VPN 地址是 vpn.acme.example", "it.vpn_address", ["VPN"]),
    "team": ("Bob works on the payments team", "profile.team", ["team"]),
    "lang": ("用户 42 的母语是粤语", "profile.language", ["母语", "native language"]),
    "allergy": ("Carol is allergic to peanuts", "health.allergy", ["过敏", "allergy"]),
    "city": ("用户 42 住在杭州", "profile.city", ["城市", "city"]),
    "editor": ("Dave uses Neovim as his editor", "preference.editor", ["编辑器", "editor"]),
    "oncall": ("本周的值班工程师是李娜", "team.oncall", ["值班", "on-call"]),
    "release": ("P2 计划在 12 月 1 日发布 2.0 版本", "project.release_date", ["发布日期", "release date"]),
    "budget": ("The marketing budget for Q4 is 200k USD", "finance.budget_q4", ["预算", "budget"]),
    "wifi": ("办公室 Wi-Fi 密码是 acme2026", "it.wifi_password", ["wifi 密码", "wifi password"]),
    "meeting": ("每周一上午十点开周会", "team.weekly_meeting", ["周会", "weekly meeting"]),
    "birthday": ("Erin's birthday is on March 3", "profile.birthday", ["生日", "birthday"]),
    "tz": ("用户 42 的时区是 UTC+8", "profile.timezone", ["时区", "timezone"]),
    "pet": ("Frank has a golden retriever named Max", "profile.pet", ["宠物", "pet"]),
}
RELATED = [
    ("P1 的后端服务端口是多少", "p1_port"), ("what port does the P1 backend listen on", "p1_port"),
    ("P1 服务部署在哪台服务器", "p1_host"), ("which machine is P1 deployed on", "p1_host"),
    ("P1 的测试数据库在哪", "p1_db"), ("where is the staging database", "p1_db"),
    ("P1 谁负责", "p1_owner"), ("who owns project P1", "p1_owner"),
    ("用户喜欢坐哪里", "seat"), ("does the user prefer a window or aisle seat", "seat"),
    ("回答应该写多长", "style"), ("how long should answers be", "style"),
    ("Alice 早上喝什么", "drink"), ("what does Alice drink in the morning", "drink"),
    ("那个订单退款了吗", "refund"), ("was the order refunded", "refund"),
    ("年会是哪天", "party"), ("when is the company annual party", "party"),
    ("报销要在多久内提交", "expense"), ("what is the deadline for expense reports", "expense"),
    ("VPN 怎么连", "vpn"), ("what is the VPN address", "vpn"),
    ("Bob 在哪个团队", "team"), ("which team is Bob on", "team"),
    ("用户说什么语言", "lang"), ("what is the user's native language", "lang"),
    ("Carol 对什么过敏", "allergy"), ("what is Carol allergic to", "allergy"),
    ("用户住在哪个城市", "city"), ("where does the user live", "city"),
    ("Dave 用什么编辑器", "editor"), ("which editor does Dave use", "editor"),
    ("这周谁值班", "oncall"), ("who is on call this week", "oncall"),
    ("P2 什么时候发布", "release"), ("when will P2 2.0 be released", "release"),
    ("第四季度市场预算多少", "budget"), ("how big is the Q4 marketing budget", "budget"),
    ("办公室 wifi 密码", "wifi"), ("what's the office wifi password", "wifi"),
    ("周会是什么时候", "meeting"), ("when is the weekly team meeting", "meeting"),
    ("Erin 生日是哪天", "birthday"), ("when is Erin's birthday", "birthday"),
    ("用户在哪个时区", "tz"), ("what timezone is the user in", "tz"),
    ("Frank 养了什么狗", "pet"), ("what kind of dog does Frank have", "pet"),
]  # fmt: skip
UNRELATED = [
    "今天天气怎么样", "what is the capital of France", "如何做红烧肉", "股票明天会涨吗",
    "quantum chromodynamics lecture notes", "my cat is sleeping on the sofa", "推荐一部科幻电影",
    "how do I bake sourdough bread", "世界上最高的山是哪座", "who won the world cup in 2018",
    "怎么学好英语", "explain the theory of relativity", "明天去爬山要带什么", "best hiking trails in Colorado",
    "光合作用的原理", "how to change a flat tire", "北京烤鸭哪家好吃", "what is the square root of 144",
    "如何缓解焦虑", "translate hello into Spanish", "宇宙有多大", "how do vaccines work",
    "孔子是哪个朝代的人", "what is a black hole", "围棋的规则是什么", "recommend a good novel",
    "怎么养多肉植物", "how to write a cover letter", "马拉松要跑多远", "why is the sky blue",
    "手机没电了怎么办", "how many legs does a spider have", "长城有多长", "what is machine learning",
    "如何冲一杯好咖啡", "tips for better sleep", "地球离太阳多远", "how to tie a tie",
    "火锅底料怎么炒", "what time is it in Tokyo",
]  # fmt: skip
SAME_ENTITY = [
    "P1 用的是什么编程语言", "what license does P1 use", "Alice 住在哪里", "Bob 的邮箱是什么",
    "订单 OD20241102 的收货地址", "用户 42 的生日", "Carol 的电话号码", "Dave works where",
]  # fmt: skip

# the entity each fact is about (as the events would name it); questions naming one are narrowed to its facts
ENTITY = {
    "p1_port": "P1", "p1_host": "P1", "p1_db": "P1", "p1_owner": "P1", "drink": "Alice", "refund": "OD20241102",
    "team": "Bob", "allergy": "Carol", "editor": "Dave", "release": "P2", "birthday": "Erin", "pet": "Frank",
}  # fmt: skip


def _narrowed(query: str, names: list[str]) -> list[int] | None:
    """Indices of the facts of the entity the question names (None: it names none)."""
    for ent in dict.fromkeys(ENTITY.values()):
        if ent.lower() in query.lower():
            return [i for i, n in enumerate(names) if ENTITY.get(n) == ent]
    return None


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


def main() -> None:
    emb = load_embedder(get_settings())
    names = list(FACTS)
    docs = emb.embed([embedding_text(c, k, a) for c, k, a in FACTS.values()])
    rel = emb.embed([q for q, _ in RELATED]) @ docs.T
    unrel = emb.embed(UNRELATED) @ docs.T
    same = emb.embed(SAME_ENTITY) @ docs.T
    right = [float(rel[i, names.index(f)]) for i, (_, f) in enumerate(RELATED)]
    top1 = sum(int(np.argmax(rel[i])) == names.index(f) for i, (_, f) in enumerate(RELATED))
    best_unrel = unrel.max(axis=1).tolist()
    best_same = same.max(axis=1).tolist()
    print(f"model {emb.name}: {len(FACTS)} facts, {len(RELATED)} related, {len(UNRELATED)} unrelated queries")
    print(
        f"related  right-fact cosine: min {min(right):.3f} p10 {_pct(right, 10):.3f} "
        f"median {_pct(right, 50):.3f} max {max(right):.3f}; top-1 right {top1}/{len(RELATED)}"
    )
    print(
        f"unrelated best cosine:      min {min(best_unrel):.3f} median {_pct(best_unrel, 50):.3f} "
        f"p90 {_pct(best_unrel, 90):.3f} max {max(best_unrel):.3f}"
    )
    print(f"same entity, unanswerable:  median {_pct(best_same, 50):.3f} max {max(best_same):.3f}")
    for t in (0.50, 0.55, 0.58, 0.60, 0.62, 0.63, 0.65):
        print(
            f"  cut-off {t:.2f}: related kept {sum(r >= t for r in right)}/{len(right)}, "
            f"unrelated let through {sum(u >= t for u in best_unrel)}/{len(best_unrel)}"
        )
    # the rule recall applies to a semantic hit without support: alone, or distinct from the background
    from projections.search.recall.fusion import semantic_passes

    def kept(rows: np.ndarray, want: list[int] | None) -> int:
        n = 0
        for i, row in enumerate(rows):
            ranked = sorted(row.tolist(), reverse=True)[:10]
            j = int(np.argmax(row)) if want is None else want[i]
            n += semantic_passes(float(row[j]), ranked) and (want is None or j == np.argmax(row))
        return n

    want = [names.index(f) for _, f in RELATED]
    print(
        f"rule (alone >= SEMANTIC_MIN, or distinct): related right top-1 kept {kept(rel, want)}/{len(RELATED)}, "
        f"unrelated let through {kept(unrel, None)}/{len(UNRELATED)}, "
        f"same-entity let through {kept(same, None)}/{len(SAME_ENTITY)}"
    )
    # narrowed to the named entity's facts: the right fact's cosine vs the best of an unanswerable question
    rel_n = [float(rel[i, names.index(f)]) for i, (q, f) in enumerate(RELATED) if _narrowed(q, names)]
    same_n = [float(same[i, idx].max()) for i, q in enumerate(SAME_ENTITY) if (idx := _narrowed(q, names))]
    print(f"narrowed by entity: related right {sorted(round(x, 3) for x in rel_n)}")
    print(f"narrowed by entity: unanswerable best {sorted(round(x, 3) for x in same_n)}")


if __name__ == "__main__":
    main()
