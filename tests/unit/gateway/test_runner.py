"""The pipeline runner against in-process fake upstreams: what it calls, in which order, and what it answers.

The degradation order is pinned exactly: each test reads the log of upstream calls the fakes share, and the
answer's `degraded` (cause:remedy) says which remedy answered.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from services.cache.api import CachedValue, L1Cache
from services.common.errors import InvalidArgument, MeshserveError, error_with_code
from services.gateway.degradation import (
    MODEL_FAILURES,
    default_answer,
    feature_failure,
    first_answer,
    model_failure,
    stale_answer,
)
from services.gateway.domain import Answer, OutputSpec
from services.gateway.pipeline import PipelineSpec
from services.gateway.runner import PipelineRunner
from services.gateway.upstream import Deadline
from services.gateway.versions import ServingVersions
from services.model.api import InferResult
from tests.unit.gateway.fakes import FakeCache, FakeFeatures, FakeModel, cached, inputs, pipeline, scores

LOOKUP, FEATURES, MODEL, FALLBACK = "cache.lookup", "features.compute fs_v1", "model.infer m:", "model.infer m:2"
STALE = cached(0.7, stale=True, age_s=42.0)


@dataclass
class Rig:
    spec: PipelineSpec = field(default_factory=pipeline)
    hits: list[CachedValue | None] = field(default_factory=list)
    known_outputs: bool = True  # the refresher has read the model's metadata (the default remedy needs it)
    near: L1Cache | None = None
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cache = FakeCache(self.log, self.hits)
        self.features = FakeFeatures(self.log)
        self.model = FakeModel(self.log)
        self.versions = ServingVersions(60.0)
        self.versions.saw("m", "1")
        outputs = {"m": {"score": OutputSpec("FP32", [1])}} if self.known_outputs else {}
        self.runner = PipelineRunner(
            self.spec, self.cache, self.features, self.model, self.versions, self.near, outputs
        )

    async def run(self, rows: int = 1, user: str = "u", total_s: float = 1.0) -> Answer:
        return await self.runner.run(inputs(rows, user), rows, Deadline(total_s, None), ())

    async def run_tensor(self, features: np.ndarray) -> Answer:
        """A request of a pipeline without a feature stage: the caller's own `features` tensor."""
        return await self.runner.run({"features": features}, len(features), Deadline(1.0, None), ())

    def fail_model(self, code: grpc.StatusCode, version: str = "") -> MeshserveError:
        error = error_with_code(code, f"model 'm': {code.name.lower()} ({version or 'any'})")
        self.model.errors[("m", version)] = error
        return error


def degradation(**changes: object) -> dict[str, object]:
    return {"degradation": changes}


# -- the normal path -----------------------------------------------------------------------------------------


async def test_a_miss_calls_features_then_the_model_and_stores_the_answer() -> None:
    rig = Rig()
    answer = await rig.run(rows=2)
    await rig.runner.drain_stores()
    assert rig.log == [LOOKUP, FEATURES, MODEL, "cache.store m:1"]
    assert (answer.cache, answer.model_version, answer.degraded) == ("miss", "1", None)
    assert scores(answer.outputs[0]) == [pytest.approx(0.9)] * 2
    assert set(answer.stages_ms) == {"cache", "features", "model", "total"}
    assert rig.features.rows[0] == [{"user_id": "u", "amount": 12.5}] * 2
    (matrix,) = rig.model.inputs[0]
    assert (matrix.name, matrix.datatype, matrix.shape) == ("features", "FP32", [2, 3])


async def test_a_fresh_hit_never_calls_features_or_the_model() -> None:
    rig = Rig(hits=[cached(0.3, stale=False)])
    answer = await rig.run()
    assert rig.log == [LOOKUP]
    assert (answer.cache, answer.model_version, answer.degraded) == ("hit", "1", None)
    assert scores(answer.outputs[0]) == [pytest.approx(0.3)]


async def test_a_stale_hit_is_only_a_remedy_the_model_still_answers() -> None:
    rig = Rig(hits=[STALE])
    answer = await rig.run()
    assert rig.log[:3] == [LOOKUP, FEATURES, MODEL]
    assert (answer.cache, answer.degraded) == ("miss", None)


async def test_identical_concurrent_requests_share_one_computation() -> None:
    rig = Rig()
    rig.model.gate = asyncio.Event()
    first = asyncio.ensure_future(rig.run(user="same"))
    second = asyncio.ensure_future(rig.run(user="same"))
    other = asyncio.ensure_future(rig.run(user="other"))
    await asyncio.sleep(0.01)
    rig.model.gate.set()
    a, b, _ = await asyncio.gather(first, second, other)
    assert a is b
    # one row for "same", one for "other" (micro-batched into one call)
    assert sum(call[0].shape[0] for call in rig.model.inputs) == 2


async def test_a_cancelled_leader_leaves_the_waiting_caller_an_answer_computed_again() -> None:
    rig = Rig()
    rig.model.gate = asyncio.Event()
    leader = asyncio.ensure_future(rig.run(user="same"))
    await asyncio.sleep(0.01)  # the leader's model call is in flight
    follower = asyncio.ensure_future(rig.run(user="same"))
    await asyncio.sleep(0.01)
    leader.cancel()
    await asyncio.sleep(0.01)  # the follower runs it again itself
    rig.model.gate.set()
    answer = await follower
    assert leader.cancelled()
    assert (answer.cache, answer.degraded) == ("miss", None) and scores(answer.outputs[0]) == [pytest.approx(0.9)]
    assert rig.log.count(MODEL) == 2  # the cancelled leader's call, then the follower's own


async def test_a_cancelled_follower_leaves_the_leader_alone_and_an_error_reaches_every_caller() -> None:
    rig = Rig()
    rig.model.gate = asyncio.Event()
    leader = asyncio.ensure_future(rig.run(user="same"))
    follower = asyncio.ensure_future(rig.run(user="same"))
    other = asyncio.ensure_future(rig.run(user="same"))
    await asyncio.sleep(0.01)
    follower.cancel()
    await asyncio.sleep(0.01)
    rig.model.gate.set()
    a, c = await asyncio.gather(leader, other)
    assert follower.cancelled() and a is c and rig.log.count(MODEL) == 1

    rig.features.error = InvalidArgument("bad row")  # the shared computation's error, raised to each caller
    results = await asyncio.gather(rig.run(user="again"), rig.run(user="again"), return_exceptions=True)
    assert [type(r) for r in results] == [InvalidArgument, InvalidArgument] and results[0] is results[1]


async def test_a_model_answer_without_a_pipeline_output_is_unavailable() -> None:
    rig = Rig()

    async def no_outputs(*args: object, **kwargs: object) -> InferResult:
        return InferResult("m", "1", [])

    rig.model.infer = no_outputs  # type: ignore[method-assign]
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "without output 'score'" in str(info.value)


# -- model failures: stale cache, then fallback model, then default (as the YAML lists them) --------------------


async def test_model_failure_answers_stale_first() -> None:
    rig = Rig(hits=[STALE])
    error = rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES, MODEL]  # no fallback call: stale came first
    assert (answer.cache, answer.degraded) == ("stale", "model_unavailable:stale_cache")
    assert answer.degraded_detail == f"{error} (cached 42 s ago)"
    assert scores(answer.outputs[0]) == [pytest.approx(0.7)]


async def test_model_failure_without_stale_answers_with_the_fallback_model() -> None:
    rig = Rig()
    error = rig.fail_model(grpc.StatusCode.RESOURCE_EXHAUSTED)
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES, MODEL, FALLBACK]
    assert (answer.cache, answer.model_version, answer.degraded) == ("miss", "2", "model_overloaded:fallback_model")
    assert answer.degraded_detail == f"{error}; answered by m version 2"
    assert scores(answer.outputs[0]) == [pytest.approx(0.2)]


async def test_model_and_fallback_failing_answer_with_the_default() -> None:
    rig = Rig()
    error = rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    rig.fail_model(grpc.StatusCode.UNAVAILABLE, version="2")
    answer = await rig.run(rows=3)
    assert rig.log == [LOOKUP, FEATURES, MODEL, FALLBACK]
    assert (answer.cache, answer.model_version, answer.degraded) == ("miss", "default", "model_unavailable:default")
    assert answer.degraded_detail == str(error)
    (out,) = answer.outputs
    assert (out.name, out.datatype, out.shape) == ("score", "FP32", [3, 1])
    assert scores(out) == [0.5, 0.5, 0.5]


async def test_a_fallback_failing_with_any_error_falls_through() -> None:
    rig = Rig()
    rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    rig.fail_model(grpc.StatusCode.INVALID_ARGUMENT, version="2")
    answer = await rig.run()
    assert answer.degraded == "model_unavailable:default"


@pytest.mark.parametrize(
    ("order", "expected_calls", "degraded"),
    [
        (["stale_cache", "fallback_model", "default"], [], "model_unavailable:stale_cache"),
        (["fallback_model", "stale_cache", "default"], [FALLBACK], "model_unavailable:fallback_model"),
        (["default", "stale_cache", "fallback_model"], [], "model_unavailable:default"),
        (["fallback_model", "default"], [FALLBACK], "model_unavailable:fallback_model"),
    ],
)
async def test_reordering_the_yaml_list_reorders_the_remedies(
    order: list[str], expected_calls: list[str], degraded: str
) -> None:
    rig = Rig(spec=pipeline(**degradation(on_model_failure=order)), hits=[STALE])
    rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES, MODEL, *expected_calls]
    assert answer.degraded == degraded


async def test_with_the_fallback_listed_first_and_failing_stale_is_next() -> None:
    rig = Rig(spec=pipeline(**degradation(on_model_failure=["fallback_model", "stale_cache", "default"])), hits=[STALE])
    rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    rig.fail_model(grpc.StatusCode.UNAVAILABLE, version="2")
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES, MODEL, FALLBACK]
    assert answer.degraded == "model_unavailable:stale_cache"


async def test_a_default_whose_output_shapes_are_unknown_falls_through() -> None:
    """The default needs the model's output shapes (its metadata): never reached, the default cannot answer."""
    spec = pipeline(**degradation(on_model_failure=["default", "stale_cache"]))
    rig = Rig(spec=spec, hits=[STALE], known_outputs=False)
    rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    assert (await rig.run()).degraded == "model_unavailable:stale_cache"


async def test_with_no_remedy_left_the_original_error_is_raised_with_its_code() -> None:
    rig = Rig(known_outputs=False)  # no stale entry, fallback fails, default shapes unknown
    error = rig.fail_model(grpc.StatusCode.RESOURCE_EXHAUSTED)
    rig.fail_model(grpc.StatusCode.UNAVAILABLE, version="2")
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value is error and info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rig.log == [LOOKUP, FEATURES, MODEL, FALLBACK]


async def test_an_empty_remedy_list_raises_the_model_error() -> None:
    rig = Rig(spec=pipeline(**degradation(on_model_failure=[])), hits=[STALE])
    error = rig.fail_model(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value is error


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (grpc.StatusCode.UNAVAILABLE, "model_unavailable"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "model_overloaded"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "model_timeout"),
        (grpc.StatusCode.NOT_FOUND, "model_not_loaded"),
        (grpc.StatusCode.INTERNAL, "model_error"),
        (grpc.StatusCode.UNKNOWN, "model_error"),
        (grpc.StatusCode.CANCELLED, "model_unavailable"),
    ],
)
async def test_each_model_failure_code_has_its_reason(code: grpc.StatusCode, reason: str) -> None:
    rig = Rig(hits=[STALE])
    rig.fail_model(code)
    assert (await rig.run()).degraded == f"{reason}:stale_cache"


async def test_other_model_errors_go_to_the_caller_without_remedy() -> None:
    rig = Rig(hits=[STALE])
    error = rig.fail_model(grpc.StatusCode.FAILED_PRECONDITION)
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value is error and info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert rig.log == [LOOKUP, FEATURES, MODEL]


async def test_a_model_refusing_computed_features_is_a_feature_failure_not_the_caller_s() -> None:
    """The caller never sent the model's input: the feature service computed it (say, an aggregate that
    overflowed), so the model's INVALID_ARGUMENT is answered by the feature remedies, marked degraded."""
    rig = Rig(spec=pipeline(degradation={"on_feature_failure": ["default"]}))
    rig.fail_model(grpc.StatusCode.INVALID_ARGUMENT)
    answer = await rig.run()
    assert (answer.model_version, answer.degraded) == ("default", "features_invalid:default")
    assert answer.default_decision == "review"


async def test_a_model_refusing_the_caller_s_own_tensors_is_the_caller_s_error() -> None:
    spec = pipeline(features=None, inputs=[{"name": "features", "datatype": "FP32", "dims": [4]}])
    rig = Rig(spec=spec, hits=[STALE])
    error = rig.fail_model(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(MeshserveError) as info:
        await rig.run_tensor(np.zeros((1, 4), np.float32))
    assert info.value is error


async def test_a_deadline_spent_before_the_model_call_is_a_model_timeout() -> None:
    # Unbatched, the fake feature call answers after the deadline though handed a shorter timeout (as a
    # feature service whose answer was already on its way).
    rig = Rig(spec=pipeline(batching={"enabled": False}), hits=[STALE])
    rig.features.delay_s = 0.06
    answer = await rig.run(total_s=0.05)
    assert rig.log == [LOOKUP, FEATURES]  # the model was not called at all
    assert answer.degraded == "model_timeout:stale_cache"
    assert "deadline passed before calling model 'm'" in (answer.degraded_detail or "")


# -- feature failures: stale cache, then default ---------------------------------------------------------------


def fail_features(rig: Rig, code: grpc.StatusCode) -> MeshserveError:
    rig.features.error = error_with_code(code, f"feature service: {code.name.lower()}")
    return rig.features.error


async def test_feature_failure_answers_stale_then_default() -> None:
    rig = Rig(hits=[STALE])
    error = fail_features(rig, grpc.StatusCode.UNAVAILABLE)
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES]  # the model is not called without features
    assert (answer.cache, answer.degraded) == ("stale", "features_unavailable:stale_cache")
    assert answer.degraded_detail == f"{error} (cached 42 s ago)"
    assert "features" in answer.stages_ms

    rig = Rig()
    fail_features(rig, grpc.StatusCode.DEADLINE_EXCEEDED)
    answer = await rig.run()
    assert rig.log == [LOOKUP, FEATURES]
    assert (answer.model_version, answer.degraded) == ("default", "features_unavailable:default")
    assert answer.default_decision == "review"  # the pipeline's explicit meaning of a default answer


async def test_feature_remedies_follow_the_yaml_order() -> None:
    rig = Rig(spec=pipeline(**degradation(on_feature_failure=["default", "stale_cache"])), hits=[STALE])
    fail_features(rig, grpc.StatusCode.UNAVAILABLE)
    assert (await rig.run()).degraded == "features_unavailable:default"


async def test_feature_failure_with_no_remedy_raises_the_feature_error() -> None:
    rig = Rig(spec=pipeline(**degradation(on_feature_failure=["stale_cache"])))  # and no stale entry
    error = fail_features(rig, grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value is error and info.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND])
async def test_feature_invalid_argument_and_not_found_go_to_the_caller(code: grpc.StatusCode) -> None:
    rig = Rig(hits=[STALE])
    error = fail_features(rig, code)
    with pytest.raises(MeshserveError) as info:
        await rig.run()
    assert info.value is error and info.value.code == code
    assert rig.log == [LOOKUP, FEATURES]


async def test_degraded_features_are_flagged_and_not_stored() -> None:
    near = L1Cache(1 << 20, 60.0)
    rig = Rig(near=near)
    rig.features.degraded_rows = 1
    answer = await rig.run(rows=2)
    await rig.runner.drain_stores()
    assert (answer.cache, answer.degraded) == ("miss", "features_degraded")
    assert answer.degraded_detail == "1 of 2 rows used default aggregates"
    assert rig.cache.stored == [] and len(near) == 0
    assert rig.log == [LOOKUP, FEATURES, MODEL]


async def test_rows_on_a_store_that_lost_its_data_carry_the_feature_services_reason() -> None:
    rig = Rig()
    rig.features.degraded_rows, rig.features.reason = 1, "features_store_reset"
    answer = await rig.run(rows=2)
    await rig.runner.drain_stores()
    assert (answer.cache, answer.degraded) == ("miss", "features_store_reset")
    assert answer.degraded_detail == "1 of 2 rows: the online store lost its data recently"
    assert rig.cache.stored == []


# -- what is stored, and the near cache ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "break_it",
    [
        lambda rig: (rig.cache.hits.append(STALE), rig.fail_model(grpc.StatusCode.UNAVAILABLE)),
        lambda rig: rig.fail_model(grpc.StatusCode.UNAVAILABLE),
        lambda rig: (rig.fail_model(grpc.StatusCode.UNAVAILABLE), rig.fail_model(grpc.StatusCode.UNAVAILABLE, "2")),
        lambda rig: fail_features(rig, grpc.StatusCode.UNAVAILABLE),
    ],
    ids=["stale", "fallback", "default", "features-default"],
)
async def test_degraded_answers_are_never_stored(break_it) -> None:
    near = L1Cache(1 << 20, 60.0)
    rig = Rig(near=near)
    break_it(rig)
    answer = await rig.run()
    await rig.runner.drain_stores()
    assert answer.degraded is not None
    assert rig.cache.stored == [] and len(near) == 0
    assert not any(call.startswith("cache.store") for call in rig.log)


async def test_a_stored_answer_is_served_from_the_near_cache_without_a_lookup() -> None:
    rig = Rig(near=L1Cache(1 << 20, 60.0))
    first = await rig.run()
    await rig.runner.drain_stores()
    again = await rig.run()
    assert rig.log == [LOOKUP, FEATURES, MODEL, "cache.store m:1"]  # the second request made no call at all
    assert (again.cache, again.model_version) == ("hit", "1")
    assert again.outputs == first.outputs
    assert set(again.stages_ms) == {"cache", "total"}


async def test_a_fresh_hit_from_the_cache_is_kept_near() -> None:
    rig = Rig(hits=[cached(0.3, stale=False)], near=L1Cache(1 << 20, 60.0))
    await rig.run()
    await rig.run()
    assert rig.log == [LOOKUP]


async def test_cache_keys_follow_the_serving_versions_newest_first() -> None:
    rig = Rig()
    rig.versions.saw("m", "2")
    await rig.run()
    (keys,) = rig.cache.lookups
    assert len(keys) == 2
    await rig.runner.drain_stores()
    # the answer (version 1) is stored under version 1's key: the second of the two looked up
    assert rig.cache.stored[0][0] == keys[1]


async def test_without_cache_there_is_no_lookup_and_no_store() -> None:
    rig = Rig(spec=pipeline(cache={"enabled": False}))
    await rig.run()
    await rig.runner.drain_stores()
    assert rig.log == [FEATURES, MODEL]


async def test_a_pipeline_without_features_preprocesses_its_inputs_for_the_model() -> None:
    spec = pipeline(
        features=None,
        inputs=[{"name": "x", "datatype": "FP32", "dims": [2]}],
        preprocess=[{"input": "x", "scale": 0.5, "clip": [0, 1]}],
    )
    rig = Rig(spec=spec)
    answer = await rig.runner.run({"x": np.array([[1.0, 4.0]], np.float32)}, 1, Deadline(1.0, None), ())
    await rig.runner.drain_stores()
    assert rig.log == [LOOKUP, MODEL, "cache.store m:1"]
    (x,) = rig.model.inputs[0]
    assert (x.name, x.shape) == ("x", [1, 2])
    assert np.frombuffer(x.raw, np.float32).tolist() == [0.5, 1.0]
    assert "preprocess" in answer.stages_ms


# -- the policy's parts on their own ------------------------------------------------------------------------


async def test_first_answer_takes_the_first_remedy_that_answers_in_the_listed_order() -> None:
    error = error_with_code(grpc.StatusCode.UNAVAILABLE, "model 'm': down")
    failure = model_failure(error)
    assert failure is not None and failure.reason == "model_unavailable"
    tried: list[str] = []

    def remedy(name: str, answers: bool):
        async def attempt() -> Answer | None:
            tried.append(name)
            return Answer([], name, "miss") if answers else None

        return attempt

    available = {"stale_cache": remedy("stale_cache", False), "default": remedy("default", True)}
    answer = await first_answer(["fallback_model", "stale_cache", "default"], available, failure)
    assert (answer.model_version, tried) == ("default", ["stale_cache", "default"])
    with pytest.raises(MeshserveError) as info:
        await first_answer(["stale_cache"], available, failure)
    assert info.value is error


def test_which_failures_the_policy_answers_for() -> None:
    assert model_failure(error_with_code(grpc.StatusCode.INVALID_ARGUMENT, "bad")) is None
    assert model_failure(error_with_code(grpc.StatusCode.FAILED_PRECONDITION, "no")) is None
    assert set(MODEL_FAILURES.values()) == {
        "model_unavailable",
        "model_overloaded",
        "model_timeout",
        "model_not_loaded",
        "model_error",
    }
    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        assert feature_failure(error_with_code(code, "feature service: caller's")) is None
    failure = feature_failure(error_with_code(grpc.StatusCode.RESOURCE_EXHAUSTED, "feature service: busy"))
    assert failure is not None and failure.reason == "features_unavailable"


def test_default_and_stale_answers() -> None:
    failure = model_failure(error_with_code(grpc.StatusCode.UNAVAILABLE, "model 'm': down"))
    assert failure is not None
    known = {"score": OutputSpec("FP32", [1])}
    assert default_answer(failure, None, ["score"], known, 2) is None  # no default configured
    assert default_answer(failure, {"score": 1.0}, ["score"], {}, 2) is None  # shapes not known
    answer = default_answer(failure, {}, ["score"], known, 2)
    assert answer is not None and scores(answer.outputs[0]) == [0.0, 0.0]  # an output without a value: 0
    assert stale_answer(failure, None) is None
    stale = stale_answer(failure, STALE)
    assert stale is not None and (stale.cache, stale.degraded) == ("stale", "model_unavailable:stale_cache")


# -- stage limits: a busy machine is not a sick dependency ------------------------------------------------------


@pytest.mark.parametrize(("adaptive", "expected"), [(True, None), (False, "features_unavailable:default")])
async def test_a_stage_limit_follows_the_stage_s_healthy_latency(adaptive: bool, expected: str | None) -> None:
    """Feature calls that answer in 15 ms (healthy, on a busy machine) stretch a 20 ms limit to 3x their p99, so
    one at 28 ms still answers whole; with a fixed limit it runs out and the request degrades."""
    timeouts = {"features_ms": 20.0, "adaptive": adaptive}
    rig = Rig(spec=pipeline(timeouts=timeouts, degradation={"on_feature_failure": ["default"]}))
    rig.features.enforce_timeout = True
    rig.features.delay_s = 0.015
    for i in range(40):
        await rig.run(user=f"warm-{i}")
    rig.features.delay_s = 0.028
    answer = await rig.run(user="slow")
    assert answer.degraded == expected


async def test_a_dependency_that_stops_answering_still_trips_the_stretched_limit() -> None:
    rig = Rig(spec=pipeline(degradation={"on_feature_failure": ["default"]}, timeouts={"features_ms": 20.0}))
    rig.features.enforce_timeout = True
    rig.features.delay_s = 0.015
    for i in range(40):
        await rig.run(user=f"warm-{i}")
    rig.features.delay_s = 5.0  # stopped (SIGSTOP): no answer
    started = asyncio.get_running_loop().time()
    answer = await rig.run(user="stuck")
    assert answer.degraded == "features_unavailable:default"
    assert asyncio.get_running_loop().time() - started < 0.5  # at most stretch_max (4) x 20 ms, plus slack
