"""`make bench-peers`: fraud_mlp on MLServer 1.7.1, KServe 0.21.0, meshserve and the floor, and meshserve's targets."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.lib import results
from bench.lib.model_repo import FRAUD, MODELS, copy_fraud
from bench.lib.perf_analyzer import PerfResult, ensure_perf_analyzer
from bench.lib.perf_runs import FLOOR, FRAUD_CONCURRENCY, ON, Bench, perf_cells
from bench.lib.results import ratio
from bench.lib.serving import ROOT, free_port
from bench.peers.config_interceptor import CONFIG_FILE_ENV
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc

MLSERVER = "mlserver 1.7.1"
KSERVE = "kserve 0.21.0"
MESHSERVE = f"meshserve ({ON})"
PEERS = (MLSERVER, KSERVE)
SERVERS = {"mlserver": MLSERVER, "kserve": KSERVE, "meshserve": MESHSERVE, "floor": FLOOR}
# How each peer is set up, for the figures' "compared with".
PEER_SETUP = {
    MLSERVER: "parallel_workers 0, adaptive batching 32/2ms",
    KSERVE: "ModelServer, one process, no batching, latency logging off",
}
TOOLS = ROOT / ".bench-tools"
MLSERVER_VENV = TOOLS / "mlserver-venv"
MLSERVER_PINS = ("mlserver==1.7.1", "uvloop<0.22", "torch==2.13.0")  # torch pinned: the local CPU wheel
MLSERVER_MAX_BATCH = 32
MLSERVER_MAX_BATCH_TIME_S = 0.002
KSERVE_VENV = TOOLS / "kserve-venv"
KSERVE_REQUIREMENTS = ROOT / "tools" / "kserve-requirements.txt"
KSERVE_LOG_LEVEL = "WARNING"  # KServe's default, INFO, logs every gRPC call (its LoggingInterceptor)
PREFIX = "peers"
UNSTABLE = "Failed to obtain stable measurement"  # perf_analyzer's words


def _ensure_venv(venv: Path, install: Sequence[str], check: str, shown: str) -> Path:
    """A virtualenv at `venv` made with `pip install *install` unless `check` already passes there; its python."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", check]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing {shown} into {venv.relative_to(ROOT)} ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *install], check=True)
    subprocess.run(probe, check=True)
    return python


def ensure_mlserver_venv() -> Path:
    """MLServer 1.7.1 in its own virtualenv (.bench-tools/mlserver-venv); returns its python."""
    check = "import mlserver, torch, sys; sys.exit(mlserver.__version__ != '1.7.1')"
    return _ensure_venv(MLSERVER_VENV, MLSERVER_PINS, check, ", ".join(MLSERVER_PINS))


def ensure_kserve_venv() -> Path:
    """KServe 0.21.0 in its own virtualenv (.bench-tools/kserve-venv, from tools/kserve-requirements.txt)."""
    check = "import kserve, torch, sys; from importlib.metadata import version; sys.exit(version('kserve') != '0.21.0')"
    shown = str(KSERVE_REQUIREMENTS.relative_to(ROOT))
    return _ensure_venv(KSERVE_VENV, ["-r", str(KSERVE_REQUIREMENTS)], check, shown)


def fraud_config(models: Path) -> dict[str, Any]:
    """fraud_mlp's config.yaml (name filled in)."""
    config = yaml.safe_load((models / FRAUD / "config.yaml").read_text())
    config.setdefault("name", FRAUD)
    return config


def model_config_bytes(config: dict[str, Any], platform: str, max_batch_size: int) -> bytes:
    """The Triton ModelConfigResponse perf_analyzer needs, serialised (neither peer has ModelConfig)."""
    dtype = {"FP32": mc.TYPE_FP32}
    message = mc.ModelConfig(
        name=config["name"],
        platform=platform,
        backend=platform,
        max_batch_size=max_batch_size,
        input=[mc.ModelInput(name=t["name"], data_type=dtype[t["datatype"]], dims=t["dims"]) for t in config["inputs"]],
        output=[
            mc.ModelOutput(name=t["name"], data_type=dtype[t["datatype"]], dims=t["dims"]) for t in config["outputs"]
        ],
    )
    return pb.ModelConfigResponse(config=message).SerializeToString()


def _tensors(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """v2 tensor metadata (batch dimension -1) from config.yaml's inputs or outputs."""
    return [{"name": t["name"], "datatype": t["datatype"], "shape": [-1, *t["dims"]]} for t in specs]


def write_mlserver_folder(folder: Path, models: Path, grpc_port: int) -> Path:
    """settings.json + fraud_mlp/model-settings.json for MLServer; returns the ModelConfig bytes file."""
    config = fraud_config(models)
    settings = {
        "debug": False,  # MLServer defaults to debug, which logs every request
        "parallel_workers": 0,
        "host": "127.0.0.1",
        "grpc_port": grpc_port,
        "http_port": free_port(),
        "metrics_port": free_port(),
    }
    model_settings = {
        "name": FRAUD,
        "implementation": "bench.peers.mlserver_shim.TorchScriptRuntime",
        "parameters": {"uri": str((models / FRAUD / "1" / "model.pt").resolve()), "version": "1"},
        "max_batch_size": MLSERVER_MAX_BATCH,
        "max_batch_time": MLSERVER_MAX_BATCH_TIME_S,
        "inputs": _tensors(config["inputs"]),
        "outputs": _tensors(config["outputs"]),
    }
    (folder / FRAUD).mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (folder / FRAUD / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    config_file = folder / "model_config.pb"
    config_file.write_bytes(model_config_bytes(config, "mlserver", MLSERVER_MAX_BATCH))
    return config_file


@dataclass
class KServeLaunch:
    """How to start the KServe shim: its arguments after `python -m bench.peers.kserve_shim`, and its environment."""

    args: list[str]
    env: dict[str, str]


def write_kserve_folder(folder: Path, models: Path, grpc_port: int) -> KServeLaunch:
    """model.json (what the shim's kserve.Model serves) and the ModelConfig bytes file for KServe."""
    config = fraud_config(models)
    settings = {
        "name": FRAUD,
        "version": "1",
        "model_file": str((models / FRAUD / "1" / "model.pt").resolve()),
        "inputs": _tensors(config["inputs"]),
        "outputs": _tensors(config["outputs"]),
    }
    folder.mkdir(parents=True)
    settings_file = folder / "model.json"
    settings_file.write_text(json.dumps(settings, indent=2))
    config_file = folder / "model_config.pb"
    # KServe has no batcher: max_batch_size only says the model takes a batch dimension, as config.yaml does.
    config_file.write_bytes(model_config_bytes(config, "kserve", int(config["max_batch_size"])))
    args = [
        "--model_settings",
        str(settings_file),
        "--model_name",
        FRAUD,
        "--grpc_port",
        str(grpc_port),
        "--http_port",  # KServe always starts REST too; its default, 8080, is the local Envoy ingress port
        str(free_port()),
        "--enable_latency_logging",  # on by default: a log line per request
        "false",
    ]
    env = {CONFIG_FILE_ENV: str(config_file), "KSERVE_LOGLEVEL": KSERVE_LOG_LEVEL, "PYTHONPATH": str(ROOT)}
    return KServeLaunch(args, env)


# ----------------------------------------------------------------------------- targets


@dataclass
class Target:
    """One of meshserve's targets against the peers: a measured ratio against a threshold."""

    name: str
    label: str
    value: float | None
    op: str  # ">=" or "<"
    threshold: float
    compared_with: str

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        ok = self.value >= self.threshold if self.op == ">=" else self.value < self.threshold
        return "PASS" if ok else "FAIL"


def targets(get, peers: Sequence[str] = PEERS) -> list[Target]:
    """meshserve c=32: >= 2x the better peer's throughput with a lower p99; c=1: a lower p50 than every peer.

    `get(server, concurrency)` returns a PerfResult or None. A target is n/a when meshserve or any of `peers` (the
    peers this run measures) lacks its figure at that concurrency: the missing one might be the one to beat.
    """

    def every_peer(c: int) -> dict[str, PerfResult]:
        found = {p: get(p, c) for p in peers}
        return found if found and None not in found.values() else {}

    mesh32, mesh1 = get(MESHSERVE, 32), get(MESHSERVE, 1)
    peers32, peers1 = every_peer(32), every_peer(1)
    best_name = max(peers32, key=lambda p: peers32[p].throughput) if peers32 else "the better peer"
    fastest_name = min(peers1, key=lambda p: peers1[p].p50_us) if peers1 else "the faster peer"
    best, fastest = peers32.get(best_name), peers1.get(fastest_name)
    of_peers = " and ".join(peers) or "the peers"
    return [
        Target(
            "target.c32_throughput_vs_best_peer",
            f"meshserve c=32 throughput / {best_name} (the better peer)",
            ratio(mesh32.throughput if mesh32 else None, best.throughput if best else None),
            ">=",
            2.0,
            f"{best_name} c=32 throughput (the better of {of_peers})",
        ),
        Target(
            "target.c32_p99_vs_best_peer",
            f"meshserve c=32 p99 / {best_name} c=32 p99",
            ratio(mesh32.p99_us if mesh32 else None, best.p99_us if best else None),
            "<",
            1.0,
            f"{best_name} c=32 p99",
        ),
        Target(
            "target.c1_p50_vs_peers",
            f"meshserve c=1 p50 / {fastest_name} c=1 p50 (the lower peer)",
            ratio(mesh1.p50_us if mesh1 else None, fastest.p50_us if fastest else None),
            "<",
            1.0,
            f"{fastest_name} c=1 p50 (the lower of {of_peers})",
        ),
    ]


class PeersBench(Bench):
    """A Bench that measures a cell once more, while its server is still up, when perf_analyzer could not stabilise.

    On this shared 2-core box the peers' latency tails can keep perf_analyzer from stabilising even with its
    doubled window; a second attempt costs a minute, a missing figure costs the targets that need it.
    """

    def measure(self, target: str, url: str, model: str, concurrency: int) -> None:
        errors = len(self.errors)
        super().measure(target, url, model, concurrency)
        failed = self.errors[errors:]
        if (target, model, concurrency) not in self.perf and any(UNSTABLE in e for e in failed):
            del self.errors[errors:]
            super().measure(target, url, model, concurrency)


# ----------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--models", type=Path, default=MODELS, help="model repository holding fraud_mlp")
    parser.add_argument(
        "--servers", nargs="+", choices=sorted(SERVERS), default=list(SERVERS), help="which servers to measure"
    )
    parser.add_argument("--mlserver-only", action="store_true", help="the same as --servers mlserver")
    args = parser.parse_args(argv)
    models_dir: Path = args.models.resolve()
    chosen = {SERVERS[s] for s in (["mlserver"] if args.mlserver_only else args.servers)}
    command = (
        "python -m bench.peers"
        + (f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else "")
        + (f" --models {args.models}" if models_dir != MODELS else "")
        + (f" --servers {' '.join(s for s in SERVERS if SERVERS[s] in chosen)}" if len(chosen) < len(SERVERS) else "")
    )
    started = time.monotonic()
    if not (models_dir / FRAUD / "1" / "model.pt").exists():
        print(f"{models_dir / FRAUD / '1' / 'model.pt'} is missing: run `make models` first", file=sys.stderr)
        return 1
    ensure_perf_analyzer()
    mlserver_python = ensure_mlserver_venv() if MLSERVER in chosen else None
    kserve_python = ensure_kserve_venv() if KSERVE in chosen else None
    bench = PeersBench(args.measurement_ms)
    loads = [(FRAUD, c) for c in FRAUD_CONCURRENCY]

    with tempfile.TemporaryDirectory(prefix="meshserve-peers-") as tmp_name:
        tmp = Path(tmp_name)
        if mlserver_python is not None:
            port = free_port()
            config_file = write_mlserver_folder(tmp / "mlserver", models_dir, port)
            env = {CONFIG_FILE_ENV: str(config_file), "PYTHONPATH": str(ROOT)}
            argv_ml = [str(mlserver_python), "-m", "bench.peers.mlserver_shim", str(tmp / "mlserver")]
            shown = "mlserver start (via bench.peers.mlserver_shim: + ModelConfig interceptor)"
            bench.serve(MLSERVER, argv_ml, port, loads, env, health=False, shown=shown)
        if kserve_python is not None:
            port = free_port()
            launch = write_kserve_folder(tmp / "kserve", models_dir, port)
            argv_ks = [str(kserve_python), "-m", "bench.peers.kserve_shim", *launch.args]
            via = "via bench.peers.kserve_shim: + ModelConfig interceptor"
            shown = f"kserve.ModelServer ({via}) {' '.join(launch.args[2:])}"
            bench.serve(KSERVE, argv_ks, port, loads, launch.env, health=False, shown=shown)
        if MESHSERVE in chosen:
            copy_fraud(tmp / "repo", batching=True, models=models_dir)
            bench.serve_model_service(MESHSERVE, tmp / "repo", loads)
        if FLOOR in chosen:
            bench.serve_floor()

    return bench.finish(report(bench, command, [s for s in SERVERS.values() if s in chosen]), started)


def report(bench: Bench, command: str, servers: Sequence[str] = tuple(SERVERS.values())) -> list[dict[str, Any]]:
    """Print the side-by-side table of `servers` and the targets; return every figure for bench/results/latest.json."""

    def get(server: str, c: int) -> PerfResult | None:
        return bench.get(server, FRAUD, c)

    peers_here = [s for s in servers if s in PEERS]
    figures: list[dict[str, Any]] = []
    rows = []
    for c in FRAUD_CONCURRENCY:
        peer_results = {p: get(p, c) for p in PEERS}
        for server in servers:
            r = get(server, c)
            vs = {
                p: ratio(r.throughput if r else None, pr.throughput if pr else None) for p, pr in peer_results.items()
            }
            rows.append([server, c, *perf_cells(r), *(None if server in PEERS else vs[p] for p in PEERS)])
            if r is None:  # a failed cell: its row shows the gap, ERRORS says why
                continue
            key = f"{PREFIX}.{FRAUD}.{server.split(' ')[0]}.c{c}"
            versus = "" if server in PEERS else " and ".join(f"{p} at c={c} ({PEER_SETUP[p]})" for p in peers_here)
            shown = f"{command} -> {r.command}"
            figures.append(results.figure(f"{key}.throughput", r.throughput, "infer/s", versus, shown))
            figures.append(results.figure(f"{key}.p50", r.p50_ms, "ms", versus, shown))
            figures.append(results.figure(f"{key}.p99", r.p99_ms, "ms", versus, shown))
            if server == MESHSERVE:
                for p in PEERS:
                    if vs[p] is not None:
                        name = f"{key}.vs_{p.split(' ')[0]}"
                        figures.append(results.figure(name, vs[p], "ratio", f"{p} throughput at c={c}", command))
    results.print_table(
        ["server", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", *(f"vs {p.split(' ')[0]}" for p in PEERS)],
        rows,
        title=f"{FRAUD} v1, batch-1 requests (perf_analyzer, gRPC)",
    )

    target_rows = []
    for t in targets(get, peers_here):
        shown = "-" if t.value is None else f"{t.value:.2f}"
        target_rows.append([t.label, shown, f"{t.op} {t.threshold:g}", t.verdict])
        compared = f"{t.compared_with}; target {t.op} {t.threshold:g}"
        figures.append(results.figure(f"{PREFIX}.{t.name}", t.value, "ratio", compared, command))
    results.print_table(["target", "measured", "target", "result"], target_rows, title="targets")
    return figures


if __name__ == "__main__":
    sys.exit(main())
