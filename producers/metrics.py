"""Prometheus metrics, the part every layer shares: family constructors and the exporter (docs/metrics.md).

A family is a module-level object in the metrics module of the layer that counts it, registered when imported,
so whatever serves a process's metrics serves every family it imported and adding one is one line:

    READS = counter("access_reads_total", "Facts read through the API, by kind of read", ("kind",))

Label values come from a small set the code knows, never a tenant, subject or key, which would make a series per user.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

__all__ = [
    "BATCH_BUCKETS",
    "LATENCY_BUCKETS",
    "PREFIX",
    "STAGE_BUCKETS",
    "counter",
    "gauge",
    "histogram",
    "serve",
]

log = logging.getLogger(__name__)

# no `<name>_created` sample beside every counter and histogram series (the process start time says as much);
# read when a family is built, so before any: this module is imported by every metrics module
disable_created_metrics()

PREFIX = "ledger_"
# seconds; an HTTP request (a recall p50 is tens of ms, a publish of 1,000 events a few hundred)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# seconds; one step of a request (cue extraction takes ~0.1 ms, an embedding ~10 ms)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# seconds; a batch of a stream processor or of the indexer (hundreds of records, retries included)
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _name(name: str) -> str:
    if name.startswith(PREFIX):
        raise ValueError(f"metric {name!r}: give the name without the {PREFIX!r} prefix (it is added)")
    return PREFIX + name


def counter(name: str, documentation: str, labels: Sequence[str] = (), **kwargs) -> Counter:
    """`ledger_<name>`, which must end in `_total` (the exposition's sample name)."""
    if not name.endswith("_total"):
        raise ValueError(f"counter {name!r}: a counter's name ends in _total")
    return Counter(_name(name), documentation, labels, **kwargs)


def gauge(name: str, documentation: str, labels: Sequence[str] = (), **kwargs) -> Gauge:
    """`ledger_<name>`; in the API's multiprocess mode pass `multiprocess_mode` (e.g. "livesum")."""
    return Gauge(_name(name), documentation, labels, **kwargs)


def histogram(
    name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float] = LATENCY_BUCKETS, **kwargs
) -> Histogram:
    """`ledger_<name>`: give it its unit (`_seconds`); `buckets` are upper bounds in that unit."""
    return Histogram(_name(name), documentation, labels, buckets=buckets, **kwargs)


def serve(port: int, host: str, *, setting: str) -> WSGIServer | None:
    """Serve this process's metrics at http://host:port/metrics from a daemon thread; None if `port` is 0.

    A port already in use is logged (naming `setting`) and the process goes on without an exporter: metrics
    are never a reason to stop projecting or indexing. Start several processes on one host with a port each.
    """
    if port == 0:
        log.info("metrics exporter off (%s=0)", setting)
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        log.error(
            "metrics exporter not started on %s:%d (%s): %s; this process serves no metrics", host, port, setting, exc
        )
        return None
    log.info("metrics at http://%s:%d/metrics", host, port)
    return server
