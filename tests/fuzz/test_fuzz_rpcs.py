"""Property-based fuzzing of every RPC of every service, as real processes: requests that are merely wrong get a
bad-input status in time, never INTERNAL/UNKNOWN or a hang, and leave the service healthy.

The RPCs come from the generated service descriptors (a new RPC is fuzzed without editing this file). For each,
three kinds of input: arbitrary messages of its request type, valid requests (seeds.py) with one field changed,
and raw bodies (random bytes, valid serializations cut short or with a byte changed) sent without a serializer.
A call passes when it answers OK or a status in ALLOWED (UNIMPLEMENTED only for an RPC the servicer does not
override) within its deadline, with a status message of at most 1 kB; after each RPC's examples every process
is alive, the service is SERVING, its valid requests and its probe succeed and no log got a traceback.

Examples are derandomized (CI sees the same ones every run); the default, 300 per RPC and kind, takes about a
minute on a 2-core machine. To look further locally:
    MESHSERVE_FUZZ_EXAMPLES=3000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/fuzz
MESHSERVE_FUZZ_SEED=<int> draws other examples (reproducibly), and MESHSERVE_FUZZ_STATS=1 (with -s) prints how
each RPC's examples were answered.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from services.cache.servicer import CacheServicer
from services.common.errors import MAX_MESSAGE_BYTES
from services.feature.servicer import FeatureServicer
from services.gateway.servicer import GatewayServicer
from services.model.servicer import ModelServicer
from services.protos import cache_pb2, feature_pb2, inference_pb2
from services.protos import inference_pb2 as pb
from services.traces.servicer import TracesServicer
from tests.fuzz.conftest import FuzzStack
from tests.fuzz.protobuf_strategies import Limits, messages, mutated, raw_bodies
from tests.fuzz.seeds import ADMIN, DEMO_MODELS, PROBES, SEEDS, Seed, export, names
from tests.helpers.servers import health_status

EXAMPLES = int(os.environ.get("MESHSERVE_FUZZ_EXAMPLES", "300"))
SEED = os.environ.get("MESHSERVE_FUZZ_SEED")
STATS = os.environ.get("MESHSERVE_FUZZ_STATS") == "1"
# Generous for a loaded 2-core machine: every RPC here answers in milliseconds, so a call that reaches it hangs.
DEADLINE_S = 10.0
STREAM_READS = 1  # responses read from a server stream before cancelling it (Watch's first event is its reset)
KINDS = ("arbitrary", "mutated", "raw")
LIMITS = Limits(names=names())

# Which process serves which generated service.
SERVICES: dict[str, ServiceDescriptor] = {
    "model": inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    "gateway": inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    "feature": feature_pb2.DESCRIPTOR.services_by_name["FeatureService"],
    "cache": cache_pb2.DESCRIPTOR.services_by_name["CacheService"],
    "traces": trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"],
}
SERVICERS: dict[str, type] = {
    "model": ModelServicer,
    "gateway": GatewayServicer,
    "feature": FeatureServicer,
    "cache": CacheServicer,
    "traces": TracesServicer,
}
# The statuses a request that is merely wrong may get. DEADLINE_EXCEEDED is in none: no input to these RPCs asks
# for work anywhere near DEADLINE_S (batches are bounded by max_batch_size, messages by a few kB, and every
# budget_ms a caller sends only bounds a wait on Redis, which answers at once here).
ALLOWED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
# Headers a caller sends along: the gateway's load and unload are the operator's, so its token is tried too.
METADATA: dict[str, list[tuple[tuple[str, str], ...]]] = {
    "gateway": [(), ADMIN, (("authorization", "Bearer wrong"),), (("authorization", "Basic " + "x" * 2000),)],
}


@dataclass(frozen=True)
class Case:
    service: str
    method: MethodDescriptor

    def __str__(self) -> str:
        return f"{self.service}-{self.method.name}"

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def offered(self) -> bool:
        """Whether the service's servicer implements this RPC (the generated base answers UNIMPLEMENTED)."""
        servicer = SERVICERS[self.service]
        base = next(c for c in servicer.__mro__ if c.__module__.endswith("_pb2_grpc"))
        return getattr(servicer, self.method.name) is not getattr(base, self.method.name)

    @property
    def seeds(self) -> list[Seed]:
        return SEEDS[self.service].get(self.method.name, [])


CASES = [Case(service, method) for service, descriptor in SERVICES.items() for method in descriptor.methods]


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    elapsed_s: float


def invoke(channel: grpc.Channel, case: Case, body: Any, metadata: tuple[tuple[str, str], ...], raw: bool) -> Outcome:
    """One call of the case's RPC with `body` (a message, bytes when `raw`, a list of them for a client stream);
    a server stream is read for at most STREAM_READS responses, then cancelled."""
    method = case.method
    factories: dict[tuple[bool, bool], Callable[..., Any]] = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }
    call = factories[(method.client_streaming, method.server_streaming)](
        case.path,
        request_serializer=None if raw else _serialize,
        response_deserializer=None if raw else GetMessageClass(method.output_type).FromString,
    )
    request = iter(body) if method.client_streaming else body
    start = time.monotonic()
    try:
        if method.server_streaming:
            responses = call(request, timeout=DEADLINE_S, metadata=metadata)
            try:
                for _ in itertools.islice(responses, STREAM_READS):
                    pass
            finally:
                responses.cancel()
        else:
            call(request, timeout=DEADLINE_S, metadata=metadata)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
    return Outcome(code, details, time.monotonic() - start)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def allowed(case: Case) -> frozenset[grpc.StatusCode]:
    return ALLOWED if case.offered else ALLOWED | {grpc.StatusCode.UNIMPLEMENTED}


def shown(body: Any) -> str:
    """The request of a failing example, short enough for a test report."""
    text = repr(body) if isinstance(body, bytes | list) else f"{type(body).__name__} {{{body}}}"
    return text if len(text) <= 2000 else text[:2000] + f"... ({len(text)} characters)"


def check(case: Case, outcome: Outcome, body: Any) -> None:
    """The property: OK or a bad-input status, within the deadline, with a bounded message."""
    what = f"{case}: {outcome.code.name} after {outcome.elapsed_s:.2f}s: {outcome.details[:300]!r}\n{shown(body)}"
    assert outcome.elapsed_s <= DEADLINE_S + 2.0, f"hung past its deadline: {what}"
    # One assertion per kind of failure: Hypothesis keeps one example per failing line, so a fault of the server
    # is never shrunk into an example that fails another way.
    assert outcome.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), what
    assert outcome.code != grpc.StatusCode.DEADLINE_EXCEEDED, what
    assert outcome.code == grpc.StatusCode.OK or outcome.code in allowed(case), what
    assert len(outcome.details.encode()) <= MAX_MESSAGE_BYTES, what


def bodies(case: Case, kind: str) -> st.SearchStrategy[Any]:
    seeds = [s.request for s in case.seeds] or [GetMessageClass(case.method.input_type)()]
    if kind == "arbitrary":
        strategy = messages(case.method.input_type, LIMITS)
    elif kind == "mutated":
        strategy = mutated(seeds, LIMITS)
    else:
        strategy = raw_bodies([s.SerializeToString() for s in seeds], LIMITS)
    return st.lists(strategy, max_size=3) if case.method.client_streaming else strategy


def fuzz_settings(test: Callable[..., None]) -> Callable[..., None]:
    configured = settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=SEED is None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )(test)
    return configured if SEED is None else seed(int(SEED))(configured)


def log_sizes(stack: FuzzStack) -> dict[str, int]:
    return {name: p.log_path.stat().st_size for name, p in stack.services.items()}


def restore_models(stack: FuzzStack) -> None:
    """Load the demo models again where an example (a hostile unload, say) took them away."""
    with grpc.insecure_channel(stack.services["model"].address) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelReady",
            request_serializer=_serialize,
            response_deserializer=pb.ModelReadyResponse.FromString,
        )
        load = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryModelLoad",
            request_serializer=_serialize,
            response_deserializer=pb.RepositoryModelLoadResponse.FromString,
        )
        for name in DEMO_MODELS:
            if not ready(pb.ModelReadyRequest(name=name), timeout=DEADLINE_S).ready:
                load(pb.RepositoryModelLoadRequest(model_name=name), timeout=60)


_probe_ids = itertools.count(1000)


def assert_span_stored(stack: FuzzStack, channel: grpc.Channel) -> None:
    """A fresh span exported now reaches the trace store's file (its writer thread is alive and writing)."""
    trace_id = next(_probe_ids)
    case = Case("traces", SERVICES["traces"].methods_by_name["Export"])
    assert invoke(channel, case, export(trace_id), (), raw=False).code == grpc.StatusCode.OK
    deadline = time.monotonic() + 10
    with sqlite3.connect(f"file:{stack.traces_db}?mode=ro", uri=True) as db:
        while time.monotonic() < deadline:
            (count,) = db.execute("SELECT count(*) FROM spans WHERE trace_id = ?", (f"{trace_id:032x}",)).fetchone()
            if count:
                return
            time.sleep(0.05)
    raise AssertionError(f"an exported span never reached the trace store:\n{stack.services['traces'].log()}")


def assert_healthy(stack: FuzzStack, case: Case, marks: dict[str, int]) -> None:
    """Every process alive; this service SERVING; its valid requests and its probe still succeed; no traceback."""
    for name, process in stack.services.items():
        assert process.process.poll() is None, f"{name} exited during {case}:\n{process.log()}"
    service = stack.services[case.service]
    assert health_status(service.address, timeout=5) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(service.address) as channel:
        for valid in case.seeds:
            outcome = invoke(channel, case, valid.request, valid.metadata, raw=False)
            expected = grpc.StatusCode.OK if case.offered else grpc.StatusCode.UNIMPLEMENTED
            assert outcome.code == expected, f"{case}: a valid request failed after fuzzing: {outcome}"
        if case.service in ("model", "gateway"):
            restore_models(stack)
        rpc, probe = PROBES[case.service]
        probe_case = Case(case.service, SERVICES[case.service].methods_by_name[rpc])
        outcome = invoke(channel, probe_case, probe.request, probe.metadata, raw=False)
        assert outcome.code == grpc.StatusCode.OK, f"{probe_case} failed after fuzzing {case}: {outcome}"
        if case.service == "traces":
            assert_span_stored(stack, channel)
    for name, process in stack.services.items():
        new = process.log_path.read_bytes()[marks[name] :].decode(errors="replace")
        assert "Traceback" not in new, f"{name} logged a traceback during {case}:\n{new[-4000:]}"


def test_every_service_has_rpcs_to_fuzz() -> None:
    """The descriptors list RPCs for every service (an empty list would make this module pass vacuously)."""
    per_service = {name: [c.method.name for c in CASES if c.service == name] for name in SERVICES}
    assert CASES and all(per_service.values()), per_service
    assert {c.service for c in CASES} == set(SERVICERS)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fuzzed_requests_get_a_bad_input_status_and_leave_the_service_healthy(
    stack: FuzzStack, case: Case, kind: str
) -> None:
    marks = log_sizes(stack)
    service = stack.services[case.service]
    raw = kind == "raw"
    answers: Counter[str] = Counter()
    with grpc.insecure_channel(service.address) as channel:

        @fuzz_settings
        @given(body=bodies(case, kind), metadata=st.sampled_from(METADATA.get(case.service, [()])))
        def fuzz(body: Any, metadata: tuple[tuple[str, str], ...]) -> None:
            outcome = invoke(channel, case, body, metadata, raw)
            answers[f"{outcome.code.name} {outcome.details[:60]}"] += 1
            check(case, outcome, body)

        fuzz()
    if STATS:
        print(f"\n{case}-{kind}: " + "; ".join(f"{n}x {answer}" for answer, n in answers.most_common(8)))
    assert_healthy(stack, case, marks)
