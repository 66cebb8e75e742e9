"""bench.peers.pipeline without Ray or a server: Ray Serve's virtualenv (its probe faked; run for real in
tests/integration/bench/peers) and launch, the answer check's comparison and history, and the side-by-side table
with meshserve's targets against Ray Serve."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from bench.lib import cpu
from bench.lib.fraud_load import Run, transaction_values
from bench.peers import pipeline as pp
from services.feature.featureset import load_feature_sets
from services.protos import inference_pb2 as pb

ROOT = Path(__file__).resolve().parents[4]


def pins(lines: list[str]) -> dict[str, str]:
    """name (lower case, extras dropped) -> pinned version, from requirement lines."""
    found = {}
    for line in lines:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;#]+).*", line)
        if m:
            found[m.group(1).lower().replace("_", "-")] = m.group(3)
    return found


def answer(score: float, version: str = "1", degraded: str = "") -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="fraud")
    response.raw_output_contents.append(np.array([[score]], np.float32).tobytes())
    response.parameters["model_version"].string_param = version
    if degraded:
        response.parameters["degraded"].string_param = degraded
    return response


def run(requests: int, seconds: float, latency_ms: float, errors: dict[str, int] | None = None) -> Run:
    return Run(latencies=[latency_ms / 1e3] * requests, seconds=seconds, errors=errors or {})


# ----------------------------------------------------------------------------- Ray Serve's virtualenv


def test_the_ray_venv_is_made_with_the_given_python_then_installs_into_itself(tmp_path: Path) -> None:
    venv, requirements = tmp_path / "ray-venv", tmp_path / "req.txt"

    made, installed = pp.venv_commands(venv, requirements, "/usr/bin/python3.11")

    assert made == ["/usr/bin/python3.11", "-m", "venv", str(venv)]
    assert installed[:3] == [str(venv / "bin" / "python"), "-m", "pip"]  # never the caller's environment
    assert installed[-2:] == ["-r", str(requirements)]


def test_the_ray_requirements_pin_ray_2_60_and_the_services_own_versions_of_what_they_share() -> None:
    ray = pins((ROOT / "tools" / "ray-requirements.txt").read_text().splitlines())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    services = pins(project["dependencies"] + project["optional-dependencies"]["feature"])

    assert ray["ray"] == pp.RAY_VERSION == "2.60.0"
    assert ray["torch"] == pins(project["optional-dependencies"]["model"])["torch"]  # the CPU wheel on disk
    shared = set(ray) & set(services)
    # The repository's generated protos and the feature code run unchanged only on the versions they were made for.
    assert {"protobuf", "grpcio", "numpy", "redis", "pydantic", "pydantic-settings"} <= shared
    assert {name: ray[name] for name in shared} == {name: services[name] for name in shared}


def fake_python(path: Path, exit_code: int) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    path.chmod(0o755)


def test_a_ray_venv_that_fails_the_probe_is_made_then_probed_again(tmp_path: Path, monkeypatch) -> None:
    venv = tmp_path / "ray-venv"
    fake_python(venv / "bin" / "python", 1)
    calls: list[list[str]] = []

    def fake_run(command, **kwargs):
        calls.append(list(command))
        return subprocess.CompletedProcess(command, 1 if len(calls) == 1 else 0)

    monkeypatch.setattr(pp.subprocess, "run", fake_run)
    requirements = ROOT / "tools" / "ray-requirements.txt"

    pp.ensure_ray_venv(venv, requirements)

    probe = [str(venv / "bin" / "python"), "-c", pp.RAY_CHECK]
    assert calls == [probe, *pp.venv_commands(venv, requirements, pp.sys.executable), probe]


def test_ray_peer_launch_serves_version_1_on_the_given_ports_with_the_repository_importable(tmp_path: Path) -> None:
    launch = pp.ray_launch(Path("/venv/bin/python"), 1234, 5678, "redis://127.0.0.1:9", tmp_path, 0.0)

    argv = launch.argv
    assert argv[:3] == ["/venv/bin/python", "-m", "bench.peers.ray_peer"]
    flag = {argv[i]: argv[i + 1] for i in range(3, len(argv), 2)}
    assert flag["--grpc-port"] == "1234" and flag["--http-port"] == "5678"
    assert flag["--redis-url"] == "redis://127.0.0.1:9" and flag["--temp-dir"] == str(tmp_path)
    assert Path(flag["--model-file"]) == ROOT / "models" / "fraud_mlp" / "1" / "model.pt"
    assert flag["--batch-wait-ms"] == "0"
    # the generated messages pickle as `inference_pb2.*`: Ray's processes must import them by that name too
    assert launch.env["PYTHONPATH"].split(":") == [str(ROOT), str(ROOT / "services" / "protos")]
    assert launch.env["RAY_worker_niceness"] == "0"  # as meshserve's services, not Ray's default 15
    assert launch.env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


# ----------------------------------------------------------------------------- the answer check


def test_answers_within_the_tolerance_agree() -> None:
    expected = {1: answer(0.25), 2: answer(0.75)}
    got = {1: answer(0.25 + 4e-6), 2: answer(0.75 - 4e-6)}

    assert pp.differences(expected, got) == []


def test_a_score_beyond_the_tolerance_a_missing_answer_or_another_version_is_named() -> None:
    expected = {1: answer(0.25), 2: answer(0.5), 3: answer(0.75)}
    got = {1: answer(0.25 + 5e-5, degraded="features_degraded"), 3: answer(0.75, version="2")}

    problems = pp.differences(expected, got)

    assert len(problems) == 3
    assert problems[0].startswith("transaction 1: scores") and "degraded: features_degraded, expected no" in problems[0]
    assert problems[1] == "transaction 2: no answer"
    assert problems[2] == "transaction 3: model version '2', expected '1'"


def test_transactions_degraded_on_either_side_are_asked_again() -> None:
    expected = {1: answer(0.1), 2: answer(0.2, degraded="features_degraded"), 3: answer(0.3)}
    got = {1: answer(0.1), 2: answer(0.2), 3: answer(0.0, degraded="features_degraded")}

    assert pp.ask_again(expected, got) == [2, 3]
    assert pp.ask_again({1: answer(0.1)}, {1: answer(0.1)}) == []


def test_history_gives_each_checked_transaction_earlier_events_of_its_own_entities() -> None:
    t0 = 1_700_000_000
    events = pp.history(first=5, count=2, t0=t0, per_transaction=3)
    fs = load_feature_sets(ROOT / "features")["fraud_v1"]

    columns = fs.columns(events, fs.ingest_fields, what="event")  # what the feature service's Ingest accepts

    assert len(columns["event_time"]) == 6
    for n, i in enumerate((5, 6)):
        values = transaction_values(i, t0)
        mine = events[3 * n : 3 * n + 3]
        assert {e["user_id"] for e in mine} == {values["user_id"]}
        assert {e["merchant_id"] for e in mine} == {values["merchant_id"]}
        assert all(e["event_time"] < int(np.asarray(values["event_time"]).item()) for e in mine)


# ----------------------------------------------------------------------------- the report


def test_targets_pass_at_twice_the_throughput_with_a_lower_p99() -> None:
    results = {(pp.MESHSERVE, 32): run(1000, 2.0, 20.0), (pp.RAY, 32): run(400, 2.0, 80.0)}

    throughput, p99 = pp.verdicts(results)

    assert (throughput.value, throughput.result) == (pytest.approx(2.5), "PASS")
    assert (p99.value, p99.result) == (pytest.approx(0.25), "PASS")
    assert throughput.name == "target.c32_throughput_vs_ray" and p99.name == "target.c32_p99_vs_ray"


def test_targets_fail_below_twice_the_throughput_or_at_an_equal_p99() -> None:
    results = {(pp.MESHSERVE, 32): run(790, 2.0, 50.0), (pp.RAY, 32): run(400, 2.0, 50.0)}

    throughput, p99 = pp.verdicts(results)

    assert throughput.result == "FAIL" and p99.result == "FAIL"


def test_targets_are_na_when_a_stack_has_no_answers_at_32() -> None:
    ray_alone = {(pp.RAY, 32): run(400, 2.0, 50.0)}
    all_failed = {(pp.MESHSERVE, 32): Run(errors={"UNAVAILABLE": 9}, seconds=2.0), **ray_alone}

    assert [v.result for v in pp.verdicts(ray_alone)] == ["n/a", "n/a"]
    assert [v.result for v in pp.verdicts(all_failed)] == ["n/a", "n/a"]


def test_the_table_puts_both_stacks_side_by_side_with_their_ratio() -> None:
    latencies = [i / 1e3 for i in range(1, 101)]  # 1..100 ms
    results = {
        (pp.MESHSERVE, 1): Run(latencies=latencies, seconds=1.0, errors={"RESOURCE_EXHAUSTED": 3}),
        (pp.RAY, 1): run(50, 1.0, 10.0),
    }

    rows = pp.table_rows(results, [1, 8])

    assert rows[0] == [1, 100.0, 51.0, 100.0, 3, 50.0, pytest.approx(10.0), pytest.approx(10.0), 0, 2.0]
    assert rows[1] == [8, None, None, None, None, None, None, None, None, None]


def test_report_records_each_cell_the_ratios_and_the_targets(capsys) -> None:
    results = {
        (pp.MESHSERVE, 32): run(1000, 2.0, 20.0),
        (pp.RAY, 32): run(400, 2.0, 80.0),
        (pp.RAY, 1): run(100, 2.0, 10.0),
    }

    figures = {f["name"]: f for f in pp.report(results, [1, 32], "python -m bench.peers.pipeline", 2.0)}

    assert figures["pipeline_peers.meshserve.c32.throughput"]["value"] == 500.0
    assert pp.RAY in figures["pipeline_peers.meshserve.c32.throughput"]["compared_with"]
    assert figures["pipeline_peers.ray.c32.p99"]["value"] == pytest.approx(80.0)
    assert figures["pipeline_peers.c32.meshserve_vs_ray"]["value"] == 2.5
    assert "pipeline_peers.c1.meshserve_vs_ray" not in figures  # meshserve has no c=1 cell here
    assert "pipeline_peers.meshserve.c1.throughput" not in figures
    assert figures["pipeline_peers.target.c32_throughput_vs_ray"]["value"] == 2.5
    assert figures["pipeline_peers.target.c32_p99_vs_ray"]["value"] == 0.25
    assert all(f["command"] == "python -m bench.peers.pipeline" for f in figures.values())
    out = capsys.readouterr().out
    assert "PASS" in out and "mesh/ray" in out


# ----------------------------------------------------------------------------- CPU per request


@pytest.mark.parametrize(
    ("command", "comm", "group"),
    [
        ("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/s", "raylet", "raylet"),
        ("/x/ray/core/src/ray/gcs/gcs_server --gcs_server_port=0", "gcs_server", "GCS"),
        ("ray::ServeReplica:default:Ingress", "ray::ServeRepli", "Ingress"),
        ("ray::ServeReplica:default:Features.handle_request", "ray::ServeRepli", "Features"),
        ("ray::ServeController", "ray::ServeContr", "ServeController"),
        ("ray::ProxyActor.ready", "ray::ProxyActor", "ProxyActor"),
        ("ray::IDLE", "ray::IDLE", "IDLE"),
        ("/x/bin/python -m bench.peers.ray_peer --grpc-port 1", "python", "other"),
        ("/x/bin/python /x/ray/dashboard/agent.py --node-ip-address=127.0.0.1", "python", "other"),
    ],
)
def test_each_ray_process_is_grouped_by_what_it_runs(command: str, comm: str, group: str) -> None:
    assert pp.ray_group(command, comm) == group


def test_ray_processes_are_the_driver_and_everything_below_it() -> None:
    base = 90_000_000  # above any pid_max: no process here has a command line to read
    stats = {
        s.pid: s
        for s in (
            cpu.ProcStat(base, "python", 1, base, 0, 0),
            cpu.ProcStat(base + 1, "raylet", base, base, 0, 0),
            cpu.ProcStat(base + 2, "gcs_server", base, base, 0, 0),
            cpu.ProcStat(base + 3, "python", base + 1, base, 0, 0),
            cpu.ProcStat(base + 9, "valkey-server", 1, 1, 0, 0),
        )
    }

    assert pp.ray_processes(base, stats) == {base: "other", base + 1: "raylet", base + 2: "GCS", base + 3: "other"}


def test_cpu_rows_price_each_stack_per_request_and_ratio_ray_over_meshserve() -> None:
    results = {(pp.MESHSERVE, 8): run(1000, 2.0, 5.0), (pp.RAY, 8): run(500, 2.0, 10.0)}
    spent = {
        (pp.MESHSERVE, 8): {"gateway": 1.8, "Valkey": 0.2, cpu.TOTAL: 2.0},  # 2 ms per request
        (pp.RAY, 8): {"Ingress": 2.0, "raylet": 1.6, "Valkey": 0.1, cpu.TOTAL: 3.7},  # 7.4 ms per request
    }

    rows = pp.cpu_rows(results, spent, [8, 32], usd_per_vcpu_hour=0.036)

    assert rows[0] == [8, pytest.approx(2.0), "0.020", pytest.approx(7.4), "0.074", pytest.approx(3.7)]
    assert rows[1] == [32, None, None, None, None, None]
    assert pp.breakdown_rows(results, spent, [8]) == [
        [pp.MESHSERVE, 8, "gateway 1.80, Valkey 0.20"],
        [pp.RAY, 8, "Ingress 4.00, raylet 3.20, Valkey 0.20"],
    ]


def test_report_with_cpu_records_each_stacks_cpu_and_cost(capsys) -> None:
    results = {(pp.MESHSERVE, 32): run(1000, 2.0, 20.0), (pp.RAY, 32): run(400, 2.0, 80.0)}
    spent = {(pp.MESHSERVE, 32): {cpu.TOTAL: 3.6}, (pp.RAY, 32): {cpu.TOTAL: 4.0}, (pp.RAY, 1): {cpu.TOTAL: 1.0}}

    figures = {f["name"]: f for f in pp.report(results, [1, 32], "cmd", 2.0, spent, usd_per_vcpu_hour=0.05)}

    assert figures["pipeline_peers.meshserve.c32.cpu_ms"]["value"] == 3.6
    assert figures["pipeline_peers.ray.c32.cpu_ms"]["value"] == 10.0
    assert figures["pipeline_peers.meshserve.c32.usd_per_million"]["value"] == 0.05
    assert "pipeline_peers.ray.c1.cpu_ms" not in figures  # no run to count its answers
    out = capsys.readouterr().out
    assert "CPU per answered request" in out and "$0.05 per vCPU-hour" in out
    assert "cpu_ms" not in " ".join(f["name"] for f in pp.report(results, [32], "cmd", 2.0))  # without readings
