"""The pipeline runner with micro-batching, against in-process fake upstreams: concurrent requests share each
stage's call, and each keeps its own answer, degradation, error and deadline."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from services.common.errors import MeshserveError, error_with_code
from services.gateway.domain import Answer, OutputSpec
from services.gateway.runner import PipelineRunner
from services.gateway.upstream import Deadline
from services.gateway.versions import ServingVersions
from tests.unit.gateway.fakes import FakeCache, FakeFeatures, FakeModel, cached, inputs, pipeline, scores

LOOKUP, FEATURES, MODEL = "cache.lookup", "features.compute fs_v1", "model.infer m:"


class Rig:
    def __init__(self, **overrides: object) -> None:
        self.log: list[str] = []
        self.cache = FakeCache(self.log)
        self.features = FakeFeatures(self.log)
        self.model = FakeModel(self.log)
        self.model.echo = True
        versions = ServingVersions(60.0)
        versions.saw("m", "1")
        outputs = {"m": {"score": OutputSpec("FP32", [1])}}
        self.runner = PipelineRunner(
            pipeline(**overrides), self.cache, self.features, self.model, versions, None, outputs
        )

    async def run(self, user: str, amount: float, rows: int = 1, total_s: float = 1.0) -> Answer:
        return await self.runner.run(inputs(rows, user, amount), rows, Deadline(total_s, None), ())

    async def many(self, n: int) -> list[Answer | BaseException]:
        return list(await asyncio.gather(*(self.run(f"user-{i}", float(i)) for i in range(n)), return_exceptions=True))


async def test_concurrent_requests_share_each_stage_and_get_their_own_rows() -> None:
    rig = Rig()
    answers = await rig.many(6)
    await rig.runner.drain_stores()
    assert [scores(a.outputs[0]) for a in answers] == [[pytest.approx(i / 100)] for i in range(6)]
    assert rig.log.count(LOOKUP) == 1 and rig.log.count(FEATURES) == 1 and rig.log.count(MODEL) == 1
    assert len(rig.cache.lookups[0]) == 6 and len(rig.features.rows[0]) == 6
    assert rig.model.inputs[0][0].shape == [6, 3]
    assert len(rig.cache.stored) == 6  # every answer stored under its own key, in one Store
    assert len({key for key, _, _ in rig.cache.stored}) == 6


async def test_batched_answers_equal_unbatched_ones_row_by_row_with_multi_row_requests() -> None:
    on, off = Rig(), Rig(batching={"enabled": False})

    async def mixed(rig: Rig) -> list[list[float]]:
        answers = await asyncio.gather(*(rig.run(f"u{i}", float(i), rows=1 + i % 3) for i in range(9)))
        return [scores(a.outputs[0]) for a in answers]

    assert await mixed(on) == await mixed(off)
    assert on.log.count(MODEL) == 1 and off.log.count(MODEL) == 9


async def test_a_degraded_row_degrades_only_its_own_answer() -> None:
    rig = Rig()
    rig.features.degraded_users = {"user-2"}
    answers = await rig.many(4)
    await rig.runner.drain_stores()
    assert [a.degraded for a in answers] == [None, None, "features_degraded", None]
    assert answers[2].degraded_detail == "1 of 1 rows used default aggregates"
    assert len(rig.cache.stored) == 3  # the degraded answer is not stored


async def test_a_row_the_feature_service_refuses_fails_only_its_own_request() -> None:
    rig = Rig()
    rig.features.refused_users = {"user-1"}
    answers = await rig.many(3)
    assert isinstance(answers[1], MeshserveError) and answers[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert [scores(a.outputs[0]) for a in (answers[0], answers[2])] == [[0.0], [pytest.approx(0.02)]]
    assert [len(rows) for rows in rig.features.rows] == [3, 1, 1, 1]  # the batch, then each member alone


async def test_a_failed_batched_model_call_degrades_each_member_by_its_own_policy() -> None:
    rig = Rig(degradation={"on_model_failure": ["stale_cache", "default"], "fallback_model": None})
    rig.cache.hits = [cached(0.7, stale=True)]  # the first key of every lookup: user-0's only
    rig.model.errors[("m", "")] = error_with_code(grpc.StatusCode.UNAVAILABLE, "model 'm': down")
    answers = await rig.many(2)
    assert [a.degraded for a in answers] == ["model_unavailable:stale_cache", "model_unavailable:default"]
    assert rig.log.count(MODEL) == 1


async def test_one_requests_deadline_passes_while_the_others_wait_for_the_model() -> None:
    rig = Rig(degradation={"on_model_failure": ["default"], "fallback_model": None})
    rig.model.gate = asyncio.Event()
    short = asyncio.ensure_future(rig.run("short", 1.0, total_s=0.05))
    others = [asyncio.ensure_future(rig.run(f"long-{i}", float(i))) for i in range(3)]
    answer = await short
    assert answer.degraded == "model_timeout:default"
    assert not any(t.done() for t in others)
    rig.model.gate.set()
    answers = await asyncio.gather(*others)
    assert [a.degraded for a in answers] == [None, None, None]
    assert [scores(a.outputs[0]) for a in answers] == [[0.0], [pytest.approx(0.01)], [pytest.approx(0.02)]]


async def test_a_cancelled_request_leaves_its_batch_answering_the_others() -> None:
    rig = Rig()
    rig.model.gate = asyncio.Event()
    tasks = [asyncio.ensure_future(rig.run(f"user-{i}", float(i))) for i in range(3)]
    await asyncio.sleep(0.01)
    assert rig.log.count(MODEL) == 1
    tasks[0].cancel()
    rig.model.gate.set()
    answers = await asyncio.gather(*tasks[1:])
    assert [scores(a.outputs[0]) for a in answers] == [[pytest.approx(0.01)], [pytest.approx(0.02)]]
    assert tasks[0].cancelled()


async def test_identical_concurrent_requests_cost_one_row() -> None:
    rig = Rig()
    answers = await asyncio.gather(*(rig.run("same", 5.0) for _ in range(4)), rig.run("other", 7.0))
    assert all(a is answers[0] for a in answers[:4])
    assert rig.model.inputs[0][0].shape == [2, 3]
    assert np.frombuffer(rig.model.inputs[0][0].raw, np.float32)[::3].tolist() == [5.0, 7.0]
