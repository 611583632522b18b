"""The access agent: the access topic in batches -> one PostgreSQL transaction per batch.

A second agent in the projector's faust App (same group, same worker processes), beside the ledger's: the same
`BatchRunner` and `attach_projection` (stream_processors.agents) over
`projections.postgres.access_projector.AccessProjector`. Its positions live in the same `positions` table
(topic = `Settings.access_topic`), and the App's seek hook covers its partitions too, so after every rebalance
they resume where PostgreSQL says. A transient failure (PostgreSQL away, a deadlock) is retried with backoff until
the batch commits; an access is never skipped by the stream moving on without it. Its dead letters stay rows
(no DLQ topic). Of the worker's metrics it has its topic's lag and counts its retries; the record and dead-letter
counts are the ledger's.
"""

from __future__ import annotations

import logging

from producers.settings import Settings
from projections.postgres.access_projector import AccessBatchResult, AccessProjector
from stream_processors.agents import BatchRunner, attach_projection
from stream_processors.app import LedgerApp
from stream_processors.metrics import record_retry

__all__ = ["attach_access"]

log = logging.getLogger(__name__)


def attach_access(app: LedgerApp, settings: Settings) -> BatchRunner:
    """Add the access agent to `app` (after `agents.attach`) and let the seek hook cover its partitions too."""
    runner = BatchRunner(settings, AccessProjector, what="access batch", on_retry=record_retry)

    def report(result: AccessBatchResult, records: int, seconds: float) -> None:
        log.info(
            "access batch: %d records, %d applied, %d duplicate, %d erased, %d skipped, %d dead in %.0f ms",
            records,
            result.applied,
            result.duplicates,
            result.erased,
            result.skipped,
            result.dead,
            seconds * 1000,
        )

    attach_projection(
        app, settings, runner, name="access-projector", batch_size=settings.access_batch_size, report=report
    )
    return runner
