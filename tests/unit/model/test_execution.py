"""Where forwards run: inline on the event loop or on worker threads, chosen from warm-up timings or the config.

The inline path must answer exactly as the threaded one, honour deadlines and cancellation before compute,
gather what was submitted together into one batch, and never keep a slow model on the loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import DeadlineExceeded, Internal
from services.common.loop_idle import idle_hooks
from services.model.backends.base import LoadedModel
from services.model.batcher import THREAD, DirectRunner, DynamicBatcher, Execution
from services.model.config import DynamicBatching, ModelConfig
from services.model.converters import config_to_pb
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.stats import VersionStats
from services.model.version import choose_execution
from tests.helpers.models import Mlp, Slow, mlp_config, reference_output, write_model


class RecordingModel(LoadedModel):
    """y = 3x + 1 per row; records each batch's size and the thread that ran it; can sleep or fail."""

    def __init__(self, sleep_s: float = 0.0, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.threads: list[str] = []
        self.sleep_s = sleep_s
        self.fail = fail

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fail:
            raise RuntimeError("weights on fire")
        self.threads.append(threading.current_thread().name)
        x = inputs["x"]
        self.batches.append(x.shape[0])
        return {"y": x * 3 + 1}


def rows(n: int, start: float = 0) -> dict[str, np.ndarray]:
    return {"x": (np.arange(n * 2, dtype=np.float32) + start).reshape(n, 2)}


def batcher(model: LoadedModel, execution: Execution, max_batch: int = 8, **knobs: object) -> DynamicBatcher:
    settings = DynamicBatching.model_validate({"max_queue_delay_us": 0, **knobs})
    executor = ThreadPoolExecutor(1, thread_name_prefix="worker")
    return DynamicBatcher(model, executor, 1, max_batch, settings, VersionStats("m", 1), execution)


INLINE = Execution(inline=True)


def others_ready() -> None:
    """Another callback due in this loop iteration, as when several handlers run in the same one."""
    asyncio.get_running_loop().call_soon(lambda: None)


async def test_inline_batches_answer_exactly_as_threaded_ones() -> None:
    sizes = [1, 2, 3, 1, 1, 4, 2]
    answers = {}
    for execution in (INLINE, THREAD):
        model = RecordingModel()
        b = batcher(model, execution)
        answers[execution.name] = await asyncio.gather(
            *(b.submit(rows(n, i * 10), n, None) for i, n in enumerate(sizes))
        )
        if execution.inline:
            assert set(model.threads) == {threading.current_thread().name}  # the loop's own thread
        else:
            assert all(name.startswith("worker") for name in model.threads)
    for i, n in enumerate(sizes):
        expected = rows(n, i * 10)["x"] * 3 + 1
        np.testing.assert_array_equal(answers["inline"][i]["y"], expected)
        np.testing.assert_array_equal(answers["thread"][i]["y"], expected)


async def test_inline_gathers_what_was_submitted_in_one_iteration_without_waiting() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE, max_batch=8, max_queue_delay_us=5_000_000)
    others_ready()
    futures = [b.submit(rows(1, i), 1, None) for i in range(5)]
    assert model.batches == []  # others were due in this iteration: the batch forms after them
    start = time.perf_counter()
    await asyncio.gather(*futures)
    assert model.batches == [5]
    assert time.perf_counter() - start < 2.5  # an idle loop never waits for the 5 s of company
    await asyncio.sleep(0.01)  # the loop waits for I/O: idle again
    others_ready()
    futures = [b.submit(rows(2, i), 2, None) for i in range(6)]
    await asyncio.gather(*futures)
    assert model.batches == [5, 8, 4]  # split at max_batch_size, in order


async def test_a_lone_inline_request_on_an_idle_loop_runs_in_the_callers_step() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE, max_queue_delay_us=5_000_000)
    future = b.submit(rows(2), 2, None)
    assert future.done() and model.batches == [2]  # nothing else was due: no wait, not even an iteration
    np.testing.assert_array_equal(future.result()["y"], rows(2)["x"] * 3 + 1)


async def test_inline_honours_deadlines_and_cancellation_before_compute() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE)
    others_ready()
    expired = b.submit(rows(3), 3, time.monotonic() - 0.001)
    cancelled = b.submit(rows(5), 5, None)
    cancelled.cancel()
    alive = b.submit(rows(2), 2, time.monotonic() + 30)
    with pytest.raises(DeadlineExceeded):
        await expired
    out = await alive
    assert model.batches == [2]
    np.testing.assert_array_equal(out["y"], rows(2)["x"] * 3 + 1)


async def test_an_inline_forward_that_fails_fails_its_batch_and_the_batcher_goes_on() -> None:
    model = RecordingModel(fail=True)
    b = batcher(model, INLINE)
    with pytest.raises(Internal, match="weights on fire"):
        await b.submit(rows(1), 1, None)
    model.fail = False
    out = await b.submit(rows(1), 1, None)
    np.testing.assert_array_equal(out["y"], rows(1)["x"] * 3 + 1)


async def test_while_the_loop_is_busy_an_inline_batch_stays_open_and_closes_when_it_runs_out_of_work() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE, max_batch=16, max_queue_delay_us=5_000_000)
    futures = []
    for i in range(5):
        others_ready()
        futures.append(b.submit(rows(1, i), 1, None))
        await asyncio.sleep(0)  # other work is ready: the loop never waits for I/O, the batch stays open
    assert model.batches == []
    await asyncio.gather(*futures)  # nothing else to do: the loop would wait, so the batch runs
    assert model.batches == [5]
    np.testing.assert_array_equal(futures[3].result()["y"], rows(1, 3)["x"] * 3 + 1)


async def test_an_inline_batch_closes_at_its_preferred_size_even_while_the_loop_is_busy() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE, max_batch=16, max_queue_delay_us=5_000_000, preferred_batch_sizes=[3])
    futures = []
    for i in range(3):
        others_ready()
        futures.append(b.submit(rows(1, i), 1, None))
        await asyncio.sleep(0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert model.batches == [3]
    await asyncio.gather(*futures)


async def test_without_a_queue_delay_an_inline_batch_is_what_one_loop_iteration_submitted() -> None:
    model = RecordingModel()
    b = batcher(model, INLINE, max_batch=16, max_queue_delay_us=0)
    others_ready()
    first = [b.submit(rows(1), 1, None) for _ in range(2)]
    await asyncio.sleep(0)
    others_ready()
    second = b.submit(rows(1), 1, None)
    await asyncio.gather(*first, second)
    assert model.batches == [2, 1]


async def test_idle_hooks_run_only_when_the_loop_runs_out_of_work() -> None:
    loop = asyncio.get_running_loop()
    hooks = idle_hooks(loop)
    assert hooks is not None
    assert idle_hooks(loop) is hooks
    ran: list[int] = []
    hooks.call_when_idle(lambda: ran.append(1))
    for _ in range(20):
        await asyncio.sleep(0)  # always something ready
    assert ran == []
    await asyncio.sleep(0.01)
    assert ran == [1]
    await asyncio.sleep(0.01)
    assert ran == [1]  # one-shot


async def test_direct_runner_inline_runs_in_the_callers_step_and_refuses_a_passed_deadline() -> None:
    model = RecordingModel()
    runner = DirectRunner(model, ThreadPoolExecutor(1), 8, VersionStats("m", 1), INLINE)
    out = await runner.submit(rows(2), 2, None)
    np.testing.assert_array_equal(out["y"], rows(2)["x"] * 3 + 1)
    assert model.threads == [threading.current_thread().name]
    with pytest.raises(DeadlineExceeded):
        await runner.submit(rows(1), 1, time.monotonic() - 1)
    assert model.batches == [2]


async def test_an_automatically_inline_model_that_turns_slow_moves_to_its_threads() -> None:
    model = RecordingModel(sleep_s=0.005)
    b = batcher(model, Execution(inline=True, demote_above_ns=1_000_000))
    assert b.execution == "inline"
    await b.submit(rows(1), 1, None)  # 5 ms on the loop: over the 1 ms limit
    assert b.execution == "thread"
    await b.submit(rows(1), 1, None)
    assert model.threads[0] == threading.current_thread().name
    assert model.threads[1].startswith("worker")


async def test_a_model_configured_inline_stays_inline_however_slow() -> None:
    model = RecordingModel(sleep_s=0.003)
    b = batcher(model, INLINE)
    for _ in range(3):
        await b.submit(rows(1), 1, None)
    assert b.execution == "inline"


def test_auto_chooses_inline_only_for_a_short_warm_up_forward() -> None:
    config = ModelConfig.model_validate(mlp_config("m"))
    assert choose_execution(config, 200_000, 1000) == Execution(inline=True, demote_above_ns=2_000_000)
    assert choose_execution(config, 5_000_000, 1000) == THREAD
    assert choose_execution(config, None, 1000) == THREAD  # no warm-up timing: nothing says it is short
    assert choose_execution(config, 1000, 0) == THREAD  # the service turned inline off
    inline = ModelConfig.model_validate(mlp_config("m", execution="inline"))
    assert choose_execution(inline, 50_000_000, 1000) == Execution(inline=True)
    thread = ModelConfig.model_validate(mlp_config("m", execution="thread"))
    assert choose_execution(thread, 1000, 1000) == THREAD


async def test_the_manager_runs_a_small_model_inline_and_a_slow_one_on_threads(tmp_path: Path) -> None:
    write_model(tmp_path, "small", mlp_config("small", dynamic_batching={}), {1: Mlp(1)})
    slow = mlp_config("slow", dynamic_batching={})
    write_model(tmp_path, "slow", slow, {1: Slow(rounds=40, size=384)})
    manager = ModelManager(ModelRepository(tmp_path), inline_max_forward_us=1000)
    await manager.load_all()
    try:
        small, slow_mv = manager.get("small"), manager.get("slow")
        assert small.execution == "inline"
        assert slow_mv.execution == "thread"
        assert config_to_pb(small).parameters["execution"].string_value == "inline"
        x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
        out = await small.infer({"x": x}, 3, None)
        np.testing.assert_allclose(out["y"], reference_output(Mlp(1), x), rtol=1e-5, atol=1e-6)
    finally:
        await manager.close()


async def test_a_delayed_model_never_runs_inline(tmp_path: Path) -> None:
    write_model(tmp_path, "m", mlp_config("m", execution="inline", dynamic_batching={}), {1: Mlp(1)})
    manager = ModelManager(ModelRepository(tmp_path), fault_delay_ms=5)
    await manager.load_all()
    try:
        assert manager.get("m").execution == "thread"
    finally:
        await manager.close()


async def test_the_service_gives_torch_one_thread_when_every_model_runs_inline(tmp_path: Path) -> None:
    import torch

    from services.model.__main__ import build
    from services.model.settings import ModelSettings

    write_model(tmp_path, "small", mlp_config("small", dynamic_batching={}), {1: Mlp(1)})
    before = torch.get_num_threads()
    _, handler = build(ModelSettings(repository=tmp_path, watch=False, port=0, metrics_port=0))
    try:
        await handler.start()
        assert handler.manager.get("small").execution == "inline"
        assert torch.get_num_threads() == 1
    finally:
        await handler.close()
        torch.set_num_threads(before)


async def test_a_model_on_threads_keeps_torchs_default_thread_count(tmp_path: Path) -> None:
    import torch

    from services.model.__main__ import build
    from services.model.settings import ModelSettings

    write_model(tmp_path, "small", mlp_config("small", dynamic_batching={}), {1: Mlp(1)})
    write_model(tmp_path, "big", mlp_config("big", execution="thread"), {1: Mlp(2)})
    torch.set_num_threads(2)
    _, handler = build(ModelSettings(repository=tmp_path, watch=False, port=0, metrics_port=0))
    try:
        await handler.start()
        assert torch.get_num_threads() == 2
    finally:
        await handler.close()
