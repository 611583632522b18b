"""The worker's consumer drains as faust does, with one race per fetched batch (stream_processors.app).

`PositionedConsumer._drain_messages` restates faust-streaming's `Consumer._drain_messages` (its gap tracking, its
commit cadence, its error handling) and races the hand-over of a batch's records against the flow being
suspended, instead of each record's. It is only right against the faust it restates: the source of faust's loop
is pinned here, so an upgrade of faust-streaming fails this test until the restatement is read against the new
loop. The same holds for `take_ready`, which restates faust's `Stream.take_events` (its buffer, its acks) with
natural batches. The behaviour itself (rebalances mid-stream lose and double nothing) is the end-to-end tests' (tests/
test_projection_pg.py: two workers sharing the partitions, one of them killed mid-stream).
"""

from __future__ import annotations

import hashlib
import inspect

import faust
import pytest
from faust.streams import Stream
from faust.transport.consumer import Consumer

from stream_processors.app import PositionedConsumer, make_app

pytestmark = pytest.mark.unit

# sha256 of faust-streaming 0.15.3's Consumer._drain_messages source
FAUST_DRAIN = "44a2500309e83c630493f6828af50166ec8d96a0b3e4fb2bab735f704ae93417"
# sha256 of faust-streaming 0.15.3's Stream.take_events source
FAUST_TAKE = "607d48aead118ba8ea868718a0df87de1c5fcecd10ec542c659b448796728e08"


def test_the_restated_loop_is_the_one_of_the_faust_installed():
    source = inspect.getsource(Consumer._drain_messages)
    assert hashlib.sha256(source.encode()).hexdigest() == FAUST_DRAIN, (
        f"faust-streaming {faust.__version__} changed Consumer._drain_messages: read it against "
        "stream_processors.app.PositionedConsumer._drain_messages, then update FAUST_DRAIN"
    )
    assert "wait_first" in source and "suspend_flow" in source  # what the restatement races against


def test_the_restated_take_is_the_one_of_the_faust_installed():
    source = inspect.getsource(Stream.take_events)
    assert hashlib.sha256(source.encode()).hexdigest() == FAUST_TAKE, (
        f"faust-streaming {faust.__version__} changed Stream.take_events: read it against "
        "stream_processors.app.take_ready, then update FAUST_TAKE"
    )


def test_the_worker_app_uses_the_restated_loop(base_settings):
    app = make_app(base_settings)
    assert app.transport.Consumer is PositionedConsumer
    assert PositionedConsumer._drain_messages is not Consumer._drain_messages
