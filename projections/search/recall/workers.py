"""The threads recall's CPU-heavy work runs in, off the event loop.

ONE cue worker: extraction is pure Python and holds the GIL, and each extra thread contending for it delays the
loop more. Embeddings release the GIL (onnxruntime): two workers let a short query pass a long one; the model is
loaded by one of them, so onnxruntime's own threads inherit the lower priority.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["BACKGROUND_NICE", "CUES_EXECUTOR", "EMBED_EXECUTOR"]

BACKGROUND_NICE = 10  # CPU-heavy recall work yields the CPU to the event loop and to cheap requests (health, exact)


def _lower_priority() -> None:
    """Run this worker thread (and the threads it creates, e.g. onnxruntime's pool) at a lower CPU priority.

    Linux nice values are per thread: on a busy machine the loop thread, the health probes and the exact path get
    the CPU first, and a flood of long semantic queries slows down semantic queries instead of the whole API.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at the normal priority
        pass


CUES_EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="recall-cues")
EMBED_EXECUTOR = ThreadPoolExecutor(2, thread_name_prefix="recall-embed", initializer=_lower_priority)
