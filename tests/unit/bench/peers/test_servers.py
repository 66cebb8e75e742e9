"""The peers benchmark's in-process parts: the KServe launch it writes, the ModelConfig interceptor both peer shims
add, meshserve's targets computed from perf_analyzer results, and the second attempt at an unstable cell."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import grpc
import pytest

from bench.lib import perf_runs
from bench.lib.perf_analyzer import PerfAnalyzerError, PerfResult
from bench.peers import config_interceptor as peer_grpc
from bench.peers import servers as peers
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture()
def models(tmp_path: Path) -> Path:
    """A repository holding fraud_mlp's committed config.yaml and a stand-in version 1 file."""
    repo = tmp_path / "models"
    (repo / "fraud_mlp" / "1").mkdir(parents=True)
    shutil.copy2(ROOT / "models" / "fraud_mlp" / "config.yaml", repo / "fraud_mlp" / "config.yaml")
    (repo / "fraud_mlp" / "1" / "model.pt").write_bytes(b"")
    return repo


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_kserve_launch_serves_version_1_over_grpc_with_per_request_logging_off(tmp_path: Path, models: Path) -> None:
    launch = peers.write_kserve_folder(tmp_path / "kserve", models, grpc_port=12345)

    assert flag(launch.args, "--grpc_port") == "12345"
    assert flag(launch.args, "--model_name") == "fraud_mlp"
    assert flag(launch.args, "--enable_latency_logging") == "false"
    assert int(flag(launch.args, "--http_port")) not in (8080, 12345)  # KServe's default is the Envoy ingress port
    assert launch.env["KSERVE_LOGLEVEL"] == "WARNING"
    settings = json.loads(Path(flag(launch.args, "--model_settings")).read_text())
    assert settings == {
        "name": "fraud_mlp",
        "version": "1",
        "model_file": str((models / "fraud_mlp" / "1" / "model.pt").resolve()),
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}],
    }


def test_kserve_model_config_is_the_models_own_without_a_batcher(tmp_path: Path, models: Path) -> None:
    launch = peers.write_kserve_folder(tmp_path / "kserve", models, grpc_port=1)
    reply = pb.ModelConfigResponse.FromString(Path(launch.env[peer_grpc.CONFIG_FILE_ENV]).read_bytes())

    config = reply.config
    assert (config.name, config.platform, config.max_batch_size) == ("fraud_mlp", "kserve", 128)
    assert not config.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("features", mc.TYPE_FP32, [64])]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("score", mc.TYPE_FP32, [1])]


def test_mlserver_model_config_names_its_adaptive_batch_size(tmp_path: Path, models: Path) -> None:
    config_file = peers.write_mlserver_folder(tmp_path / "mlserver", models, grpc_port=1)
    config = pb.ModelConfigResponse.FromString(config_file.read_bytes()).config
    assert (config.platform, config.max_batch_size) == ("mlserver", peers.MLSERVER_MAX_BATCH)


async def test_the_wrapped_server_answers_model_config_and_statistics_on_loopback_and_passes_the_rest_on() -> None:
    module = types.SimpleNamespace()
    peer_grpc.wrap_aio_server(module, b"config-bytes", host="127.0.0.1")  # type: ignore[arg-type]

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = module.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ServerLive": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("[::]:0")  # as KServe asks: every interface
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:

            def call(method: str):
                return channel.unary_unary(f"/inference.GRPCInferenceService/{method}")

            assert await call("ModelConfig")(b"", timeout=5) == b"config-bytes"
            assert await call("ModelStatistics")(b"", timeout=5) == b""
            assert await call("ServerLive")(b"live", timeout=5) == b"live"
    finally:
        await server.stop(None)


def result(throughput: float, p50_ms: float, p99_ms: float) -> PerfResult:
    return PerfResult("fraud_mlp", "-", 1, 1, throughput, p50_ms * 1000, p50_ms * 1000, None, p99_ms * 1000)


def verdicts(
    measured: dict[tuple[str, int], PerfResult], measured_peers: tuple[str, ...] = peers.PEERS
) -> dict[str, tuple[float | None, str]]:
    return {t.name: (t.value, t.verdict) for t in peers.targets(lambda s, c: measured.get((s, c)), measured_peers)}


def test_targets_compare_c32_with_the_better_peer_and_c1_with_the_faster_one() -> None:
    measured = {
        (peers.MLSERVER, 32): result(1500, 20, 30),
        (peers.KSERVE, 32): result(1000, 30, 25),  # the lower p99, but the lower throughput
        (peers.MESHSERVE, 32): result(3100, 9, 28),
        (peers.MLSERVER, 1): result(300, 3.0, 4),
        (peers.KSERVE, 1): result(700, 1.2, 2),
        (peers.MESHSERVE, 1): result(1100, 0.9, 1.5),
    }
    got = verdicts(measured)
    assert got["target.c32_throughput_vs_best_peer"] == (pytest.approx(3100 / 1500), "PASS")
    assert got["target.c32_p99_vs_best_peer"] == (pytest.approx(28 / 30), "PASS")
    assert got["target.c1_p50_vs_peers"] == (pytest.approx(0.9 / 1.2), "PASS")

    measured[(peers.MESHSERVE, 32)] = result(2900, 9, 30)
    measured[(peers.MESHSERVE, 1)] = result(700, 1.2, 2)
    got = verdicts(measured)
    assert got["target.c32_throughput_vs_best_peer"][1] == "FAIL"
    assert got["target.c32_p99_vs_best_peer"][1] == "FAIL"  # equal is not lower
    assert got["target.c1_p50_vs_peers"][1] == "FAIL"


def test_targets_compare_with_the_peers_a_run_measures_and_are_na_when_one_of_them_lacks_a_figure() -> None:
    kserve_only = {(peers.KSERVE, 32): result(1000, 30, 25), (peers.MESHSERVE, 32): result(2500, 9, 20)}
    got = verdicts(kserve_only, (peers.KSERVE,))
    assert got["target.c32_throughput_vs_best_peer"] == (pytest.approx(2.5), "PASS")
    assert got["target.c1_p50_vs_peers"] == (None, "n/a")

    # MLServer was asked for but has no c=32 figure: it might have been the better peer.
    assert verdicts(kserve_only)["target.c32_throughput_vs_best_peer"] == (None, "n/a")
    assert all(verdict == "n/a" for _, verdict in verdicts({}).values())


def test_a_cell_perf_analyzer_could_not_stabilise_is_measured_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = [PerfAnalyzerError("... Failed to obtain stable measurement."), result(900, 1.0, 2.0)]
    calls = []

    def fake_run(model: str, url: str, concurrency: int, measurement_ms: int) -> PerfResult:
        calls.append(concurrency)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(perf_runs, "run_perf_analyzer", fake_run)
    bench = peers.PeersBench(3000)
    bench.measure(peers.KSERVE, "127.0.0.1:1", "fraud_mlp", 8)
    assert calls == [8, 8]
    assert bench.get(peers.KSERVE, "fraud_mlp", 8) is not None
    assert bench.errors == []


def test_any_other_perf_analyzer_failure_is_an_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run(model: str, url: str, concurrency: int, measurement_ms: int) -> PerfResult:
        calls.append(concurrency)
        raise PerfAnalyzerError("connection refused")

    monkeypatch.setattr(perf_runs, "run_perf_analyzer", fake_run)
    bench = peers.PeersBench(3000)
    bench.measure(peers.KSERVE, "127.0.0.1:1", "fraud_mlp", 1)
    assert calls == [1]
    assert len(bench.errors) == 1


def test_the_report_shows_a_failed_cell_as_a_gap_and_records_every_measured_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = peers.PeersBench(3000)
    for server in (peers.MLSERVER, peers.KSERVE, peers.MESHSERVE, peers.FLOOR):
        for c in (1, 8, 32):
            bench.perf[(server, "fraud_mlp", c)] = result(1000, 1.0, 2.0)
    del bench.perf[(peers.KSERVE, "fraud_mlp", 8)]

    names = {f["name"] for f in peers.report(bench, "python -m bench.peers")}
    out = capsys.readouterr().out

    assert "peers.fraud_mlp.kserve.c1.throughput" in names
    assert "peers.fraud_mlp.kserve.c8.throughput" not in names
    assert "peers.fraud_mlp.meshserve.c32.vs_kserve" in names
    assert {"peers.target.c32_throughput_vs_best_peer", "peers.target.c1_p50_vs_peers"} <= names
    kserve_c8 = next(line for line in out.splitlines() if line.startswith("kserve 0.21.0") and line.split()[2] == "8")
    assert kserve_c8.split()[3:] == ["-", "-", "-", "-", "-", "-"]
    assert "targets" in out and "FAIL" in out  # equal throughput is not 2x
