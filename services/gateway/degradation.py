"""The degradation policy: which remedy answers when a pipeline's model or feature call fails.

The remedies run in the order the pipeline's YAML lists them (`on_model_failure`, `on_feature_failure`): a
stale cached answer, the fallback model, the configured default. The first that can answer does, marked
`degraded: <cause>:<remedy>` (never silently); one that cannot (no stale entry, the fallback failed too, output
shapes not known yet) falls through to the next; with none left the original error goes to the caller. A model
with no serving replica is `cold_start`: its remedies answer only once the request stops waiting for it
(services/gateway/activator.py), never while it is parked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc
import numpy as np

from services.cache.api import CachedValue
from services.common.errors import MeshserveError
from services.common.tensor_codec import NUMPY_DTYPES, encode_raw
from services.gateway.activator import ColdStart
from services.gateway.cache_converters import answer_from_cache
from services.gateway.domain import Answer, OutputSpec
from services.model.api import RawTensor

# Model failures the policy answers for, by cause; any other code (e.g. INVALID_ARGUMENT) goes to the caller.
MODEL_FAILURES = {
    grpc.StatusCode.UNAVAILABLE: "model_unavailable",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "model_overloaded",
    grpc.StatusCode.DEADLINE_EXCEEDED: "model_timeout",
    grpc.StatusCode.NOT_FOUND: "model_not_loaded",
    grpc.StatusCode.INTERNAL: "model_error",
    grpc.StatusCode.UNKNOWN: "model_error",
    grpc.StatusCode.CANCELLED: "model_unavailable",
}
# Feature failures that are the caller's (a bad field, an unknown feature set), not the service's.
FEATURE_CALLER_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
FEATURES_UNAVAILABLE = "features_unavailable"
COLD_START = "cold_start"  # the model has no serving replica and the request waits no longer (or not at all)
FEATURES_INVALID = "features_invalid"  # the model refused features the feature service computed (e.g. overflowed)

Remedy = Callable[[], Awaitable[Answer | None]]


class Failure(Exception):
    """An upstream call failed in a way the policy answers for: `reason` names the cause, `error` is passed on
    (its status code kept) when no remedy answers."""

    def __init__(self, reason: str, error: MeshserveError) -> None:
        super().__init__(str(error))
        self.reason = reason
        self.error = error


def model_failure(error: MeshserveError) -> Failure | None:
    """The Failure a failed model call is, or None when its error goes to the caller as it is."""
    if isinstance(error, ColdStart):
        return Failure(COLD_START, error)
    reason = MODEL_FAILURES.get(error.code)
    return None if reason is None else Failure(reason, error)


def feature_failure(error: MeshserveError) -> Failure | None:
    """The Failure a failed feature call is, or None when its error is the caller's."""
    return None if error.code in FEATURE_CALLER_ERRORS else Failure(FEATURES_UNAVAILABLE, error)


def stale_answer(failure: Failure, stale: CachedValue | None) -> Answer | None:
    """The stale cached answer, if the lookup found one."""
    if stale is None:
        return None
    answer = answer_from_cache(stale, "stale")
    answer.degraded = f"{failure.reason}:stale_cache"
    answer.degraded_detail = f"{failure.error} (cached {stale.age_s:.0f} s ago)"
    return answer


def default_answer(
    failure: Failure,
    values: Mapping[str, float] | None,
    outputs: Sequence[str],
    known: Mapping[str, OutputSpec],
    rows: int,
) -> Answer | None:
    """Every output filled with its configured value, if there is a default and the output shapes are known
    (they are learnt from the model's metadata: a model never reached has none)."""
    if values is None or any(n not in known for n in outputs):
        return None
    tensors = []
    for name in outputs:
        spec = known[name]
        array = np.full([rows, *spec.dims], values.get(name, 0.0), dtype=NUMPY_DTYPES[spec.datatype])
        datatype, shape, raw = encode_raw(array)
        tensors.append(RawTensor(name, datatype, shape, raw))
    return Answer(tensors, "default", "miss", f"{failure.reason}:default", str(failure.error))


async def first_answer(remedies: Sequence[str], available: Mapping[str, Remedy], failure: Failure) -> Answer:
    """The answer of the first listed remedy that can give one; else the original error is raised."""
    for remedy in remedies:
        attempt = available.get(remedy)
        if attempt is not None:
            answer = await attempt()
            if answer is not None:
                return answer
    raise failure.error
