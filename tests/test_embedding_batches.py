"""A text's vector is its own: the same, bit for bit, embedded alone and in any batch of other texts.

Against the real model files (installed as `python -m infra up model` does), for the configured default and English
models, both int8: they quantize activations with one scale per onnxruntime call, so texts embedded together used
to get vectors that depended on each other (cosine down to 0.991 against alone), and the index's vectors, the
semantic stage's list and the dev set's numbers with how the embedder's claims happened to fall.
"""

from __future__ import annotations

import numpy as np
import pytest

from infra.model import install_model
from projections.embedding import load_embedder

TEXTS = [
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful, and the people there were kind. "
    "[shares a photo: a group of people sitting in a circle in a community room]",
    "ok",
    "用户 42 住在杭州",
    "Melanie: Hey Caroline! Good to see you! I'm swamped with the kids & work. What's up with you?",
    "项目 Q7 的后端服务端口是 8080\nproject backend port\n端口",
    ";)",
    "Dave uses Neovim as his editor",
]
OTHERS = [
    "Jon: I lost my job as a banker yesterday, so I'm going to start my own dance studio. " * 4,
    "Gina: Thanks, Jon! Appreciate your support!",
]


@pytest.mark.parametrize("slot", ["embed_model", "embed_model_en"])
def test_a_texts_vector_is_the_same_alone_and_in_any_batch(settings, slot):
    name = getattr(settings, slot)
    install_model(settings, name)
    emb = load_embedder(settings, model=name)
    alone = np.stack([emb.embed([t])[0] for t in TEXTS])
    assert alone.shape == (len(TEXTS), emb.dim)
    assert float(alone[0] @ alone[1]) < 0.95  # the texts really differ: a row given back to another text would fail
    batches = {
        "all together": emb.embed(TEXTS),
        "reversed": emb.embed(TEXTS[::-1])[::-1],
        "beside longer texts": emb.embed(OTHERS + TEXTS)[len(OTHERS) :],
    }
    for what, vecs in batches.items():
        assert np.array_equal(vecs, alone), (what, float(np.abs(vecs - alone).max()))
    assert np.array_equal(emb.embed(TEXTS), batches["all together"])  # and the same call twice gives the same
    assert emb.embed([]).shape == (0, emb.dim)
