"""Invalidations fanned out to watchers: order, a reset in place of what a slow watcher missed, the end."""

from __future__ import annotations

import pytest

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
