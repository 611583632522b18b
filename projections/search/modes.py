"""The recall modes, defined once (`Mode`, `MODES`).

A leaf module (it imports nothing): the recall engine's request (`recall.model`) and the API's
response models (`api.schemas`, which the read client `api.client` imports) both name the modes
without loading the engine and its Elasticsearch client.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["MODES", "Mode"]

Mode = Literal["auto", "exact", "keyword", "semantic", "hybrid"]
MODES: tuple[Mode, ...] = get_args(Mode)
