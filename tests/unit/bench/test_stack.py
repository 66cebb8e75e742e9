"""bench.stack's in-process parts: the distinct-transaction input files, the targets and figures computed from
perf_analyzer results, the `meshserve up` command, and the leg-by-leg reading of a traced request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import stack
from bench.lib import cpu, results
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


# ----------------------------------------------------------------------------- the CPU table

STATE = {
    "admin": None,
    "services": [
        {"name": "traces", "pid": 10},
        {"name": "valkey", "pid": 11},
        {"name": "model-v1-a", "pid": 12},
        {"name": "model-v1-b", "pid": 13},
        {"name": "model-v2", "pid": 14},
        {"name": "feature", "pid": 15},
        {"name": "cache", "pid": 16},
        {"name": "envoy", "pid": 17},
        {"name": "gateway-a", "pid": 18},
        {"name": "gateway-b", "pid": 19},
        {"name": "scaler", "pid": 20},
        {"name": "gone", "pid": None},
    ],
}


def test_stack_json_processes_go_to_their_columns_replicas_together() -> None:
    assert stack.stack_processes(STATE) == {
        10: "trace store",
        11: "Valkey",
        12: "model",
        13: "model",
        14: "model",
        15: "feature",
        16: "cache",
        17: "Envoy",
        18: "gateway",
        19: "gateway",
        20: "other",  # a service none of the named columns is still counts in the total
    }
    assert stack.process_column("gateway") == "gateway"
    assert stack.process_column("modeler") == "other"  # a prefix only with its dash


def test_cpu_per_request_sums_replicas_over_the_answers_the_ingress_counted() -> None:
    before = {pid: cpu.ProcStat(pid, "p", 1, 1, 1000, pid) for pid in range(10, 21)}
    # over the run: 1 s of CPU per model replica, 0.5 s per gateway, 0.1 s everywhere else (100 ticks a second)
    used = {12: 100, 13: 100, 14: 100, 18: 50, 19: 50}
    after = {pid: cpu.ProcStat(pid, "p", 1, 1, 1000 + used.get(pid, 10), pid) for pid in range(10, 21)}
    seconds = cpu.group_seconds(cpu.spent(before, after, ticks_per_s=100), stack.stack_processes(STATE))

    cell = stack.CpuCell(stack.ALL_MISS, 8, perf(250.0, 30.0, concurrency=8), answers=1000, seconds=seconds)

    ms = cell.per_request_ms
    assert ms is not None
    assert ms["model"] == pytest.approx(3.0) and ms["gateway"] == pytest.approx(1.0)
    assert ms["Envoy"] == pytest.approx(0.1) and ms["other"] == pytest.approx(0.1)
    assert ms[cpu.TOTAL] == pytest.approx(3.0 + 1.0 + 6 * 0.1)


STABLE = perf(125.0, 7.6)


def cpu_cell(
    traffic: str,
    c: int,
    total_s: float,
    answers: int = 1000,
    run: PerfResult | None = STABLE,
    elapsed_s: float = 0.0,
    hits: float | None = None,
) -> stack.CpuCell:
    """A cell whose processes spent `total_s` of CPU over `answers`: 40% gateway, 20% Envoy, 40% model."""
    seconds = {"gateway": 0.4 * total_s, "Envoy": 0.2 * total_s, "model": 0.4 * total_s, cpu.TOTAL: total_s}
    return stack.CpuCell(traffic, c, run, answers, seconds, elapsed_s, hits)


def test_cpu_rows_show_each_process_per_request_and_the_price_of_a_million() -> None:
    cells = [cpu_cell(stack.ALL_MISS, 1, 9.4, hits=0.0), cpu_cell(stack.ZIPF, 1, 3.6, hits=0.925)]

    rows = stack.cpu_rows(cells, usd_per_vcpu_hour=0.05)

    assert stack.CPU_HEADERS[:5] == ["traffic", "c", "req/s", "p50 ms", "hits"]
    assert stack.CPU_HEADERS[5:] == [*stack.PROCESSES, "total", "$ per 1M"]
    by_column = dict(zip(stack.CPU_HEADERS, rows[0], strict=True))
    assert by_column["req/s"] == 125.0 and by_column["p50 ms"] == pytest.approx(7.6)
    assert by_column["gateway"] == pytest.approx(3.76) and by_column["total"] == pytest.approx(9.4)
    assert by_column["cache"] is None  # no process of that column in this cell
    assert by_column["$ per 1M"] == f"{9.4 / 3.6 * 0.05:.3f}"
    assert rows[1][4] == "92%" and rows[1][-1] == "0.050"  # 3.6 ms a request: a million is one vCPU-hour
    table = results.format_table(stack.CPU_HEADERS, rows)
    assert "trace store" in table and "9.40" in table and "0.131" in table


def test_a_run_perf_analyzer_did_not_measure_keeps_its_cpu_and_a_run_without_answers_shows_none() -> None:
    unstable = cpu_cell(stack.ALL_MISS, 32, 2.0, answers=400, run=None, elapsed_s=2.0)
    failed = cpu_cell(stack.ZIPF, 32, 0.5, answers=0, run=None, elapsed_s=2.0)

    rows = stack.cpu_rows([unstable, failed], usd_per_vcpu_hour=0.05)

    assert rows[0][2:4] == ["~200", None] and rows[0][-2] == pytest.approx(5.0)
    assert rows[1] == [stack.ZIPF, 32, *([None] * (len(stack.CPU_HEADERS) - 2))]


def test_cpu_figures_name_traffic_concurrency_and_process() -> None:
    cells = [cpu_cell(stack.ALL_MISS, 1, 9.4), cpu_cell(stack.ZIPF, 32, 3.6), cpu_cell(stack.ZIPF, 8, 1.0, answers=0)]

    figures = {f["name"]: f for f in stack.cpu_figures(cells, 0.05, "python -m bench.stack")}

    assert figures["stack.cpu.all_miss.c1.total_ms"]["value"] == 9.4
    assert figures["stack.cpu.all_miss.c1.gateway_ms"]["value"] == pytest.approx(3.76)
    assert figures["stack.cpu.zipf.c32.usd_per_million"]["value"] == pytest.approx(0.05)
    assert "$0.05 per vCPU-hour" in figures["stack.cpu.zipf.c32.usd_per_million"]["compared_with"]
    assert "stack.cpu.all_miss.c1.cache_ms" not in figures
    assert not any(name.startswith("stack.cpu.zipf.c8") for name in figures)  # no answers, no figure


def test_the_zipf_file_repeats_transactions_that_no_all_miss_file_holds(tmp_path: Path) -> None:
    files = stack.InputFiles(tmp_path, n=300, t0=1_700_000_000)
    miss = json.loads(files.next().read_text())["data"]

    zipf = files.zipf(pool=200, n=1000)

    assert zipf.next() == zipf.next()  # every run of the Zipf cells reads the one file
    entries = json.loads(zipf.next().read_text())["data"]
    users = [entry["user_id"][0] for entry in entries]
    assert len(users) == 1000 and 20 < len(set(users)) <= 200
    top = max(set(users), key=users.count)
    assert users.count(top) > 1000 / 200 * 5  # Zipf: the most popular far above a uniform draw's share
    assert not set(users) & {entry["user_id"][0] for entry in miss}
    assert not set(users) & {entry["user_id"][0] for entry in json.loads(files.next().read_text())["data"]}


def test_answers_are_the_gateways_ok_answers_between_two_readings_and_hits_their_share_from_the_cache() -> None:
    before = {("OK", "hit"): 100.0, ("OK", "miss"): 50.0, ("RESOURCE_EXHAUSTED", "none"): 7.0}
    after = {
        ("OK", "hit"): 190.0,
        ("OK", "miss"): 80.0,
        ("OK", "stale"): 0.0,
        ("RESOURCE_EXHAUSTED", "none"): 40.0,  # refused: not an answer
        ("UNAVAILABLE", "miss"): 3.0,
    }

    assert stack.answers_between(before, after) == (120, pytest.approx(0.75))
    assert stack.answers_between(after, after) == (0, None)


def test_without_the_mesh_there_is_no_ingress_count() -> None:
    assert stack.ingress_requests({"admin": None}) is None


def test_the_ray_serve_peer_recorded_cost_is_priced_at_this_runs_price() -> None:
    recorded = {
        "pipeline_peers.meshserve.c8.cpu_ms": {"value": 3.6, "time": "2026-12-05T10:00:00+00:00"},
        "pipeline_peers.ray.c8.cpu_ms": {"value": 7.2, "time": "2026-12-05T10:00:00+00:00"},
        "pipeline_peers.ray.c32.cpu_ms": {"value": 5.4, "time": "2026-12-05T10:00:00+00:00"},
        "pipeline_peers.ray.c32.throughput": {"value": 400.0},
        "stack.cpu.all_miss.c1.total_ms": {"value": 9.4},
    }

    rows = stack.peer_rows(recorded, usd_per_vcpu_hour=0.1)

    assert rows == [
        [8, 3.6, "0.100", 7.2, "0.200", "2026-12-05T10:00:00+00:00"],
        [32, None, None, 5.4, "0.150", "2026-12-05T10:00:00+00:00"],
    ]


def test_report_prints_the_cpu_table_after_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    stack_r, floor_r = {1: perf(100.0, 10.0)}, {1: perf(2000.0, 0.5)}

    code = stack.report(stack_r, floor_r, [], "python -m bench.stack", True, 0.0, [cpu_cell(stack.ALL_MISS, 1, 9.4)])

    out = capsys.readouterr().out
    assert code == 0
    assert out.index("targets") < out.index("CPU ms per request") and "$0.0504 per vCPU-hour" in out
    assert "recorded in" not in out  # --no-record


def test_report_without_cpu_cells_prints_what_it_printed_before(capsys: pytest.CaptureFixture[str]) -> None:
    stack.report({1: perf(100.0, 10.0)}, {1: perf(2000.0, 0.5)}, [], "python -m bench.stack", True, 0.0)

    assert "CPU ms per request" not in capsys.readouterr().out


def test_the_cost_targets_read_the_all_miss_c32_cell_and_the_c1_p50() -> None:
    cells = [cpu_cell(stack.ZIPF, 32, 0.5), cpu_cell(stack.ALL_MISS, 32, 2.0)]  # 2.0 ms a request, 0.8 in the gateway

    checks = {t.name: t for t in stack.cost_targets({1: perf(120, 4.2)}, cells)}

    total, gateway, p50 = (
        checks[f"target.{n}"] for n in ("all_miss_c32_total_cpu_ms", "all_miss_c32_gateway_cpu_ms", "c1_p50_ms")
    )
    assert (total.value, total.verdict) == (pytest.approx(2.0), "FAIL")
    assert (gateway.value, gateway.verdict) == (pytest.approx(0.8), "FAIL")
    assert (p50.value, p50.verdict) == (pytest.approx(4.2), "PASS")
    assert all(t.verdict == "n/a" for t in stack.cost_targets({}, [cells[0]]))  # no all-miss c=32 cell, no c=1 run
