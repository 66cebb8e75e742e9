"""Two tiers' trace stores read as one (two real SQLite stores holding the edge's and the cloud's spans of one trace):
the WAN hop as the stage `wan` (the edge's egress span minus the cloud's ingress span, also with the tiers' clocks
apart, or with the gateway's client span as the caller), the cloud's stages prefixed, a batched call's members
attributed the hop, the cloud side missing said; and `meshserve traces` reading both from a two-tier stack.json."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from services.traces import query, web_api
from services.traces.analysis import Trace
from services.traces.cli import app
from services.traces.records import (
    BATCH_INDEX,
    BATCH_MEMBERS,
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    TIER,
    SpanLink,
    SpanRecord,
)
from services.traces.stages import stage_name
from services.traces.store import TraceFilter, TraceStore
from services.traces.tiered import TieredStores
from tests.unit.traces.synthetic import MS, span

runner = CliRunner()
RPC = "inference.GRPCInferenceService/ModelInfer"
TRACE = "ab" * 16


def two_tiers(
    trace: str = TRACE, base_ns: int | None = None, cloud_shift_ms: float = 0.0, egress: bool = True
) -> tuple[list[SpanRecord], list[SpanRecord]]:
    """(edge spans, cloud spans) of one general request answered by the cloud.

    Edge: ingress [0, 50] > gateway rpc [1, 49] > `cloud` [2, 48] > `cloud.batch` [3, 47] > egress [4, 46] (the WAN
    delay in it) > egress upstream [34.5, 45.5]. Cloud, under the upstream span (or under `cloud.batch` without the
    egress), `cloud_shift_ms` later on its clock: ingress [36, 44] > gateway rpc [37, 43] > `model` [38, 42] > model
    rpc [39, 41].
    """
    base = base_ns if base_ns is not None else time.time_ns() - 10 * 10**9
    edge: list[SpanRecord] = []

    def add(
        out: list[SpanRecord],
        parent: SpanRecord | None,
        service: str,
        name: str,
        a: float,
        b: float,
        kind: int = KIND_INTERNAL,
        **attrs: object,
    ) -> SpanRecord:
        s = span(trace, parent.span_id if parent else "", service, name, a, b, kind, base_ns=base, **attrs)
        out.append(s)
        return s

    ingress = add(edge, None, "meshserve-ingress", "ingress", 0, 50, KIND_SERVER, component="proxy")
    gw = add(edge, ingress, "gateway", RPC, 1, 49, KIND_SERVER)
    call = add(edge, gw, "gateway", "cloud", 2, 48)
    caller = batch = add(edge, call, "gateway", "cloud.batch", 3, 47, KIND_CLIENT)
    if egress:
        server = add(edge, batch, "meshserve-egress", "egress", 4, 46, KIND_SERVER, component="proxy")
        caller = add(edge, server, "meshserve-egress", "router cloud egress", 34.5, 45.5, KIND_CLIENT)
    cloud: list[SpanRecord] = []
    s = cloud_shift_ms
    c_ingress = add(cloud, caller, "meshserve-ingress", "ingress", 36 + s, 44 + s, KIND_SERVER, component="proxy")
    c_gw = add(cloud, c_ingress, "gateway", RPC, 37 + s, 43 + s, KIND_SERVER)
    model = add(cloud, c_gw, "gateway", "model", 38 + s, 42 + s)
    add(cloud, model, "model", RPC, 39 + s, 41 + s, KIND_SERVER)
    return edge, cloud


def stores(tmp_path: Path, edge: list[SpanRecord], cloud: list[SpanRecord]) -> list[tuple[str, Path]]:
    """Two real stores, `<tmp>/edge/traces.sqlite` and `<tmp>/cloud/traces.sqlite`, holding these spans."""
    out = []
    for tier, spans in (("edge", edge), ("cloud", cloud)):
        path = tmp_path / tier / "traces.sqlite"
        with TraceStore(path) as store:
            store.insert(spans)
        out.append((tier, path))
    return out


def read(paths: list[tuple[str, Path]], trace: str = TRACE) -> Trace:
    with TieredStores(paths) as both:
        found = query.detail(both, trace)
    assert found is not None
    return found.trace


def ms(ns: int) -> float:
    return round(ns / MS, 6)


def test_one_trace_from_both_stores_each_span_labelled_with_its_tier(tmp_path: Path) -> None:
    edge, cloud = two_tiers()
    trace = read(stores(tmp_path, edge, cloud))
    assert trace.complete and len(trace.nodes) == len(edge) + len(cloud)  # one tree, edge ingress to cloud model
    tiers = {n.span.span_id: n.span.attributes[TIER] for n in trace.nodes}
    assert {tiers[s.span_id] for s in edge} == {"edge"} and {tiers[s.span_id] for s in cloud} == {"cloud"}
    with TieredStores(stores(tmp_path / "again", edge, cloud)) as both:
        (row,) = both.search(TraceFilter())
    assert row.span_count == len(edge) + len(cloud) and ms(row.duration_ns) == 50.0


def test_wan_is_the_egress_span_minus_the_cloud_ingress_span_and_the_cloud_stages_are_prefixed(tmp_path: Path) -> None:
    trace = read(stores(tmp_path, *two_tiers()))
    stages = {stage: ms(ns) for stage, ns in trace.stage_self_ns().items()}
    assert stages["wan"] == 42.0 - 8.0  # egress [4, 46] minus the cloud's ingress [36, 44]
    assert stages == {
        "envoy.ingress": 2.0,
        "gateway.rpc": 2.0,
        "gateway.cloud": 2.0,
        "gateway.cloud.batch": 2.0,
        "wan": 34.0,
        "cloud:envoy.ingress": 2.0,
        "cloud:gateway.rpc": 2.0,
        "cloud:gateway.model": 2.0,
        "cloud:model.rpc": 2.0,
    }
    assert sum(stages.values()) == ms(trace.duration_ns)  # nothing counted twice, nothing lost
    assert trace.remote_missing == 0


def test_wan_does_not_move_with_the_cloud_clock(tmp_path: Path) -> None:
    """The cloud's spans 100 ms later on its clock (outside the edge's spans): the hop is still 34 ms."""
    trace = read(stores(tmp_path, *two_tiers(cloud_shift_ms=100.0)))
    stages = trace.stage_self_ns()
    assert ms(stages["wan"]) == 34.0 and ms(stages["cloud:gateway.model"]) == 2.0


def test_without_an_egress_span_the_gateway_client_span_is_the_wan_hop(tmp_path: Path) -> None:
    trace = read(stores(tmp_path, *two_tiers(egress=False)))
    stages = {stage: ms(ns) for stage, ns in trace.stage_self_ns().items()}
    assert stages["wan"] == 44.0 - 8.0  # cloud.batch [3, 47] minus the cloud's ingress [36, 44]
    assert "gateway.cloud.batch" not in stages and stages["gateway.cloud"] == 2.0


def test_without_the_cloud_store_the_cloud_call_stays_whole_and_is_said_missing(tmp_path: Path) -> None:
    edge, _ = two_tiers(egress=False)
    paths = stores(tmp_path, edge, [])  # the cloud's spans not kept
    trace = read(paths)
    stages = {stage: ms(ns) for stage, ns in trace.stage_self_ns().items()}
    assert stages["gateway.cloud.batch"] == 44.0 and "wan" not in stages
    assert not any(":" in stage for stage in stages) and trace.remote_missing == 1
    with TraceStore(paths[0][1]) as alone:  # the edge's store alone: the same
        result = query.hotspots(alone, TraceFilter())
    assert result.remote_missing == 1
    out = runner.invoke(app, ["hotspots", "--db", str(paths[0][1])])
    assert out.exit_code == 0, out.output
    assert "cloud side missing in 1 of 1 traces" in out.output
    assert web_api.hotspots_json(result)["remote_missing"] == 1  # the UI's report says it too
    shown = runner.invoke(app, ["show", TRACE, "--db", str(paths[0][1])])
    assert shown.exit_code == 0 and "cloud side missing: gateway.cloud is the whole call" in shown.output, shown.output


def test_a_batched_call_s_members_are_attributed_the_wan_hop(tmp_path: Path) -> None:
    """Two requests in one call to the cloud: the second's `cloud` span waited on the first's `cloud.batch`, so its
    breakdown has the hop and the cloud's stages in the same proportions, and its cloud side is not missing."""
    base = time.time_ns() - 10 * 10**9
    edge, cloud = two_tiers(base_ns=base)
    member_trace = "cd" * 16
    member = span(member_trace, "", "gateway", "cloud", 2, 48, base_ns=base)
    batch = next(s for s in edge if s.name == "cloud.batch")
    links = (SpanLink(member_trace, member.span_id, {BATCH_INDEX: 1}),)
    linked = dataclasses.replace(batch, attributes={BATCH_MEMBERS: 2}, links=links)
    edge = [linked if s is batch else s for s in edge] + [member]
    trace = read(stores(tmp_path, edge, cloud), member_trace)
    stages = trace.stage_self_ns()
    assert trace.remote_missing == 0
    # The member's 46 ms: 2 outside the batched call [3, 47], the 44 inside split like the call's subtree's self
    # times (44 ms: the call's own 2, wan 34, the cloud's four stages 2 each).
    assert {stage: ms(ns) for stage, ns in stages.items()} == {
        "gateway.cloud": 2.0,
        "gateway.cloud.batch": 2.0,
        "wan": 34.0,
        "cloud:envoy.ingress": 2.0,
        "cloud:gateway.rpc": 2.0,
        "cloud:gateway.model": 2.0,
        "cloud:model.rpc": 2.0,
    }


def test_hotspots_and_show_read_both_tiers_from_a_two_tier_stack_json(tmp_path: Path) -> None:
    edge, cloud = two_tiers()
    paths = stores(tmp_path, edge, cloud)
    (tmp_path / "stack.json").write_text(
        json.dumps(
            {
                "tiers": {"cloud": str(tmp_path / "cloud"), "edge": str(tmp_path / "edge")},
                "secrets_dir": str(tmp_path / "edge" / "secrets"),  # the top-level state is the edge's
            }
        )
    )
    out = runner.invoke(app, ["hotspots", "--log-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in out.output.splitlines() if "│" in line]
    rows = {row[0]: row for row in cells}
    assert rows["wan"][2] == "34.00" and rows["cloud:gateway.model"][2] == "2.00"  # self p50 ms
    assert "missing" not in out.output and "hotspot: wan (68% of p99)" in out.output
    shown = runner.invoke(app, ["show", TRACE[:8], "--log-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "wan" in shown.output and "cloud:model.rpc" in shown.output and "missing" not in shown.output
    by_db = runner.invoke(app, ["hotspots", "--db", str(paths[0][1]), "--db", str(paths[1][1])])
    assert by_db.exit_code == 0 and "hotspot: wan (68% of p99)" in by_db.output, by_db.output


def test_the_egress_envoy_is_an_envoy_stage_even_without_its_proxy_tag() -> None:
    assert stage_name("meshserve-egress", "ingress", KIND_SERVER) == "envoy.egress"
    assert stage_name("meshserve-egress", "router cloud egress", KIND_CLIENT) == "envoy.egress.upstream"
