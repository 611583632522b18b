"""Which embedding model embeds a text: English (Latin-script) text by `embed_model_en`, the rest by `embed_model`.

One model per language was chosen by measurement (BENCHMARKS.md, "Embedding models per language"): the Chinese
model is weak on English conversation, the English one knows no Chinese. The choice is a pure function of the
text, so a stored text and a question in the same language meet in the same vector space. Each model's vectors
live in their own dense_vector field (the models' dimensions differ, and a kNN search runs over one field), and
the document records the model's name in `embed_model`: a search asks only for vectors of the model it embedded
the question with, so a switched model never meets the old model's vectors (`ledger reindex` re-embeds).
"""

from __future__ import annotations

import re
from typing import Literal

from producers.settings import Settings

__all__ = [
    "DEFAULT_FIELD",
    "EN_FIELD",
    "Slot",
    "has_script",
    "model_of",
    "slot_field",
    "slots",
    "text_slot",
    "vector_plan",
]

Slot = Literal["default", "en"]
DEFAULT_FIELD = "embedding"  # embed_model's vectors (the field of every index before per-language models)
EN_FIELD = "embedding_en"  # embed_model_en's vectors

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u024f]+")


def text_slot(text: str) -> Slot:
    """`en` when the text is Latin-script words, `default` otherwise (Han text, or nothing to tell by).

    A Han character carries about a word: mixed text is Chinese when its Han characters are at least half as
    many as its Latin words ("项目 Q7 的后端服务端口是 8080" is Chinese; "deploy the new 后端 service to prod" English).
    Empty, digit-only or punctuation-only text goes to the default model.
    """
    han = len(_HAN.findall(text))
    words = len(_LATIN_WORD.findall(text))
    if words == 0 or 2 * han >= words:
        return "default"
    return "en"


def has_script(text: str) -> bool:
    """Whether the text has a Han character or a Latin word: without either (";)", "12:30") no model is its own."""
    return bool(_HAN.search(text) or _LATIN_WORD.search(text))


def model_of(settings: Settings, slot: Slot) -> str:
    return settings.embed_model_en if slot == "en" else settings.embed_model


def slot_field(settings: Settings, slot: Slot) -> str:
    """The vector field of a slot: one model configured for both languages writes only DEFAULT_FIELD."""
    return EN_FIELD if slot == "en" and settings.embed_model_en != settings.embed_model else DEFAULT_FIELD


def slots(settings: Settings) -> tuple[Slot, ...]:
    """The slots whose models differ (one model configured for both: just `default`)."""
    return ("default",) if settings.embed_model_en == settings.embed_model else ("default", "en")


def vector_plan(settings: Settings, text: str) -> list[tuple[str, str]]:
    """The (field, model) of every vector a stored text gets, English first: its own language's model and, with
    `embed_cross_language`, for English text (or text of no script, ";)") the other model too, so a question in
    either language reaches it. Pure: the indexer decides with it whether a document still lacks a vector, without
    loading a model, and the embedder embeds by it."""
    if len(slots(settings)) == 1:
        return [(DEFAULT_FIELD, settings.embed_model)]
    own = text_slot(text)
    chosen = {own}
    if settings.embed_cross_language and (own == "en" or not has_script(text)):
        chosen.add("default" if own == "en" else "en")
    return [(slot_field(settings, x), model_of(settings, x)) for x in ("en", "default") if x in chosen]
