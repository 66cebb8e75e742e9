"""Invalidations fanned out to watchers: order, a reset in place of what a slow watcher missed, the end."""

from __future__ import annotations

import pytest

from services.cache.entry import Entry
from services.cache.fanout import WATCH_QUEUE, Invalidation, InvalidationFanout


async def test_a_slow_watcher_gets_one_reset_for_what_it_missed_and_close_ends_it() -> None:
    fanout = InvalidationFanout()
    sub = fanout.subscribe(heartbeat_s=30).__aiter__()
    assert (await anext(sub)).reset and len(fanout) == 1  # subscribed: start from empty
    fanout.publish(Invalidation(pipeline="a"))
    fanout.publish(Invalidation(model_name="m", model_version="2"))
    got = [await anext(sub), await anext(sub)]
    assert got == [Invalidation(pipeline="a"), Invalidation(model_name="m", model_version="2")]
    for i in range(WATCH_QUEUE + 1):  # it does not read meanwhile: one too many
        fanout.publish(Invalidation(pipeline=str(i)))
    assert (await anext(sub)).reset  # in place of all it missed (what comes after still comes)
    fanout.publish(Invalidation(pipeline="b"))
    assert (await anext(sub)).pipeline == "b"
    fanout.close()
    with pytest.raises(StopAsyncIteration):
        await anext(sub)
    assert len(fanout) == 0
    assert [e async for e in fanout.subscribe(heartbeat_s=30)] == []  # closed: new watchers end at once


async def test_an_idle_watcher_gets_heartbeats() -> None:
    fanout = InvalidationFanout()
    sub = fanout.subscribe(heartbeat_s=0.05).__aiter__()
    assert (await anext(sub)).reset
    beat = await anext(sub)
    assert beat.heartbeat and not beat.reset
    fanout.close()


def test_what_an_invalidation_matches() -> None:
    def entry(pipeline: str, model: str, version: str) -> Entry:
        return Entry(b"v", pipeline, model, version, 0.0, 1.0, 1.0)

    a, b, c = entry("fraud", "mlp", "1"), entry("fraud", "mlp", "2"), entry("digits", "cnn", "1")
    cases = {
        Invalidation(reset=True): [a, b, c],
        Invalidation(pipeline="fraud"): [a, b],
        Invalidation(model_name="mlp", model_version="2"): [b],
        Invalidation(model_name="mlp"): [a, b],  # every version of the model
        Invalidation(): [],  # a heartbeat drops nothing
    }
    for invalidation, dropped in cases.items():
        assert [e for e in (a, b, c) if invalidation.matches(e)] == dropped, invalidation
