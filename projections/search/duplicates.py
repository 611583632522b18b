"""Near-duplicate episodes: an episode that repeats one already stored is linked to it, never deleted.

When the embedder stores an episode's vectors it compares it with the nearest episodes of the same tenant and
subject (kNN, and the others of its batch): a duplicate needs both cosine >= COSINE_MIN and token-set Jaccard >=
TEXT_MIN, so a turn merely close in meaning or in words stays an episode of its own; the same subject is
required, as two speakers saying "Thanks!" are two episodes. A group is named by its first episode; recall keeps
the best hit per group. Two copies embedded at the same moment by two embedders do not see each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from elasticsearch import Elasticsearch

from projections.search.vectors import Vectors

__all__ = ["COSINE_MIN", "GROUP_COLUMN", "TEXT_MIN", "Link", "find_links", "store_links", "text_similarity"]

COSINE_MIN = 0.95
TEXT_MIN = 0.8
NEIGHBOURS = 3  # nearest episodes asked per new episode

GROUP_COLUMN = "(SELECT l.group_id FROM episode_links l WHERE l.version_id = f.version_id) AS episode_group"

_TOKEN = re.compile(r"[a-z0-9]+|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Link:
    version_id: str
    tenant: str
    group_id: str
    cosine: float
    text_similarity: float


def text_similarity(a: str, b: str) -> float:
    """Token-set Jaccard similarity of two texts (1.0: the same words)."""
    ta, tb = set(_TOKEN.findall(a.lower())), set(_TOKEN.findall(b.lower()))
    if not ta and not tb:
        return 1.0 if a.strip() == b.strip() else 0.0
    return len(ta & tb) / len(ta | tb)


def is_duplicate(cosine: float, text_sim: float) -> bool:
    return cosine >= COSINE_MIN and text_sim >= TEXT_MIN


def _knn(row: dict[str, Any], field: str, model: str, vector: list[float]) -> dict[str, Any]:
    return {
        "size": NEIGHBOURS,
        "_source": ["version_id", "content", "episode_group"],
        "knn": {
            "field": field,
            "query_vector": vector,
            "k": NEIGHBOURS,
            "num_candidates": 10 * NEIGHBOURS,
            "filter": {
                "bool": {
                    "filter": [
                        {"term": {"tenant": row["tenant"]}},
                        {"term": {"subject": row["subject"]}},
                        {"term": {"kind": "episodic"}},
                        {"term": {"embed_model": model}},
                    ],
                    "must_not": [{"ids": {"values": [row["version_id"]]}}],
                }
            },
        },
    }


def find_links(es: Elasticsearch, index: str, episodes: Sequence[tuple[dict[str, Any], Vectors]]) -> list[Link]:
    """The links of `episodes` ((row, its vectors), in claim order) to episodes stored before or earlier in the
    batch; an episode with no duplicate gets none."""
    episodes = [(row, vecs) for row, vecs in episodes if vecs and row.get("kind") == "episodic"]
    if not episodes:
        return []
    body: list[dict[str, Any]] = []
    for row, vecs in episodes:
        field, model, vector = vecs[0]  # its own language's vector
        body += [{"index": index}, _knn(row, field, model, vector)]
    responses = es.msearch(searches=body)["responses"]
    links: dict[str, Link] = {}
    for (row, _), resp in zip(episodes, responses, strict=True):
        best: Link | None = None
        for hit in (resp.get("hits") or {}).get("hits", []):
            cosine = 2.0 * float(hit["_score"]) - 1.0  # Elasticsearch's cosine score is (1 + cos) / 2
            sim = text_similarity(row["content"], hit["_source"].get("content") or "")
            if is_duplicate(cosine, sim) and (best is None or cosine > best.cosine):
                group = hit["_source"].get("episode_group") or hit["_id"]
                best = Link(row["version_id"], row["tenant"], group, round(cosine, 4), round(sim, 4))
        if best is not None:
            links[row["version_id"]] = best
    # inside the batch: a later episode (by its time) repeats an earlier one of the same tenant and subject
    episodes = sorted(episodes, key=lambda e: (str(e[0].get("observed_at") or ""), e[0]["version_id"]))
    for j, (row, vecs) in enumerate(episodes):
        if row["version_id"] in links:
            continue
        mine = np.asarray(vecs[0][2])
        for earlier, evecs in episodes[:j]:
            if (earlier["tenant"], earlier["subject"]) != (row["tenant"], row["subject"]) or evecs[0][:2] != vecs[0][
                :2
            ]:
                continue
            cosine = float(mine @ np.asarray(evecs[0][2]))
            sim = text_similarity(row["content"], earlier["content"])
            if is_duplicate(cosine, sim):
                group = (
                    links[earlier["version_id"]].group_id if earlier["version_id"] in links else earlier["version_id"]
                )
                links[row["version_id"]] = Link(
                    row["version_id"], row["tenant"], group, round(cosine, 4), round(sim, 4)
                )
                break
    return list(links.values())


def store_links(cur: Any, links: Sequence[Link]) -> int:
    """Write the links (a version linked again keeps its first group); how many are new."""
    if not links:
        return 0
    cur.execute(
        "INSERT INTO episode_links (version_id, tenant, group_id, cosine, text_similarity) "
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::real[], %s::real[]) "
        "ON CONFLICT (version_id) DO NOTHING",
        (
            [x.version_id for x in links],
            [x.tenant for x in links],
            [x.group_id for x in links],
            [x.cosine for x in links],
            [x.text_similarity for x in links],
        ),
    )
    return cur.rowcount
