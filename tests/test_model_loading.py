"""Both models loaded at once, as the API's start does: neither load may fail.

The API warms the embedder and the cross-encoder in two threads at the same time. Without one import of fastembed
at a time, about one fresh process in ten failed one of them with importlib's `_DeadlockError`; each try here
is a fresh interpreter (an import races only once per process), two at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from infra.model import install_model
from infra.reranker import install as install_reranker

TRIES = 16
RACE = """
import sys
import threading

sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows in ~1 process of 5, not 10
from projections.embedding import load_embedder
from projections.reranker import load_cross_encoder

barrier, errors = threading.Barrier(2), []

def load(loader):
    barrier.wait()
    try:
        loader()
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=load, args=(f,)) for f in (load_embedder, load_cross_encoder)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
raise SystemExit(1 if errors else 0)
"""


def test_embedder_and_cross_encoder_load_at_once_in_a_fresh_process(settings):
    install_model(settings, settings.embed_model)
    install_reranker(settings)
    env = {**os.environ, "LEDGER_DEVELOPMENT": "1", "LEDGER_DATA_DIR": str(settings.data_dir)}

    def fresh_process(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", RACE], env=env, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(fresh_process, range(TRIES)))
    failed = [r.stdout + r.stderr[-2000:] for r in runs if r.returncode != 0]
    assert not failed, f"{len(failed)} of {TRIES} fresh processes failed a load: {failed[0]}"
