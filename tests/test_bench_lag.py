"""The lag bench's pollers: an index not created yet is "nothing searchable yet", and a poller that dies fails the
measurement instead of leaving its probes unseen (a lag that reads as never measured)."""

from __future__ import annotations

import time

import pytest

from bench.lag import _doc_poller, _guarded, _Probe, _State
from producers.settings import Settings


def test_the_document_poller_waits_for_an_index_that_does_not_exist_yet(settings: Settings) -> None:
    st = _State(probes=[_Probe("new", "e1", "LAG1", time.perf_counter())])
    st.done.set()
    _doc_poller(settings, st, [time.perf_counter() + 0.3])  # the private index was never created: no 404 raised
    assert st.failed == [] and st.probes[0].doc is None


def test_a_poller_that_dies_is_recorded() -> None:
    st = _State()

    def broken(_: object) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError):
        _guarded(st, broken, None)
    assert st.failed == ["broken: ValueError: boom"]
