"""`make bench`: the model service against the bare-gRPC floor, batching on vs off, and INT8 vs FP32."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import results
from bench.perf_analyzer import PerfAnalyzerError, PerfResult, ensure_perf_analyzer, run_perf_analyzer
from bench.serving import ROOT, ServerStartError, free_port, running

MODELS = ROOT / "models"
FRAUD = "fraud_mlp"
HEAVY = "heavy_mlp"
FRAUD_CONCURRENCY = (1, 8, 32)
HEAVY_CONCURRENCY = 32
FORWARD_BATCH = 32
HIDDEN = 4096
HEAVY_DELAY_US = 8000
SEED = 1234
PREFIX = "model_service"

FLOOR = "floor"
ON = "batching on"
OFF = "batching off"


# ----------------------------------------------------------------------------- repositories


def _serve_v1_only(config: dict[str, Any]) -> dict[str, Any]:
    config["version_policy"] = {"specific": {"versions": [1]}}
    config.pop("version_overrides", None)
    return config


def _write_config(model_dir: Path, config: dict[str, Any]) -> None:
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def copy_fraud(repo: Path, batching: bool, models: Path = MODELS) -> None:
    """Copy models/fraud_mlp (config and version 1 only) into `repo`; drop dynamic_batching when off."""
    src = models / FRAUD
    dst = repo / FRAUD
    (dst / "1").mkdir(parents=True)
    for item in (src / "1").iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, dst / "1" / item.name)
    config = yaml.safe_load((src / "config.yaml").read_text())
    if not batching:
        config.pop("dynamic_batching", None)
    _write_config(dst, _serve_v1_only(config))


def heavy_module():  # -> torch.nn.Module; torch imported lazily (slow import)
    """Linear(64,4096) -> ReLU -> Linear(4096,4096) -> ReLU -> Linear(4096,1), seeded, in eval mode."""
    import torch

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(SEED)
    try:
        module = torch.nn.Sequential(
            torch.nn.Linear(64, HIDDEN),
            torch.nn.ReLU(),
            torch.nn.Linear(HIDDEN, HIDDEN),
            torch.nn.ReLU(),
            torch.nn.Linear(HIDDEN, 1),
        ).eval()
    finally:
        torch.random.set_rng_state(gen_state)
    return module


def write_heavy(repo: Path, batching: bool, model_file: Path, models: Path = MODELS) -> None:
    """The heavy model's repository entry: config like fraud_mlp's, version 1 = `model_file`."""
    dst = repo / HEAVY
    (dst / "1").mkdir(parents=True)
    shutil.copy2(model_file, dst / "1" / "model.pt")
    fraud_config = yaml.safe_load((models / FRAUD / "config.yaml").read_text())
    config: dict[str, Any] = {
        "name": HEAVY,
        "backend": "torchscript",
        "max_batch_size": 128,
        "inputs": [{"name": "features", "datatype": "FP32", "dims": [64]}],
        "outputs": [{"name": "score", "datatype": "FP32", "dims": [1]}],
    }
    if batching:
        # A long forward is far cheaper per row in one large batch: wait up to 8 ms for the rows just answered.
        config["dynamic_batching"] = {
            **(fraud_config.get("dynamic_batching") or {}),
            "max_queue_delay_us": HEAVY_DELAY_US,
        }
    _write_config(dst, _serve_v1_only(config))


# ----------------------------------------------------------------------------- in-process forward


def _rows_per_second(fn: Callable[[], Any], rows: int, repeats: int = 7, min_window_s: float = 0.3) -> float:
    """Median rows/s of `fn` over `repeats` windows, after at least a second (and 20 calls) of warmup."""
    started = time.perf_counter()
    calls = 0
    while calls < 20 or time.perf_counter() - started < 1.0:
        fn()
        calls += 1
    per_call = (time.perf_counter() - started) / calls
    iters = max(1, int(min_window_s / per_call))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        rates.append(rows * iters / (time.perf_counter() - t0))
    return statistics.median(rates)


@dataclass
class Forward:
    fp32_rows_s: float
    int8_rows_s: float
    max_abs_diff: float
    rows_compared: int


def measure_forward(model_file: Path, batch: int = FORWARD_BATCH, compare_rows: int = 4096) -> Forward:
    """FP32 TorchScript vs quantize_dynamic_jit INT8, in process: rows/s at `batch`, largest |diff|."""
    import torch

    scripted = torch.jit.load(str(model_file)).eval()
    with warnings.catch_warnings():  # deprecation notices from torch.ao / torch.jit, not results
        warnings.simplefilter("ignore")
        qconfig = {"": torch.ao.quantization.default_dynamic_qconfig}
        int8 = torch.ao.quantization.quantize_dynamic_jit(scripted, qconfig)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(batch, 64, generator=gen)
    rows = torch.randn(compare_rows, 64, generator=gen)
    with torch.inference_mode():
        fp32_rate = _rows_per_second(lambda: scripted(x), batch)
        int8_rate = _rows_per_second(lambda: int8(x), batch)
        diff = (scripted(rows) - int8(rows)).abs().max().item()
    return Forward(fp32_rate, int8_rate, float(diff), compare_rows)


# ----------------------------------------------------------------------------- the run


def model_service_argv() -> list[str]:
    return [
        str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable,
        "-m",
        "services.model",
    ]


def floor_argv(port: int) -> list[str]:
    return [model_service_argv()[0], "-m", "bench.floor_server", "--port", str(port)]


def model_service_env(repo: Path, port: int) -> dict[str, str]:
    return {
        "MESHSERVE_MODEL_REPOSITORY": str(repo),
        "MESHSERVE_MODEL_PORT": str(port),
        "MESHSERVE_MODEL_METRICS_PORT": str(free_port()),
        "OTEL_SDK_DISABLED": "true",
    }


class Bench:
    """Collects perf_analyzer results and errors keyed by (target, model, concurrency)."""

    def __init__(self, measurement_ms: int) -> None:
        self.measurement_ms = measurement_ms
        self.perf: dict[tuple[str, str, int], PerfResult] = {}
        self.errors: list[str] = []

    def measure(self, target: str, url: str, model: str, concurrency: int) -> None:
        print(f"  {target:<13} {model:<10} c={concurrency:<3} ...", end="", flush=True)
        try:
            r = run_perf_analyzer(model, url, concurrency, measurement_ms=self.measurement_ms)
        except PerfAnalyzerError as exc:
            print(" FAILED", flush=True)
            self.errors.append(f"{target} {model} c={concurrency}: {exc}")
            return
        self.perf[(target, model, concurrency)] = r
        print(f" {r.throughput:8,.0f} infer/s  p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms", flush=True)

    def finish(self, figures: list[dict[str, Any]], started: float) -> int:
        """Record the run's figures, say how long it took, list what failed; the exit status (1 on errors)."""
        results.record(figures)
        print(f"\nrecorded {len(figures)} figures in {results.LATEST.relative_to(ROOT)}")
        print(f"took {time.monotonic() - started:.0f} s")
        if self.errors:
            print("\nERRORS (some figures missing):")
            for e in self.errors:
                print(f"- {e}")
            return 1
        return 0

    def get(self, target: str, model: str, concurrency: int) -> PerfResult | None:
        return self.perf.get((target, model, concurrency))

    def serve(
        self,
        target: str,
        argv: list[str],
        port: int,
        loads: list[tuple[str, int]],
        env: dict[str, str] | None = None,
        health: bool = True,
        shown: str = "",
        on_ready: Callable[[str], None] | None = None,
    ) -> None:
        """Start a server, run perf_analyzer for each (model, concurrency) in `loads`, stop it."""
        models = sorted({m for m, _ in loads})
        print(f"\n[{target}] {shown or ' '.join(argv)}", flush=True)
        try:
            with running(target, argv, port, env, health=health, models=models) as server:
                print(f"  ready after {server.ready_s:.1f} s", flush=True)
                if on_ready is not None:
                    on_ready(server.url)
                for model, c in loads:
                    self.measure(target, server.url, model, c)
        except ServerStartError as exc:
            self.errors.append(f"{target}: {exc}")
            print(f"  could not start {target}:\n{exc}", flush=True)

    def serve_model_service(self, target: str, repo: Path, loads: list[tuple[str, int]]) -> None:
        """The model service (`python -m services.model`) on `repo`, ready once gRPC health says SERVING."""
        port = free_port()
        env = model_service_env(repo, port)
        shown = f"MESHSERVE_MODEL_REPOSITORY={repo} python -m services.model"
        models = sorted({m for m, _ in loads})
        self.serve(
            target, model_service_argv(), port, loads, env, health=True, shown=shown, on_ready=print_execution(models)
        )

    def serve_floor(self) -> None:
        """The floor server, measured with fraud_mlp's load."""
        port = free_port()
        loads = [(FRAUD, c) for c in FRAUD_CONCURRENCY]
        self.serve(FLOOR, floor_argv(port), port, loads, health=False, shown="python -m bench.floor_server")


def print_execution(models: list[str]) -> Callable[[str], None]:
    """Prints where each model's forwards run, as its ModelConfig reports it (inline or thread)."""

    def show(url: str) -> None:
        import grpc

        from services.protos import inference_pb2 as pb
        from services.protos import inference_pb2_grpc as pb_grpc

        with grpc.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for model in models:
                config = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=10).config
                print(f"  {model}: execution {config.parameters['execution'].string_value}", flush=True)

    return show


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is 0)."""
    return a / b if a is not None and b not in (None, 0) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_service", description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--models", type=Path, default=MODELS, help="model repository holding fraud_mlp")
    args = parser.parse_args(argv)
    models_dir: Path = args.models.resolve()
    command = (
        "python -m bench.model_service"
        + (f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else "")
        + (f" --models {args.models}" if models_dir != MODELS else "")
    )
    started = time.monotonic()

    if not (models_dir / FRAUD / "1" / "model.pt").exists():
        print(f"{models_dir / FRAUD / '1' / 'model.pt'} is missing: run `make models` first", file=sys.stderr)
        return 1
    ensure_perf_analyzer()
    bench = Bench(args.measurement_ms)

    with tempfile.TemporaryDirectory(prefix="meshserve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        import torch

        heavy_file = tmp / "heavy_mlp.pt"
        with warnings.catch_warnings():  # torch.jit.script's deprecation notice
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(heavy_module()), str(heavy_file))
        # One model per server, as each would be deployed: the small model's forwards run inline with one
        # torch thread, the heavy model's on a worker thread with torch's default.
        for target in (ON, OFF):
            copy_fraud(tmp / f"{target.replace(' ', '_')}-{FRAUD}", batching=target == ON, models=models_dir)
            write_heavy(
                tmp / f"{target.replace(' ', '_')}-{HEAVY}",
                batching=target == ON,
                model_file=heavy_file,
                models=models_dir,
            )

        bench.serve_floor()
        for target in (ON, OFF):
            bench.serve_model_service(
                target, tmp / f"{target.replace(' ', '_')}-{FRAUD}", [(FRAUD, c) for c in FRAUD_CONCURRENCY]
            )
            bench.serve_model_service(target, tmp / f"{target.replace(' ', '_')}-{HEAVY}", [(HEAVY, HEAVY_CONCURRENCY)])

        print(f"\n[in process] {HEAVY} forward at batch {FORWARD_BATCH}: FP32 vs INT8 ...", flush=True)
        forward = measure_forward(heavy_file)

    return bench.finish(report(bench, forward, command), started)


def report(bench: Bench, forward: Forward, command: str) -> list[dict[str, Any]]:
    """Print the tables and targets; return every figure for bench/results/latest.json."""
    figures: list[dict[str, Any]] = []

    def fig(name: str, value: float | None, unit: str, compared_with: str, cmd: str = "") -> None:
        shown = f"{command} -> {cmd}" if cmd else command
        figures.append(results.figure(f"{PREFIX}.{name}", value, unit, compared_with, shown))

    # Table 1: fraud_mlp, batch-1 requests.
    rows = []
    for c in FRAUD_CONCURRENCY:
        floor = bench.get(FLOOR, FRAUD, c)
        for target in (FLOOR, ON, OFF):
            r = bench.get(target, FRAUD, c)
            vs_floor = ratio(r.throughput if r else None, floor.throughput if floor else None)
            rows.append([f"{target}", c, *(perf_cells(r)), None if target == FLOOR else vs_floor])
            if r is None:
                continue
            key = f"{FRAUD}.{target.replace(' ', '_')}.c{c}"
            versus = "" if target == FLOOR else f"{FLOOR} (bare grpc.aio v2 server, no model) at c={c}"
            fig(f"{key}.throughput", r.throughput, "infer/s", versus, r.command)
            fig(f"{key}.p50", r.p50_ms, "ms", versus, r.command)
            fig(f"{key}.p99", r.p99_ms, "ms", versus, r.command)
    results.print_table(
        ["server", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "vs floor"],
        rows,
        title=f"{FRAUD}, batch-1 requests (perf_analyzer, gRPC)",
    )

    # Table 2: heavy model at c=32 and the in-process limit.
    on = bench.get(ON, HEAVY, HEAVY_CONCURRENCY)
    off = bench.get(OFF, HEAVY, HEAVY_CONCURRENCY)
    limit = forward.fp32_rows_s
    results.print_table(
        ["heavy_mlp (64-4096-4096-1)", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "vs limit"],
        [
            [ON, HEAVY_CONCURRENCY, *perf_cells(on), ratio(on.throughput if on else None, limit)],
            [OFF, HEAVY_CONCURRENCY, *perf_cells(off), ratio(off.throughput if off else None, limit)],
            [f"in-process forward, batch {FORWARD_BATCH}", "-", limit, None, None, None, 1.0],
        ],
        title=f"{HEAVY}: served at c={HEAVY_CONCURRENCY} vs its in-process forward (the limit)",
    )
    for target, r in ((ON, on), (OFF, off)):
        if r is not None:
            key = f"{HEAVY}.{target.replace(' ', '_')}.c{HEAVY_CONCURRENCY}"
            versus = f"in-process FP32 forward at batch {FORWARD_BATCH} (rows/s)"
            fig(f"{key}.throughput", r.throughput, "infer/s", versus, r.command)
            fig(f"{key}.p50", r.p50_ms, "ms", "", r.command)
            fig(f"{key}.p99", r.p99_ms, "ms", "", r.command)
    fig(f"{HEAVY}.in_process.fp32.b{FORWARD_BATCH}", forward.fp32_rows_s, "rows/s", "")
    fig(f"{HEAVY}.in_process.int8.b{FORWARD_BATCH}", forward.int8_rows_s, "rows/s", "FP32 in-process")
    fig(f"{HEAVY}.int8.max_abs_diff", forward.max_abs_diff, "score", f"FP32, {forward.rows_compared} rows")

    results.print_table(
        ["in-process forward", "rows/s"],
        [
            [f"{HEAVY} FP32, batch {FORWARD_BATCH}", forward.fp32_rows_s],
            [f"{HEAVY} INT8 (quantize_dynamic_jit), batch {FORWARD_BATCH}", forward.int8_rows_s],
        ],
        title=f"INT8 vs FP32 (largest |score diff| over {forward.rows_compared} rows: {forward.max_abs_diff:.5f})",
    )

    # Server-side breakdown, where the server reports ModelStatistics.
    breakdown = [
        [
            f"{t} {m} c={c}",
            r.server_queue_us,
            r.server_compute_input_us,
            r.server_compute_infer_us,
            r.server_compute_output_us,
            r.network_us,
        ]
        for (t, m, c), r in bench.perf.items()
        if r.has_server_stats
    ]
    if breakdown:
        results.print_table(
            ["run", "queue us", "in us", "infer us", "out us", "net+other us"],
            breakdown,
            title="server-side breakdown (ModelStatistics, averages per request)",
        )

    # Targets.
    floor32, floor1, on32, on1, off1 = (
        bench.get(FLOOR, FRAUD, 32),
        bench.get(FLOOR, FRAUD, 1),
        bench.get(ON, FRAUD, 32),
        bench.get(ON, FRAUD, 1),
        bench.get(OFF, FRAUD, 1),
    )
    targets: list[tuple[str, float | None, str, float, str, str]] = [
        # (figure name, value, comparison, threshold, "ge"/"le", compared with)
        (
            "target.fraud_c32_on_vs_floor_throughput",
            ratio(on32.throughput if on32 else None, floor32.throughput if floor32 else None),
            f"{FRAUD} c=32 batching on throughput / floor",
            0.85,
            "ge",
            "floor c=32 throughput",
        ),
        (
            "target.fraud_c32_on_vs_floor_p99",
            ratio(on32.p99_us if on32 else None, floor32.p99_us if floor32 else None),
            f"{FRAUD} c=32 batching on p99 / floor p99",
            1.5,
            "le",
            "floor c=32 p99",
        ),
        (
            "target.fraud_c1_on_vs_floor_p50",
            ratio(on1.p50_us if on1 else None, floor1.p50_us if floor1 else None),
            f"{FRAUD} c=1 p50 batching on / floor",
            1.3,
            "le",
            "floor c=1 p50",
        ),
        (
            "target.fraud_c1_on_vs_off_p50",
            ratio(on1.p50_us if on1 else None, off1.p50_us if off1 else None),
            f"{FRAUD} c=1 p50 batching on / off",
            1.25,
            "le",
            "batching off c=1 p50",
        ),
        (
            "target.heavy_c32_on_vs_off_throughput",
            ratio(on.throughput if on else None, off.throughput if off else None),
            f"{HEAVY} c=32 throughput batching on / off",
            3.5,
            "ge",
            "batching off c=32 throughput",
        ),
        (
            "target.heavy_c32_on_vs_in_process",
            ratio(on.throughput if on else None, limit),
            f"{HEAVY} c=32 batching on / in-process rows/s",
            0.80,
            "ge",
            f"in-process FP32 forward at batch {FORWARD_BATCH}",
        ),
        (
            "target.int8_vs_fp32_speed",
            ratio(forward.int8_rows_s, forward.fp32_rows_s),
            f"INT8 / FP32 forward speed (batch {FORWARD_BATCH})",
            3.0,
            "ge",
            "FP32 forward",
        ),
        (
            "target.int8_max_abs_diff",
            forward.max_abs_diff,
            "INT8 largest |score diff| vs FP32",
            0.02,
            "le",
            "FP32 scores",
        ),
    ]
    rows = []
    for name, value, label, threshold, op, versus in targets:
        if value is None:
            verdict = "n/a"
        else:
            ok = value >= threshold if op == "ge" else value <= threshold
            verdict = "PASS" if ok else "FAIL"
        sign = ">=" if op == "ge" else "<="
        digits = 4 if "diff" in name else 2
        shown = "-" if value is None else f"{value:.{digits}f}"
        rows.append([label, shown, f"{sign} {threshold:g}", verdict])
        fig(name, value, "ratio" if "diff" not in name else "score", f"{versus}; target {sign} {threshold:g}")
    results.print_table(["target", "measured", "target", "result"], rows, title="targets")
    return figures


def perf_cells(r: PerfResult | None) -> list[float | None]:
    """Table cells for one measurement: infer/s, p50, p90, p99 (ms)."""
    if r is None:
        return [None, None, None, None]
    return [r.throughput, r.p50_ms, r.p90_ms, r.p99_ms]


if __name__ == "__main__":
    sys.exit(main())
