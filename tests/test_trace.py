"""The recall trace's timed sections when a tier's stages run at once: each section reports its own time less the
sections nested in it within its own task, never another task's."""

from __future__ import annotations

import asyncio

import pytest

from projections.search.recall.trace import Trace

NAP_S = 0.1


async def _stage(trace: Trace, name: str, own_s: float, inner: str, inner_s: float) -> None:
    with trace.timed(name):
        await asyncio.sleep(own_s)
        with trace.timed(inner):
            await asyncio.sleep(inner_s)


@pytest.mark.unit
def test_sections_side_by_side_nest_only_in_their_own_task() -> None:
    trace = Trace("auto")

    async def tier() -> None:
        with trace.timed("tier"):
            await asyncio.gather(
                _stage(trace, "keyword", NAP_S, "keyword_inner", 0.0),
                _stage(trace, "semantic", 0.0, "embed", NAP_S),
            )

    asyncio.run(tier())
    ms = trace.stages
    assert ms["keyword"] >= NAP_S * 1000 * 0.9, ms  # its own wait, not taken away by the other task's nesting
    assert ms["embed"] >= NAP_S * 1000 * 0.9, ms
    assert ms["semantic"] < NAP_S * 1000 / 2, ms  # its time was all the embed nested in it
    # the tier's own time: the stages ran in tasks of their own, so nothing of theirs nests in it; wall time
    assert ms["tier"] >= NAP_S * 1000 * 0.9, ms
    assert trace.as_dict(None)["stages_ms"] is ms  # type: ignore[arg-type]


@pytest.mark.unit
def test_sections_one_after_another_still_nest_as_before() -> None:
    trace = Trace("auto")
    asyncio.run(_stage(trace, "semantic", 0.0, "embed", NAP_S))
    assert trace.stages["embed"] >= NAP_S * 1000 * 0.9 and trace.stages["semantic"] < NAP_S * 1000 / 2
