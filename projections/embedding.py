"""Dense embeddings with fastembed, loaded offline from the model folder infra prepared.

The model name is configuration (`LEDGER_EMBED_MODEL`); fastembed either knows it
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
from projections.models import ModelSpec, model_spec

__all__ = ["Embedder", "load_embedder"]

_lock = threading.Lock()
_cache: dict[tuple[str, str], Embedder] = {}


class Embedder:
    """A loaded model: `embed(texts) -> (n, dim)` float32 array, rows of unit length."""

    def __init__(self, spec: ModelSpec, model, batch_size: int) -> None:
        self.spec, self._model, self.batch_size = spec, model, batch_size
        self.dim = spec.dim
        self.name = spec.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = np.asarray(list(self._model.embed(list(texts), batch_size=self.batch_size)), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.where(norms == 0, 1, norms)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


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


def load_embedder(settings: Settings | None = None, threads: int | None = None) -> Embedder:
    """The process-wide embedder for the configured model (loaded once, thread-safe)."""
    s = settings or get_settings()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    key = (s.embed_model, str(s.model_dir))
    with _lock:
        if key not in _cache:
            spec = model_spec(s.embed_model)
            _cache[key] = Embedder(spec, _load(spec, s.model_dir, threads), s.embed_batch_size)
        return _cache[key]
