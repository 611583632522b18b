"""Token counts with the configured embedding model's own tokenizer (its `tokenizer.json`, via `tokenizers`).

POST /v1/context keeps its block within a budget counted this way: the real tokenizer of the model the
ledger embeds with (`Settings.model_dir`, the folder infra.model fills), not an approximation. Special
tokens ([CLS], [SEP]) are not counted, truncation and padding are off, so a text's count is what a
model sharing this vocabulary reads. A model of another family counts differently: the block says
which tokenizer counted it.

Loaded once per model folder and process (about 50 ms); encoding is Rust and releases the GIL.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer

__all__ = ["TokenCounter", "token_counter"]


class TokenCounter:
    """`count(texts) -> [tokens]` for a list of texts, with the tokenizer of one model folder."""

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer at {path} (python -m infra up model installs it)")
        self.path = path
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]


@functools.lru_cache(maxsize=4)
def token_counter(model_dir: Path) -> TokenCounter:
    """The process's counter for `model_dir` (Settings.model_dir), loaded on first use."""
    return TokenCounter(model_dir)
