"""ModelHandler over a real ModelManager and real TorchScript models: domain types in, domain types out."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from services.common.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from services.common.server import Lifecycle
from services.model.domain import InferenceRequest, ModelMetadata, ServerMetadata
from services.model.handler import EXTENSIONS, ModelHandler
from services.model.manager import RepositoryEntry
from services.model.stats import VersionStats
from services.model.version import ModelVersion
from tests.helpers.models import Mlp, reference_output


def x_rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def test_live_and_ready_come_from_the_lifecycle(handler: ModelHandler, lifecycle: Lifecycle) -> None:
    assert handler.live() and handler.ready()
    assert handler.model_ready("mlp", "") and handler.model_ready("mlp", "2")
    assert not handler.model_ready("mlp", "1")  # outside the latest-two policy
    assert not handler.model_ready("broken", "") and not handler.model_ready("nope", "")
    lifecycle.ready = False  # loading, not yet SERVING: alive, not ready
    assert handler.live() and not handler.ready()
    lifecycle.draining = True  # SIGTERM: neither live nor ready, and no model answers ready
    assert not handler.live() and not handler.ready()
    assert not handler.model_ready("mlp", "")


def test_server_metadata(handler: ModelHandler) -> None:
    meta = handler.server_metadata()
    assert isinstance(meta, ServerMetadata)
    assert meta.name == "meshserve" and meta.extensions == EXTENSIONS and "model_repository" in meta.extensions


async def test_infer_answers_what_torch_answers_with_the_newest_version(handler: ModelHandler) -> None:
    x = x_rows(5)
    response = await handler.infer(InferenceRequest("mlp", "", {"x": x}, id="req-1"), deadline=None)
    assert (response.model_name, response.model_version, response.id) == ("mlp", "3", "req-1")
    np.testing.assert_allclose(response.outputs["y"], reference_output(Mlp(3), x), rtol=1e-5, atol=1e-6)
    older = await handler.infer(InferenceRequest("mlp", "2", {"x": x}), deadline=time.monotonic() + 30)
    assert older.model_version == "2"
    np.testing.assert_allclose(older.outputs["y"], reference_output(Mlp(2), x), rtol=1e-5, atol=1e-6)


async def test_concurrent_requests_are_batched_and_each_gets_its_rows(handler: ModelHandler) -> None:
    inputs = [x_rows(1 + i % 3, seed=i) for i in range(12)]
    responses = await asyncio.gather(
        *(handler.infer(InferenceRequest("batched", "", {"x": x}), deadline=None) for x in inputs)
    )
    for x, response in zip(inputs, responses, strict=True):
        np.testing.assert_allclose(response.outputs["y"], reference_output(Mlp(7), x), rtol=1e-5, atol=1e-6)
    stats = handler.config("batched").stats
    assert stats.inference_count == sum(len(x) for x in inputs)
    assert set(stats.batches) <= set(range(1, 17))


async def test_requested_outputs_are_kept_and_unknown_ones_refused(handler: ModelHandler) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10, 20], dtype=np.int64)
    both = await handler.infer(InferenceRequest("multi", "", {"a": a, "b": b}), deadline=None)
    assert list(both.outputs) == ["a2", "b1"]
    only = await handler.infer(InferenceRequest("multi", "", {"a": a, "b": b}, requested_outputs=["b1"]), None)
    assert list(only.outputs) == ["b1"]
    np.testing.assert_array_equal(only.outputs["b1"], b + 1)
    with pytest.raises(InvalidArgument, match=r"no output\(s\) \['c'\]"):
        await handler.infer(InferenceRequest("multi", "", {"a": a, "b": b}, requested_outputs=["c"]), None)
    stats = handler.config("multi").stats
    assert (stats.success.count, stats.fail.count) == (2, 1)


async def test_bad_requests_are_refused_and_counted_as_failures(handler: ModelHandler) -> None:
    with pytest.raises(NotFound, match="unknown model 'nope'"):
        await handler.infer(InferenceRequest("nope", "", {"x": x_rows(1)}), None)
    with pytest.raises(NotFound, match="no ready version 1"):
        await handler.infer(InferenceRequest("mlp", "1", {"x": x_rows(1)}), None)
    with pytest.raises(Unavailable, match="no ready version"):
        await handler.infer(InferenceRequest("broken", "", {"x": x_rows(1)}), None)
    with pytest.raises(InvalidArgument, match="expected inputs"):
        await handler.infer(InferenceRequest("mlp", "", {"z": x_rows(1)}), None)
    with pytest.raises(InvalidArgument, match="over max_batch_size"):
        await handler.infer(InferenceRequest("mlp", "", {"x": x_rows(17)}), None)
    with pytest.raises(DeadlineExceeded):
        await handler.infer(InferenceRequest("mlp", "", {"x": x_rows(1)}), deadline=time.monotonic() - 1)
    stats = handler.config("mlp").stats
    assert (stats.success.count, stats.fail.count) == (0, 3)


def test_metadata_names_the_version_and_every_ready_one(handler: ModelHandler) -> None:
    meta = handler.metadata("mlp", "")
    assert isinstance(meta, ModelMetadata) and isinstance(meta.version, ModelVersion)
    assert (meta.version.version, meta.ready_versions) == (3, [2, 3])
    assert handler.metadata("mlp", "2").version.version == 2
    with pytest.raises(NotFound):
        handler.metadata("mlp", "7")


def test_config_is_the_served_version(handler: ModelHandler) -> None:
    assert handler.config("int8", "2").config.optimization_for(2).quantization == "int8"
    assert handler.config("int8").version == 2
    with pytest.raises(NotFound, match="versions are integers"):
        handler.config("int8", "latest")


async def test_statistics_of_one_version_one_model_or_all(handler: ModelHandler) -> None:
    await handler.infer(InferenceRequest("mlp", "2", {"x": x_rows(4)}), None)
    (one,) = handler.statistics("mlp", "2")
    assert isinstance(one, VersionStats)
    assert (one.model, one.version, one.inference_count, one.execution_count) == ("mlp", 2, 4, 1)
    assert [(s.model, s.version) for s in handler.statistics("mlp", "")] == [("mlp", 2), ("mlp", 3)]
    everything = {(s.model, s.version) for s in handler.statistics("", "")}
    assert everything == {("mlp", 2), ("mlp", 3), ("batched", 1), ("multi", 1), ("int8", 1), ("int8", 2)}
    with pytest.raises(NotFound):
        handler.statistics("nope", "")


def test_repository_index_reports_every_model_and_why_one_is_broken(handler: ModelHandler) -> None:
    index = handler.repository_index(ready_only=False)
    assert all(isinstance(e, RepositoryEntry) for e in index)
    by_key = {(e.name, e.version): e for e in index}
    assert by_key[("mlp", "3")].state == "READY" and ("mlp", "1") not in by_key
    broken = by_key[("broken", "")]
    assert broken.state == "UNAVAILABLE"
    assert "backend: unknown backend 'tensorflow'; registered backends: torchscript, onnxruntime" in broken.reason
    ready = handler.repository_index(ready_only=True)
    assert (
        ready and all(e.state == "READY" for e in ready) and ("broken", "") not in {(e.name, e.version) for e in ready}
    )


async def test_unload_then_load_again(handler: ModelHandler) -> None:
    await handler.unload("multi")
    assert not handler.model_ready("multi", "")
    assert {(e.name, e.state, e.reason) for e in handler.repository_index(False) if e.name == "multi"} == {
        ("multi", "UNAVAILABLE", "unloaded")
    }
    await handler.load("multi")
    assert handler.model_ready("multi", "1")
    with pytest.raises(NotFound, match="not in the repository"):
        await handler.load("nope")
    with pytest.raises(InvalidArgument, match="registered backends: torchscript"):
        await handler.load("broken")


async def test_scraped_metrics_equal_the_statistics_counted_per_batch(handler: ModelHandler) -> None:
    from prometheus_client import REGISTRY

    inputs = [x_rows(1 + i % 3, seed=i) for i in range(20)]
    await asyncio.gather(*(handler.infer(InferenceRequest("batched", "", {"x": x}), deadline=None) for x in inputs))
    with pytest.raises(InvalidArgument):
        await handler.infer(InferenceRequest("batched", "", {"x": x_rows(1)[:, :3]}), deadline=None)
    stats = handler.config("batched").stats
    labels = {"model": "batched", "version": str(stats.version)}

    def sample(name: str, **extra: str) -> float | None:
        return REGISTRY.get_sample_value(name, {**labels, **extra})

    assert stats.execution_count < len(inputs)  # the requests were batched
    assert sample("meshserve_model_requests_total", code="OK") == stats.success.count == len(inputs)
    assert sample("meshserve_model_requests_total", code="INVALID_ARGUMENT") == stats.fail.count == 1
    assert sample("meshserve_model_inferences_total") == stats.inference_count == sum(len(x) for x in inputs)
    assert sample("meshserve_model_executions_total") == stats.execution_count
    assert sample("meshserve_model_queue_duration_seconds_count") == stats.queue.count == len(inputs)
    assert sample("meshserve_model_request_duration_seconds_count") == len(inputs) + 1
    assert sample("meshserve_model_batch_size_count") == stats.execution_count
    assert sample("meshserve_model_batch_size_sum") == stats.inference_count
    rows_per_batch = sum(n * b.compute_infer.count for n, b in stats.batches.items())
    assert rows_per_batch == stats.inference_count
    assert sample("meshserve_model_batch_size_bucket", le="+Inf") == stats.execution_count
    assert sample("meshserve_model_pending_requests") == 0
