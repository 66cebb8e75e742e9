"""bench.stack's in-process parts: the distinct-transaction input files, the targets and figures computed from
perf_analyzer results, the `meshserve up` command, and the leg-by-leg reading of a traced request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import stack
from bench.lib.local_stack import up_command
from bench.lib.perf_analyzer import PerfResult
from services.traces.analysis import assemble
from services.traces.records import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord


def perf(throughput: float, p50_ms: float, p99_ms: float = 0.0, concurrency: int = 1) -> PerfResult:
    return PerfResult(
        model="fraud",
        url="127.0.0.1:1",
        concurrency=concurrency,
        batch=1,
        throughput=throughput,
        p50_us=p50_ms * 1000,
        p90_us=p50_ms * 1000,
        p95_us=None,
        p99_us=p99_ms * 1000,
        command=f"perf_analyzer -m fraud --concurrency-range {concurrency}:{concurrency}",
    )


def test_input_files_hold_distinct_transactions_and_no_two_files_share_one(tmp_path: Path) -> None:
    files = stack.InputFiles(tmp_path, n=50, t0=1_700_000_000)
    first, second = (json.loads(files.next().read_text())["data"] for _ in range(2))

    users = [entry["user_id"][0] for entry in first + second]
    assert len(users) == len(set(users)) == 100
    entry = first[0]
    assert set(entry) == {
        "event_time",
        "user_id",
        "merchant_id",
        "device_id",
        "amount",
        "country",
        "channel",
        "mcc",
        "card_present",
        "account_age_days",
    }
    assert all(isinstance(v, list) and len(v) == 1 for v in entry.values())  # one row: [1, 1] tensors, flattened
    assert isinstance(entry["card_present"][0], bool) and isinstance(entry["event_time"][0], int)


def test_the_same_transaction_index_gives_the_same_entry() -> None:
    assert stack.transaction_entry(7, 1_700_000_000) == stack.transaction_entry(7, 1_700_000_000)
    assert stack.transaction_entry(7, 1_700_000_000) != stack.transaction_entry(8, 1_700_000_000)


def test_targets_are_ratios_to_the_floor_of_the_same_run() -> None:
    floor = {1: perf(2000, 0.5), 8: perf(5000, 1.2, concurrency=8)}
    passing = stack.targets({1: perf(120, 2.9), 8: perf(600, 20, concurrency=8)}, floor)
    failing = stack.targets({1: perf(120, 3.1), 8: perf(500, 20, concurrency=8)}, floor)

    assert [t.name for t in passing] == ["target.c1_p50_vs_floor", "target.c8_throughput_vs_floor"]
    assert passing[0].value == pytest.approx(5.8) and passing[0].verdict == "PASS"
    assert passing[1].value == pytest.approx(0.12) and passing[1].verdict == "PASS"
    assert [t.verdict for t in failing] == ["FAIL", "FAIL"]
    assert stack.C8_THROUGHPUT_LEAST == pytest.approx(3 * 80 / 2261)
    assert passing[0].bound == "<= 6" and passing[1].bound == ">= 0.106"


def test_a_missing_measurement_leaves_its_target_unjudged() -> None:
    checks = stack.targets({1: perf(120, 3.0)}, {1: perf(2000, 0.5)})
    assert checks[1].value is None and checks[1].verdict == "n/a"


def test_figures_name_both_servers_at_each_concurrency_and_the_targets() -> None:
    figures = stack.figures({1: perf(120, 3.0, 9.0)}, {1: perf(2000, 0.5, 0.9)}, command="python -m bench.stack")
    by_name = {f["name"]: f for f in figures}

    assert by_name["stack.stack.c1.p50"]["value"] == 3.0
    assert by_name["stack.floor.c1.throughput"]["value"] == 2000
    assert "bare" in by_name["stack.stack.c1.p99"]["compared_with"]
    assert by_name["stack.target.c1_p50_vs_floor"]["value"] == 6.0
    assert by_name["stack.target.c8_throughput_vs_floor"]["value"] is None
    assert all(f["command"].startswith("python -m bench.stack") for f in figures)


def test_median_result_is_one_real_run() -> None:
    runs = [perf(100, 9.0), perf(110, 7.0), perf(105, 8.0)]
    assert stack.median_result(runs) is runs[2]
    assert stack.median_result(runs[:2]).p50_ms == 7.0  # even count: the lower middle


def test_table_rows_put_stack_and_floor_side_by_side() -> None:
    rows = stack.table_rows({1: perf(100, 5.0, 9.0)}, {1: perf(2000, 0.5, 1.0)})
    assert rows == [[1, 100, 5.0, 9.0, 2000, 0.5, 1.0, 0.05, 10.0]]


def test_up_command_is_meshserve_up_headless_on_free_ports(tmp_path: Path) -> None:
    argv = up_command(tmp_path, ["--no-traces"])
    assert argv[1:5] == ["-m", "services.cli.main", "up", "--port-base"]
    assert argv[5] == "0" and argv[argv.index("--log-dir") + 1] == str(tmp_path)
    assert "--demo" not in argv and argv[-1] == "--no-traces"


def span(span_id: str, parent: str, service: str, name: str, kind: int, start_ms: float, end_ms: float) -> SpanRecord:
    return SpanRecord("t1", span_id, parent, service, name, kind, int(start_ms * 1e6), int(end_ms * 1e6))


def test_hop_legs_split_each_call_through_the_mesh_into_its_legs() -> None:
    spans = [
        span("a", "", "meshserve-ingress", "ingress", KIND_SERVER, 0.0, 10.0),
        span("b", "a", "meshserve-ingress", "router gateway egress", KIND_CLIENT, 0.1, 9.9),
        span("c", "b", "gateway", "inference.GRPCInferenceService/ModelInfer", KIND_SERVER, 0.7, 9.6),
        span("d", "c", "gateway", "features", KIND_INTERNAL, 1.0, 4.0),
        span("e", "d", "feature-sidecar", "ingress", KIND_SERVER, 1.2, 3.6),
        span("f", "e", "feature-sidecar", "router feature egress", KIND_CLIENT, 1.3, 3.5),
        span("g", "f", "feature", "meshserve.feature.FeatureService/Compute", KIND_SERVER, 2.0, 3.3),
    ]
    legs = stack.hop_legs(assemble(spans))

    assert set(legs) == {"gateway ModelInfer", "feature Compute"}
    (feature,) = legs["feature Compute"]
    assert feature == pytest.approx(
        {
            "caller to Envoy": 0.2,
            "Envoy to callee": 0.7,
            "callee": 1.3,
            "callee to Envoy": 0.2,
            "Envoy to caller": 0.4,
        }
    )
    (ingress,) = legs["gateway ModelInfer"]
    assert "caller to Envoy" not in ingress and ingress["Envoy to callee"] == pytest.approx(0.6)

    rows = {row[0]: row for row in stack.hop_rows(legs)}
    assert rows["feature Compute"][1] == 1
    assert rows["feature Compute"][-1] == pytest.approx(1.5)  # the four legs outside the callee
    assert rows["gateway ModelInfer"][2] is None and rows["gateway ModelInfer"][-1] == pytest.approx(0.9)
