"""English stems for the keyword stage, computed here because the search server has no stemmer.

The Elasticsearch build the project runs ships no analysis-common module: `_analyze` knows no `stemmer`,
`porter_stem`, `kstem` or `english` (checked against the integration server). So the write side indexes
`content_stem`, the content's Latin-script words as Snowball (Porter 2) English stems joined by spaces, under
the core `whitespace` analyzer, and the read side stems the query's words the same way (`stems`): "hiked" and
"hiking" both become `hike`, "paintings" `paint`. Han text yields no stems, and a query with Han text asks no
stems (`query_stems`): the `cjk_bigram` fields keep serving Chinese. The stemmer is py_rust_stemmers
(Snowball in Rust, no data files; fastembed already depends on it, pyproject pins it for this use).
"""

from __future__ import annotations

import re
from functools import lru_cache

from py_rust_stemmers import SnowballStemmer

from projections.search.cues import normalize_text

__all__ = ["STEM_FIELD", "query_stems", "stem_text", "stems"]

STEM_FIELD = "content_stem"

# Latin-script words and numbers of the NFKC-casefolded text; a possessive or contraction tail is dropped
_WORD = re.compile(r"[0-9a-z\u00df-\u024f]+(?:['\u2019][a-z]+)?")
_TAIL = re.compile(r"['\u2019][a-z]+$")
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_STEMMER = SnowballStemmer("english")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _STEMMER.stem_word(word)


def stems(text: str | None) -> list[str]:
    """The English stems of `text`'s Latin-script words, in order (repeats kept: BM25 counts them)."""
    if not text:
        return []
    return [_stem(_TAIL.sub("", w)) for w in _WORD.findall(normalize_text(text))]


def query_stems(text: str | None) -> str:
    """The read side: the stems of a query's words, or "" for a query with Han text, which the keyword stage asks
    by its bigram clause alone, so that a Chinese question is not widened by the ids and words it quotes."""
    return "" if not text or _HAN.search(text) else " ".join(stems(text))


def stem_text(text: str | None) -> str | None:
    """The `content_stem` value of a document: its stems joined by spaces, or None when it has none."""
    out = stems(text)
    return " ".join(out) if out else None
