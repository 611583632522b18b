"""Length-sorted embedding batches (`embed_sort_by_length`): faster, and every vector still its own text's.

Against the real model files (installed as `python -m infra up model` does). fp32 bge-small-zh is used because its
vectors do not depend on the other texts of a batch (with attention masks, padding changes nothing but rounding);
the int8 models quantize activations per batch, so theirs move a little with any batching.
"""

from __future__ import annotations

import numpy as np

from infra.model import install_model
from projections.embedding import Embedder, load_embedder

ZH = "BAAI/bge-small-zh-v1.5"
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


def test_sorted_batches_keep_each_text_its_own_vector(settings):
    s = settings.model_copy(update={"embed_model": ZH})
    install_model(s, ZH)
    base = load_embedder(s)
    alone = np.stack([base.embed([t])[0] for t in TEXTS])  # one text per call: no padding at all
    plain = Embedder(base.spec, base._model, batch_size=3, sort_by_length=False).embed(TEXTS)
    ordered = Embedder(base.spec, base._model, batch_size=3, sort_by_length=True).embed(TEXTS)
    assert ordered.shape == (len(TEXTS), base.dim)
    cos_sorted = (ordered * alone).sum(axis=1)
    assert cos_sorted.min() > 0.9999, cos_sorted  # a row given back to the wrong text would score far lower
    assert (plain * alone).sum(axis=1).min() > 0.9999
    assert float(ordered[0] @ alone[1]) < 0.95  # the texts really differ: the check above can fail
    assert Embedder(base.spec, base._model, 3, sort_by_length=True).embed([]).shape == (0, base.dim)
