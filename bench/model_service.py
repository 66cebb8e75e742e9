"""`make bench`: the model service against the bare-gRPC floor, batching on vs off, ONNX Runtime against TorchScript
(in process at batch 1 and 32, served at c=1 and c=32, for both demo models and the heavy one), and static INT8
against FP32 (ONNX Runtime on the CPU, the heavy model at batch 32)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.lib import results
from bench.lib.model_repo import (
    DIGITS,
    FRAUD,
    HEAVY,
    MODELS,
    copy_fraud,
    copy_model,
    default_backend,
    heavy_file,
    model_dir,
    with_backend,
    write_heavy,
)
from bench.lib.perf_analyzer import PerfResult, ensure_perf_analyzer
from bench.lib.perf_runs import FLOOR, FRAUD_CONCURRENCY, OFF, ON, Bench, perf_cells
from bench.lib.rates import rows_per_second
from bench.lib.results import ratio

HEAVY_CONCURRENCY = 32
FORWARD_BATCH = 32
SEED = 1234
PREFIX = "model_service"
ENGINES = ("onnxruntime", "torchscript")
ENGINE_MODELS = (FRAUD, DIGITS, HEAVY)
ENGINE_BATCHES = (1, FORWARD_BATCH)
ENGINE_CONCURRENCY = (1, 32)
SECTIONS = ("serving", "engines", "forward")  # forward: the in-process measurements alone (always run)


# ----------------------------------------------------------------------------- in-process forward


@dataclass
class Forward:
    """In-process forward rates: per (model, backend, batch) rows/s, and static INT8 against FP32 on the heavy model."""

    rows_s: dict[tuple[str, str, int], float]
    int8: dict[str, float]  # fp32_rows_s, int8_rows_s, max_abs_diff (ONNX Runtime); torchscript_* likewise
    rows_compared: int


def _load_version(model: str, backend: str, version: int, models: Path, torch_threads: int) -> Any:
    """One version of a built model loaded by `backend`, threads as the service gives them: one for the small
    models (their forwards run inline), the backend's pool for the heavy one (on worker threads)."""
    import torch

    from services.model.backends import get_backend
    from services.model.config import ModelConfig

    folder = model_dir(model, models)
    document = with_backend(yaml.safe_load((folder / "config.yaml").read_text()), backend)
    config = ModelConfig.model_validate({**document, "device": "cpu"})
    loaded = get_backend(backend).load(folder / str(version), config, version)
    inline = model != HEAVY
    loaded.executes(inline)
    torch.set_num_threads(1 if inline else torch_threads)
    return config, loaded


def measure_forward(models: Path = MODELS, compare_rows: int = 4096) -> Forward:
    """ONNX Runtime against TorchScript in process, each model at batch 1 and 32; then the heavy model's static INT8
    version against its FP32 one (both backends) at batch 32, and the largest |score diff| over `compare_rows`."""
    import numpy as np
    import torch

    from services.model.export import sample_rows

    threads = torch.get_num_threads()  # torch's default, what a threaded heavy model gets
    rates: dict[tuple[str, str, int], float] = {}
    with torch.inference_mode():
        for model in ENGINE_MODELS:
            for backend in ENGINES:
                config, loaded = _load_version(model, backend, 1, models, threads)
                for batch in ENGINE_BATCHES:
                    x = sample_rows(config, batch, seed=SEED)
                    rates[(model, backend, batch)] = rows_per_second(lambda m=loaded, x=x: m.forward(x), batch)
                loaded.unload()
        int8: dict[str, float] = {}
        for backend, prefix in (("onnxruntime", ""), ("torchscript", "torchscript_")):
            config, fp32 = _load_version(HEAVY, backend, 1, models, threads)
            _, quantized = _load_version(HEAVY, backend, 2, models, threads)
            x = sample_rows(config, FORWARD_BATCH, seed=SEED)
            rows = sample_rows(config, compare_rows, seed=SEED + 1)
            int8[f"{prefix}fp32_rows_s"] = rows_per_second(lambda m=fp32, x=x: m.forward(x), FORWARD_BATCH)
            int8[f"{prefix}int8_rows_s"] = rows_per_second(lambda m=quantized, x=x: m.forward(x), FORWARD_BATCH)
            diff = np.abs(fp32.forward(rows)["score"] - quantized.forward(rows)["score"]).max()
            int8[f"{prefix}max_abs_diff"] = float(diff)
            fp32.unload()
            quantized.unload()
    torch.set_num_threads(threads)
    return Forward(rates, int8, compare_rows)


# ----------------------------------------------------------------------------- the run


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.model_service", description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--models", type=Path, default=MODELS, help="model repository holding fraud_mlp")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        help="serving: floor, batching on/off; engines: ONNX Runtime vs TorchScript served; forward: in process only",
    )
    return parser.parse_args(argv)


def command_line(args: argparse.Namespace) -> str:
    """The command as the figures show it: the flags that differ from their defaults."""
    return (
        "python -m bench.model_service"
        + (f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else "")
        + (f" --models {args.models}" if args.models.resolve() != MODELS else "")
        + (f" --only {args.only}" if args.only else "")
    )


def missing_file(models_dir: Path) -> Path | None:
    """The first model file `make models` writes that `models_dir` lacks (None: all there)."""
    needed = [model_dir(m, models_dir) / "1" / name for m in ENGINE_MODELS for name in ("model.pt", "model.onnx")]
    needed.append(model_dir(HEAVY, models_dir) / "2" / "model.onnx")
    return next((p for p in needed if not p.exists()), None)


def serve_batching(bench: Bench, tmp: Path, models_dir: Path) -> None:
    """The floor, then fraud_mlp and the heavy model with batching on and off, each model in a server of its own."""
    # One model per server, as each would be deployed: the small model's forwards run inline with one
    # thread, the heavy model's on a worker thread with the backend's default; each with its config's backend.
    for target in (ON, OFF):
        copy_fraud(tmp / f"{target.replace(' ', '_')}-{FRAUD}", batching=target == ON, models=models_dir)
        write_heavy(
            tmp / f"{target.replace(' ', '_')}-{HEAVY}",
            batching=target == ON,
            model_file=heavy_file(models_dir),
            models=models_dir,
        )
    bench.serve_floor()
    for target in (ON, OFF):
        bench.serve_model_service(
            target, tmp / f"{target.replace(' ', '_')}-{FRAUD}", [(FRAUD, c) for c in FRAUD_CONCURRENCY]
        )
        heavy_repo = tmp / f"{target.replace(' ', '_')}-{HEAVY}"
        bench.serve_model_service(target, heavy_repo, [(HEAVY, HEAVY_CONCURRENCY)])


def serve_engines(bench: Bench, tmp: Path, models_dir: Path) -> None:
    """Each model served by ONNX Runtime and by TorchScript, batching on."""
    for model in ENGINE_MODELS:
        for backend in ENGINES:
            repo = tmp / f"{backend}-{model}"
            if model == HEAVY:
                write_heavy(repo, True, heavy_file(models_dir), models_dir, backend)
            else:
                copy_model(repo, model, True, models_dir, backend)
            bench.serve_model_service(backend, repo, [(model, c) for c in ENGINE_CONCURRENCY])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    models_dir: Path = args.models.resolve()
    command = command_line(args)
    started = time.monotonic()
    missing = missing_file(models_dir)
    if missing is not None:
        print(f"{missing} is missing: run `make models` first", file=sys.stderr)
        return 1
    sections = [args.only] if args.only else list(SECTIONS)
    if sections != ["forward"]:
        ensure_perf_analyzer()
    bench = Bench(args.measurement_ms)
    with tempfile.TemporaryDirectory(prefix="meshserve-bench-") as tmp_name:
        if "serving" in sections:
            serve_batching(bench, Path(tmp_name), models_dir)
        if "engines" in sections:
            serve_engines(bench, Path(tmp_name), models_dir)
        print(
            f"\n[in process] {', '.join(ENGINE_MODELS)}: {' vs '.join(ENGINES)}; {HEAVY} INT8 vs FP32 ...", flush=True
        )
        forward = measure_forward(models_dir)
    return bench.finish(report(bench, forward, command, models_dir), started)


# ----------------------------------------------------------------------------- the report


@dataclass
class Recorder:
    """The figures of one run, each named under PREFIX and showing the run's command (and perf_analyzer's)."""

    command: str
    figures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, value: float | None, unit: str, compared_with: str, cmd: str = "") -> None:
        shown = f"{self.command} -> {cmd}" if cmd else self.command
        self.figures.append(results.figure(f"{PREFIX}.{name}", value, unit, compared_with, shown))

    def served(self, key: str, r: PerfResult, versus: str, latency_versus: str | None = None) -> None:
        """One perf_analyzer run's throughput, p50 and p99 under `key`."""
        shown = versus if latency_versus is None else latency_versus
        self.add(f"{key}.throughput", r.throughput, "infer/s", versus, r.command)
        self.add(f"{key}.p50", r.p50_ms, "ms", shown, r.command)
        self.add(f"{key}.p99", r.p99_ms, "ms", shown, r.command)


def report(bench: Bench, forward: Forward, command: str, models: Path = MODELS) -> list[dict[str, Any]]:
    """Print the tables and targets; return every figure for bench/results/latest.json."""
    recorder = Recorder(command)
    heavy_backend = default_backend(HEAVY, models)
    limit = forward.rows_s.get((HEAVY, heavy_backend, FORWARD_BATCH))
    fraud_table(bench, recorder)
    heavy_table(bench, heavy_backend, limit, recorder)
    engines_table(bench, forward, models, recorder)
    int8_table(forward, recorder)
    breakdown_table(bench)
    targets_table(targets(bench, forward, limit), recorder)
    return recorder.figures


def fraud_table(bench: Bench, recorder: Recorder) -> None:
    """fraud_mlp's batch-1 requests on the floor and the model service, batching on and off."""
    rows = []
    for c in FRAUD_CONCURRENCY:
        floor = bench.get(FLOOR, FRAUD, c)
        for target in (FLOOR, ON, OFF):
            r = bench.get(target, FRAUD, c)
            vs_floor = ratio(r.throughput if r else None, floor.throughput if floor else None)
            rows.append([f"{target}", c, *(perf_cells(r)), None if target == FLOOR else vs_floor])
            if r is None:
                continue
            versus = "" if target == FLOOR else f"{FLOOR} (bare grpc.aio v2 server, no model) at c={c}"
            recorder.served(f"{FRAUD}.{target.replace(' ', '_')}.c{c}", r, versus)
    results.print_table(
        ["server", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "vs floor"],
        rows,
        title=f"{FRAUD}, batch-1 requests (perf_analyzer, gRPC)",
    )


def heavy_table(bench: Bench, heavy_backend: str, limit: float | None, recorder: Recorder) -> None:
    """The heavy model at c=32 against the in-process limit (its forward on the backend that served it)."""
    on = bench.get(ON, HEAVY, HEAVY_CONCURRENCY)
    off = bench.get(OFF, HEAVY, HEAVY_CONCURRENCY)
    if on is not None or off is not None:
        results.print_table(
            ["heavy_mlp (64-4096-4096-1)", "conc", "infer/s", "p50 ms", "p90 ms", "p99 ms", "vs limit"],
            [
                [ON, HEAVY_CONCURRENCY, *perf_cells(on), ratio(on.throughput if on else None, limit)],
                [OFF, HEAVY_CONCURRENCY, *perf_cells(off), ratio(off.throughput if off else None, limit)],
                [f"in-process forward, batch {FORWARD_BATCH}", "-", limit, None, None, None, 1.0],
            ],
            title=f"{HEAVY} ({heavy_backend}): served at c={HEAVY_CONCURRENCY} vs its in-process forward (the limit)",
        )
    for target, r in ((ON, on), (OFF, off)):
        if r is not None:
            key = f"{HEAVY}.{target.replace(' ', '_')}.c{HEAVY_CONCURRENCY}"
            versus = f"in-process {heavy_backend} FP32 forward at batch {FORWARD_BATCH} (rows/s)"
            recorder.served(key, r, versus, latency_versus="")


def engines_table(bench: Bench, forward: Forward, models: Path, recorder: Recorder) -> None:
    """ONNX Runtime against TorchScript, in process and served."""
    rows = []
    onnx, torchscript = ENGINES
    for model in ENGINE_MODELS:
        cells: list[Any] = [model]
        for batch in ENGINE_BATCHES:
            a, b = forward.rows_s.get((model, onnx, batch)), forward.rows_s.get((model, torchscript, batch))
            cells += [a, b, ratio(a, b)]
            for backend, value in ((onnx, a), (torchscript, b)):
                recorder.add(
                    f"engines.{model}.{backend}.in_process.b{batch}", value, "rows/s", f"{torchscript} in process"
                )
        for c in ENGINE_CONCURRENCY:
            a_run, b_run = bench.get(onnx, model, c), bench.get(torchscript, model, c)
            a, b = (a_run.throughput if a_run else None), (b_run.throughput if b_run else None)
            cells += [a, b, ratio(a, b)]
            for backend, run in ((onnx, a_run), (torchscript, b_run)):
                if run is not None:
                    versus = f"{torchscript} served at c={c}, batching on"
                    recorder.served(f"engines.{model}.{backend}.served.c{c}", run, versus)
        rows.append([*cells, default_backend(model, models)])
    headers = ["model"]
    for batch in ENGINE_BATCHES:
        headers += [f"b{batch} ORT rows/s", f"b{batch} TS rows/s", "ORT/TS"]
    for c in ENGINE_CONCURRENCY:
        headers += [f"c={c} ORT infer/s", f"c={c} TS infer/s", "ORT/TS"]
    results.print_table(
        [*headers, "serves"],
        rows,
        title="ONNX Runtime (ORT) against TorchScript (TS): in process at batch 1 and 32; served, batch-1 requests",
    )


def int8_table(forward: Forward, recorder: Recorder) -> None:
    """Static INT8 against FP32, the heavy model at batch 32 in process, on both backends."""
    int8 = forward.int8
    rows = []
    for prefix, backend, shown in (("", "onnxruntime", "Q/DQ ONNX"), ("torchscript_", "torchscript", "static at load")):
        fp32, quantized = int8[f"{prefix}fp32_rows_s"], int8[f"{prefix}int8_rows_s"]
        diff = int8[f"{prefix}max_abs_diff"]
        rows.append([f"{HEAVY} {backend} ({shown})", fp32, quantized, ratio(quantized, fp32), f"{diff:.5f}"])
    results.print_table(
        ["in-process forward, batch 32", "FP32 rows/s", "INT8 rows/s", "INT8/FP32", "max |score diff|"],
        rows,
        title=f"static INT8 vs FP32 (score diffs over {forward.rows_compared} rows)",
    )
    for prefix, backend in (("", "onnxruntime"), ("torchscript_", "torchscript")):
        recorder.add(f"{HEAVY}.{backend}.in_process.fp32.b{FORWARD_BATCH}", int8[f"{prefix}fp32_rows_s"], "rows/s", "")
        versus = f"{backend} FP32 in process"
        recorder.add(
            f"{HEAVY}.{backend}.in_process.int8.b{FORWARD_BATCH}", int8[f"{prefix}int8_rows_s"], "rows/s", versus
        )
        rows_note = f"{backend} FP32, {forward.rows_compared} rows"
        recorder.add(f"{HEAVY}.{backend}.int8.max_abs_diff", int8[f"{prefix}max_abs_diff"], "score", rows_note)


def breakdown_table(bench: Bench) -> None:
    """The server-side breakdown, where the server reports ModelStatistics."""
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


@dataclass(frozen=True)
class Target:
    """A measured ratio (or score difference) against its threshold."""

    name: str
    label: str
    threshold: float
    at_least: bool  # True: value >= threshold passes; False: value <= threshold passes
    compared_with: str
    value: float | None = None


TARGETS = (
    Target(
        "target.fraud_c32_on_vs_floor_throughput",
        f"{FRAUD} c=32 batching on throughput / floor",
        0.85,
        True,
        "floor c=32 throughput",
    ),
    Target(
        "target.fraud_c32_on_vs_floor_p99", f"{FRAUD} c=32 batching on p99 / floor p99", 1.5, False, "floor c=32 p99"
    ),
    Target("target.fraud_c1_on_vs_floor_p50", f"{FRAUD} c=1 p50 batching on / floor", 1.3, False, "floor c=1 p50"),
    Target("target.fraud_c1_on_vs_off_p50", f"{FRAUD} c=1 p50 batching on / off", 1.25, False, "batching off c=1 p50"),
    Target(
        "target.heavy_c32_on_vs_off_throughput",
        f"{HEAVY} c=32 throughput batching on / off",
        3.5,
        True,
        "batching off c=32 throughput",
    ),
    Target(
        "target.heavy_c32_on_vs_in_process",
        f"{HEAVY} c=32 batching on / in-process rows/s",
        0.80,
        True,
        f"in-process FP32 forward at batch {FORWARD_BATCH}",
    ),
    Target(
        "target.int8_static_vs_fp32_speed",
        f"{HEAVY} static INT8 / FP32, onnxruntime CPU, batch {FORWARD_BATCH}",
        2.5,
        True,
        "FP32 forward (onnxruntime)",
    ),
    Target(
        "target.int8_static_max_abs_diff",
        f"{HEAVY} static INT8 largest |score diff| vs FP32",
        0.02,
        False,
        "FP32 scores",
    ),
)


def targets(bench: Bench, forward: Forward, limit: float | None) -> list[Target]:
    """TARGETS measured: fraud_mlp against the floor and batching off, the heavy model against batching off and its
    in-process limit, static INT8 against FP32."""
    floor32, floor1 = bench.get(FLOOR, FRAUD, 32), bench.get(FLOOR, FRAUD, 1)
    on32, on1, off1 = bench.get(ON, FRAUD, 32), bench.get(ON, FRAUD, 1), bench.get(OFF, FRAUD, 1)
    on, off = bench.get(ON, HEAVY, HEAVY_CONCURRENCY), bench.get(OFF, HEAVY, HEAVY_CONCURRENCY)
    int8 = forward.int8

    def rps(r: PerfResult | None) -> float | None:
        return r.throughput if r else None

    def p50(r: PerfResult | None) -> float | None:
        return r.p50_us if r else None

    values = {
        "target.fraud_c32_on_vs_floor_throughput": ratio(rps(on32), rps(floor32)),
        "target.fraud_c32_on_vs_floor_p99": ratio(on32.p99_us if on32 else None, floor32.p99_us if floor32 else None),
        "target.fraud_c1_on_vs_floor_p50": ratio(p50(on1), p50(floor1)),
        "target.fraud_c1_on_vs_off_p50": ratio(p50(on1), p50(off1)),
        "target.heavy_c32_on_vs_off_throughput": ratio(rps(on), rps(off)),
        "target.heavy_c32_on_vs_in_process": ratio(rps(on), limit),
        "target.int8_static_vs_fp32_speed": ratio(int8["int8_rows_s"], int8["fp32_rows_s"]),
        "target.int8_static_max_abs_diff": int8["max_abs_diff"],
    }
    return [replace(t, value=values[t.name]) for t in TARGETS]


def targets_table(checks: list[Target], recorder: Recorder) -> None:
    """Each target measured, its bound and PASS / FAIL (n/a where a section did not run)."""
    rows = []
    for t in checks:
        if t.value is None:
            verdict = "n/a"
        else:
            ok = t.value >= t.threshold if t.at_least else t.value <= t.threshold
            verdict = "PASS" if ok else "FAIL"
        sign = ">=" if t.at_least else "<="
        digits = 4 if "diff" in t.name else 2
        shown = "-" if t.value is None else f"{t.value:.{digits}f}"
        rows.append([t.label, shown, f"{sign} {t.threshold:g}", verdict])
        if t.value is not None:  # a section not run (--only) leaves the figure last measured, with its time
            unit = "ratio" if "diff" not in t.name else "score"
            recorder.add(t.name, t.value, unit, f"{t.compared_with}; target {sign} {t.threshold:g}")
    results.print_table(["target", "measured", "target", "result"], rows, title="targets")


if __name__ == "__main__":
    sys.exit(main())
