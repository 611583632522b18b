"""Dense embeddings with fastembed, loaded offline from the model folder infra prepared.

The model names are configuration (`LEDGER_EMBED_MODEL`, and `LEDGER_EMBED_MODEL_EN` for English text,
projections.languages); fastembed either knows it
(we then give the file the name fastembed expects) or we register it as a custom
model from our spec. Vectors are L2-normalized, so cosine = dot product.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from producers.settings import Settings, get_settings
from projections.languages import DEFAULT_FIELD, vector_plan
from projections.models import ModelSpec, import_fastembed, model_folder, model_spec

__all__ = ["Embedder", "Embedders", "load_embedder"]

_lock = threading.Lock()
_cache: dict[tuple[str, str], Embedder] = {}


class Embedder:
    """A loaded model: `embed(texts) -> (n, dim)` float32 array, rows of unit length, each row its text's alone."""

    def __init__(self, spec: ModelSpec, model) -> None:
        self.spec, self._model = spec, model
        self.dim = spec.dim
        self.name = spec.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # One text per onnxruntime call, so a text's vector is a function of the text alone: the int8 models
        # quantize activations with one scale over the whole call (other texts and padding included), which moved
        # a text's vector with its batch, and so the index and recall with how the embedder's claims fell.
        # Unpadded, one text a call costs no more CPU than sorted batches of 16
        # (BENCHMARKS.md, "Dev set: each pair scored alone, and what the rerank costs", Determinism).
        vecs = np.asarray(list(self._model.embed(list(texts), batch_size=1)), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.where(norms == 0, 1, norms)

    def embed_query(self, text: str) -> np.ndarray:
        """A question's vector: the model's query instruction (if it has one) before the text."""
        return self.embed([self.spec.query_instruction + text])[0]


def _registered_file(name: str) -> str | None:
    from fastembed import TextEmbedding

    for desc in TextEmbedding._list_supported_models():
        if desc.model == name:
            return desc.model_file
    return None


def _load(spec: ModelSpec, model_dir: Path, threads: int | None):
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    if not (model_dir / "model.onnx").exists():
        raise FileNotFoundError(f"no model.onnx in {model_dir}: run `python -m infra up model` first")
    expected = _registered_file(spec.name)
    if expected is None:
        TextEmbedding.add_custom_model(
            model=spec.name,
            pooling=PoolingType[spec.pooling],
            normalization=True,
            sources=ModelSource(hf=spec.name),
            dim=spec.dim,
            model_file="model.onnx",
        )
    elif expected != "model.onnx" and not (model_dir / expected).exists():
        (model_dir / expected).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / expected).symlink_to((model_dir / "model.onnx").resolve())
    return TextEmbedding(spec.name, specific_model_path=str(model_dir), threads=threads, lazy_load=False)


def load_embedder(settings: Settings | None = None, threads: int | None = None, model: str | None = None) -> Embedder:
    """The process-wide embedder of `model` (default: the configured `embed_model`), loaded once, thread-safe.

    `threads`: onnxruntime's intra-op threads; None takes `embed_threads` (0: onnxruntime's default).
    """
    s = settings or get_settings()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import_fastembed()
    name = model or s.embed_model
    folder = model_folder(s, name)
    threads = threads if threads is not None else (s.embed_threads or None)
    key = (name, str(folder))
    with _lock:
        if key not in _cache:
            spec = model_spec(name)
            _cache[key] = Embedder(spec, _load(spec, folder, threads))
        return _cache[key]


class Embedders:
    """The configured models by language slot (projections.languages), loaded on first use.

    `vectors(texts)` embeds each text with its language's model, batched per model, and says which field and
    model each vector belongs to. Given a lone embedder that is not the configured default (a test's or a
    bench's), every text goes to it, in the default field, as with one model.
    """

    def __init__(self, settings: Settings, default: Embedder | None = None) -> None:
        self.settings = settings
        self._given = default
        self._single = default is not None and getattr(default, "name", None) != settings.embed_model
        self._loaded: dict[str, Embedder] = {} if default is None or self._single else {default.name: default}

    @classmethod
    def of(cls, settings: Settings, embedder: Embedder | Embedders) -> Embedders:
        return embedder if isinstance(embedder, Embedders) else cls(settings, embedder)

    def model(self, name: str) -> Embedder:
        if name not in self._loaded:
            self._loaded[name] = load_embedder(self.settings, model=name)
        return self._loaded[name]

    @property
    def dim(self) -> int:
        """The default field's dimension."""
        return self._given.dim if self._single else self.model(self.settings.embed_model).dim

    def vectors(self, texts: Sequence[str]) -> list[list[tuple[str, str, list[float]]]]:
        """Per text, in order: its (field, model name, vector)s, as `vector_plan` says (one batch per model).
        Given a lone embedder that is not the configured default, every text gets its vector in the default field."""
        if self._single:
            emb = self._given
            name = getattr(emb, "name", None) or self.settings.embed_model
            return [[(DEFAULT_FIELD, name, v.tolist())] for v in emb.embed(texts)]
        plans = [vector_plan(self.settings, t) for t in texts]
        wanted: dict[tuple[str, str], list[int]] = {}
        for i, plan in enumerate(plans):
            for fm in plan:
                wanted.setdefault(fm, []).append(i)
        made: dict[tuple[str, str], dict[int, list[float]]] = {}
        for (fld, name), idx in wanted.items():
            vecs = self.model(name).embed([texts[i] for i in idx])
            made[(fld, name)] = {i: v.tolist() for i, v in zip(idx, vecs, strict=True)}
        return [[(f, m, made[(f, m)][i]) for f, m in plan] for i, plan in enumerate(plans)]
