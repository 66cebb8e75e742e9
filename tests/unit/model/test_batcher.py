"""The dynamic batcher on a real event loop and worker threads, with a small numpy model that logs batches."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services.common.errors import DeadlineExceeded, ResourceExhausted
from services.model.backends.base import LoadedModel
from services.model.batcher import DynamicBatcher
from services.model.config import DynamicBatching
from services.model.stats import VersionStats


class AffineModel(LoadedModel):
    """y = 3x + 1 per row; records every batch size and can be held to simulate a long forward pass."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.threads: set[str] = set()

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        x = inputs["x"]
        self.batches.append(x.shape[0])
        return {"y": x * 3 + 1}


def make(model: AffineModel, max_batch: int = 8, instances: int = 1, **knobs) -> DynamicBatcher:
    settings = DynamicBatching(**{"max_queue_delay_us": 0, **knobs})
    executor = ThreadPoolExecutor(instances, thread_name_prefix="worker")
    return DynamicBatcher(model, executor, instances, max_batch, settings, VersionStats("m", 1))


def rows(n: int, start: float = 0) -> dict[str, np.ndarray]:
    return {"x": (np.arange(n * 2, dtype=np.float32) + start).reshape(n, 2)}


async def test_lone_request_on_idle_model_dispatches_at_once() -> None:
    model = AffineModel()
    batcher = make(model, max_queue_delay_us=50_000)
    future = batcher.submit(rows(1), 1, None)
    assert batcher.queue_length == 0  # already handed to a worker, no waiting for company
    out = await future
    np.testing.assert_array_equal(out["y"], rows(1)["x"] * 3 + 1)
    assert model.threads and all(name.startswith("worker") for name in model.threads)


async def test_requests_arriving_during_compute_are_batched_and_scattered() -> None:
    model = AffineModel()
    batcher = make(model, max_batch=8)
    model.gate.clear()
    first = batcher.submit(rows(1, 100), 1, None)
    others = [batcher.submit(rows(1 + i % 2, i * 10), 1 + i % 2, None) for i in range(6)]
    await asyncio.sleep(0.05)
    model.gate.set()
    results = await asyncio.gather(first, *others)
    assert model.batches == [1, 7, 2]  # 1 alone; then 1+2+1+2+1 (the next 2 rows would pass 8); then 2
    for i, out in enumerate(results[1:]):
        np.testing.assert_array_equal(out["y"], rows(1 + i % 2, i * 10)["x"] * 3 + 1)


async def test_padding_to_allowed_sizes_is_stripped() -> None:
    model = AffineModel()
    batcher = make(model, max_batch=8, allowed_batch_sizes=[4, 8])
    model.gate.clear()
    futures = [batcher.submit(rows(1, i), 1, None) for i in range(3)]
    model.gate.set()
    results = await asyncio.gather(*futures)
    assert model.batches == [4, 4]  # 1 padded to 4, then 2 padded to 4
    for i, out in enumerate(results):
        assert out["y"].shape == (1, 2)
        np.testing.assert_array_equal(out["y"], rows(1, i)["x"] * 3 + 1)


async def test_preferred_batch_size_shapes_batches() -> None:
    model = AffineModel()
    batcher = make(model, max_batch=8, preferred_batch_sizes=[2])
    model.gate.clear()
    futures = [batcher.submit(rows(1, i), 1, None) for i in range(6)]
    model.gate.set()
    await asyncio.gather(*futures)
    assert model.batches == [1, 2, 2, 1]


async def test_full_queue_is_refused_at_once() -> None:
    model = AffineModel()
    batcher = make(model, max_queue_size=2)
    model.gate.clear()
    running = batcher.submit(rows(1), 1, None)  # on the worker
    queued = [batcher.submit(rows(1), 1, None) for _ in range(2)]
    start = time.perf_counter()
    with pytest.raises(ResourceExhausted, match="queue full"):
        batcher.submit(rows(1), 1, None)
    assert time.perf_counter() - start < 0.5
    model.gate.set()
    await asyncio.gather(running, *queued)


async def test_expired_and_cancelled_requests_never_reach_compute() -> None:
    model = AffineModel()
    batcher = make(model)
    model.gate.clear()
    running = batcher.submit(rows(1), 1, None)
    expired = batcher.submit(rows(3), 3, time.monotonic() + 0.01)
    cancelled = batcher.submit(rows(5), 5, None)
    cancelled.cancel()
    alive = batcher.submit(rows(2), 2, time.monotonic() + 30)
    await asyncio.sleep(0.05)
    model.gate.set()
    await running
    with pytest.raises(DeadlineExceeded):
        await expired
    await alive
    assert model.batches == [1, 2]


async def test_delay_waits_for_company_only_while_another_instance_computes() -> None:
    model = AffineModel()
    batcher = make(model, max_batch=4, instances=2, max_queue_delay_us=200_000, preferred_batch_sizes=[4])
    model.gate.clear()
    first = batcher.submit(rows(1), 1, None)  # idle model: goes at once
    second = batcher.submit(rows(1), 1, None)  # one instance busy: waits for company (up to 200 ms)
    await asyncio.sleep(0.02)
    assert batcher.queue_length == 1
    rest = [batcher.submit(rows(1), 1, None) for _ in range(3)]  # reaches the preferred size: dispatched
    assert batcher.queue_length == 0
    model.gate.set()
    await asyncio.gather(first, second, *rest)
    assert sorted(model.batches) == [1, 4]


async def test_a_free_instance_waits_for_the_rows_the_recent_load_had_then_stops_waiting() -> None:
    model = AffineModel()
    batcher = make(model, max_batch=8, max_queue_delay_us=1_000_000)
    model.gate.clear()
    first = batcher.submit(rows(1), 1, None)  # idle model: goes at once
    others = [batcher.submit(rows(1), 1, None) for _ in range(3)]  # 4 rows in the model at once
    model.gate.set()
    await first
    await asyncio.sleep(0.02)
    assert batcher.queue_length == 3  # 4 were here a moment ago: the fourth is expected back
    back = batcher.submit(rows(1), 1, None)
    await asyncio.gather(back, *others)
    assert model.batches == [1, 4]
    lone = batcher.submit(rows(1), 1, None)  # the load fell to one: it waits once, then the batcher stops waiting
    await lone
    start = time.perf_counter()
    await batcher.submit(rows(1), 1, None)
    assert time.perf_counter() - start < 0.5  # no second wait for the 1 s delay
    assert model.batches == [1, 4, 1, 1]
