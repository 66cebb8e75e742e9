"""`make bench-peers`: fraud_mlp under the same perf_analyzer load on Seldon MLServer 1.7.1 and meshserve."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import results
from bench.model_service import FLOOR, FRAUD, FRAUD_CONCURRENCY, MODELS, ON, Bench, copy_fraud, perf_cells, ratio
from bench.perf_analyzer import ensure_perf_analyzer
from bench.serving import ROOT, free_port
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc

MLSERVER = "mlserver 1.7.1"
MESHSERVE = f"meshserve ({ON})"
MLSERVER_VENV = ROOT / ".bench-tools" / "mlserver-venv"
MLSERVER_PINS = ("mlserver==1.7.1", "uvloop<0.22", "torch==2.13.0")  # torch pinned: the local CPU wheel
MLSERVER_MAX_BATCH = 32
MLSERVER_MAX_BATCH_TIME_S = 0.002
PREFIX = "peers"


def ensure_mlserver_venv() -> Path:
    """MLServer 1.7.1 in its own virtualenv (.bench-tools/mlserver-venv); returns its python."""
    python = MLSERVER_VENV / "bin" / "python"
    check = [str(python), "-c", "import mlserver, torch, sys; sys.exit(mlserver.__version__ != '1.7.1')"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing {', '.join(MLSERVER_PINS)} into {MLSERVER_VENV.relative_to(ROOT)} ...", flush=True)
    MLSERVER_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(MLSERVER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *MLSERVER_PINS], check=True)
    subprocess.run(check, check=True)
    return python


def model_config_bytes(config: dict[str, Any]) -> bytes:
    """The Triton ModelConfigResponse perf_analyzer needs, serialised (MLServer itself has no ModelConfig)."""
    dtype = {"FP32": mc.TYPE_FP32}
    message = mc.ModelConfig(
        name=config["name"],
        platform="mlserver",
        backend="mlserver",
        max_batch_size=MLSERVER_MAX_BATCH,
        input=[mc.ModelInput(name=t["name"], data_type=dtype[t["datatype"]], dims=t["dims"]) for t in config["inputs"]],
        output=[
            mc.ModelOutput(name=t["name"], data_type=dtype[t["datatype"]], dims=t["dims"]) for t in config["outputs"]
        ],
    )
    return pb.ModelConfigResponse(config=message).SerializeToString()


def write_mlserver_folder(folder: Path, models: Path, grpc_port: int) -> Path:
    """settings.json + fraud_mlp/model-settings.json for MLServer; returns the ModelConfig bytes file."""
    config = yaml.safe_load((models / FRAUD / "config.yaml").read_text())
    config.setdefault("name", FRAUD)
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
        "implementation": "bench.mlserver_shim.TorchScriptRuntime",
        "parameters": {"uri": str((models / FRAUD / "1" / "model.pt").resolve()), "version": "1"},
        "max_batch_size": MLSERVER_MAX_BATCH,
        "max_batch_time": MLSERVER_MAX_BATCH_TIME_S,
        "inputs": [{"name": t["name"], "datatype": t["datatype"], "shape": [-1, *t["dims"]]} for t in config["inputs"]],
        "outputs": [
            {"name": t["name"], "datatype": t["datatype"], "shape": [-1, *t["dims"]]} for t in config["outputs"]
        ],
    }
    (folder / FRAUD).mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (folder / FRAUD / "model-settings.json").write_text(json.dumps(model_settings, indent=2))
    config_file = folder / "model_config.pb"
    config_file.write_bytes(model_config_bytes(config))
    return config_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--models", type=Path, default=MODELS, help="model repository holding fraud_mlp")
    parser.add_argument("--mlserver-only", action="store_true", help="skip meshserve and the floor")
    args = parser.parse_args(argv)
    models_dir: Path = args.models.resolve()
    command = (
        "python -m bench.peers"
        + (f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else "")
        + (f" --models {args.models}" if models_dir != MODELS else "")
    )
    started = time.monotonic()
    if not (models_dir / FRAUD / "1" / "model.pt").exists():
        print(f"{models_dir / FRAUD / '1' / 'model.pt'} is missing: run `make models` first", file=sys.stderr)
        return 1
    ensure_perf_analyzer()
    mlserver_python = ensure_mlserver_venv()
    bench = Bench(args.measurement_ms)
    loads = [(FRAUD, c) for c in FRAUD_CONCURRENCY]

    with tempfile.TemporaryDirectory(prefix="meshserve-peers-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        config_file = write_mlserver_folder(tmp / "mlserver", models_dir, port)
        env = {"BENCH_MODEL_CONFIG_FILE": str(config_file), "PYTHONPATH": str(ROOT)}
        argv_ml = [str(mlserver_python), "-m", "bench.mlserver_shim", str(tmp / "mlserver")]
        shown = "mlserver start (via bench.mlserver_shim: + ModelConfig interceptor)"
        bench.serve(MLSERVER, argv_ml, port, loads, env, health=False, shown=shown)
        if not args.mlserver_only:
            copy_fraud(tmp / "repo", batching=True, models=models_dir)
            bench.serve_model_service(MESHSERVE, tmp / "repo", loads)
            bench.serve_floor()

    figures: list[dict[str, Any]] = []
    rows = []
    for c in FRAUD_CONCURRENCY:
        ml = bench.get(MLSERVER, FRAUD, c)
        for target in (MLSERVER, MESHSERVE, FLOOR):
            r = bench.get(target, FRAUD, c)
            if r is None and target != MLSERVER and args.mlserver_only:
                continue
            vs = ratio(r.throughput if r else None, ml.throughput if ml else None)
            rows.append([target, c, *perf_cells(r), None if target == MLSERVER else vs])
            if r is None:
                continue
            key = f"{PREFIX}.{FRAUD}.{target.split(' ')[0]}.c{c}"
            versus = "" if target == MLSERVER else f"{MLSERVER} at c={c} (parallel_workers 0, adaptive batching 32/2ms)"
            shown = f"{command} -> {r.command}"
            figures.append(results.figure(f"{key}.throughput", r.throughput, "infer/s", versus, shown))
            figures.append(results.figure(f"{key}.p50", r.p50_ms, "ms", versus, shown))
            figures.append(results.figure(f"{key}.p99", r.p99_ms, "ms", versus, shown))
            if target == MESHSERVE and vs is not None:
                figures.append(
                    results.figure(f"{key}.vs_mlserver", vs, "ratio", f"{MLSERVER} throughput at c={c}", command)
                )
    results.print_table(
        ["server", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "vs mlserver"],
        rows,
        title=f"{FRAUD} v1, batch-1 requests (perf_analyzer, gRPC)",
    )
    results.record(figures)
    print(f"\nrecorded {len(figures)} figures in {results.LATEST.relative_to(ROOT)}")
    print(f"took {time.monotonic() - started:.0f} s")
    if bench.errors:
        print("\nERRORS (some figures missing):")
        for e in bench.errors:
            print(f"- {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
