"""`make bench`: the model service against the bare-gRPC floor, batching on vs off, ONNX Runtime against TorchScript
(in process at batch 1 and 32, served at c=1 and c=32, for both demo models and the heavy one), and static INT8
against FP32 (ONNX Runtime on the CPU, the heavy model at batch 32)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
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
from bench.lib.perf_analyzer import ensure_perf_analyzer
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_service", description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--models", type=Path, default=MODELS, help="model repository holding fraud_mlp")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        help="serving: floor, batching on/off; engines: ONNX Runtime vs TorchScript served; forward: in process only",
    )
    args = parser.parse_args(argv)
    models_dir: Path = args.models.resolve()
    command = (
        "python -m bench.model_service"
        + (f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else "")
        + (f" --models {args.models}" if models_dir != MODELS else "")
        + (f" --only {args.only}" if args.only else "")
    )
    started = time.monotonic()
    needed = [model_dir(m, models_dir) / "1" / name for m in ENGINE_MODELS for name in ("model.pt", "model.onnx")]
    needed.append(model_dir(HEAVY, models_dir) / "2" / "model.onnx")
    missing = [p for p in needed if not p.exists()]
    if missing:
        print(f"{missing[0]} is missing: run `make models` first", file=sys.stderr)
        return 1
    sections = [args.only] if args.only else list(SECTIONS)
    if sections != ["forward"]:
        ensure_perf_analyzer()
    bench = Bench(args.measurement_ms)

    with tempfile.TemporaryDirectory(prefix="meshserve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if "serving" in sections:
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
        if "engines" in sections:
            for model in ENGINE_MODELS:
                for backend in ENGINES:
                    repo = tmp / f"{backend}-{model}"
                    if model == HEAVY:
                        write_heavy(repo, True, heavy_file(models_dir), models_dir, backend)
                    else:
                        copy_model(repo, model, True, models_dir, backend)
                    bench.serve_model_service(backend, repo, [(model, c) for c in ENGINE_CONCURRENCY])

        print(
            f"\n[in process] {', '.join(ENGINE_MODELS)}: {' vs '.join(ENGINES)}; {HEAVY} INT8 vs FP32 ...", flush=True
        )
        forward = measure_forward(models_dir)

    return bench.finish(report(bench, forward, command, models_dir), started)


def report(bench: Bench, forward: Forward, command: str, models: Path = MODELS) -> list[dict[str, Any]]:
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

    # Table 2: heavy model at c=32 and the in-process limit (its forward on the backend that served it).
    on = bench.get(ON, HEAVY, HEAVY_CONCURRENCY)
    off = bench.get(OFF, HEAVY, HEAVY_CONCURRENCY)
    heavy_backend = default_backend(HEAVY, models)
    limit = forward.rows_s.get((HEAVY, heavy_backend, FORWARD_BATCH))
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
            fig(f"{key}.throughput", r.throughput, "infer/s", versus, r.command)
            fig(f"{key}.p50", r.p50_ms, "ms", "", r.command)
            fig(f"{key}.p99", r.p99_ms, "ms", "", r.command)

    # Table 3: ONNX Runtime against TorchScript, in process and served.
    rows = []
    onnx, torchscript = ENGINES
    for model in ENGINE_MODELS:
        cells: list[Any] = [model]
        for batch in ENGINE_BATCHES:
            a, b = forward.rows_s.get((model, onnx, batch)), forward.rows_s.get((model, torchscript, batch))
            cells += [a, b, ratio(a, b)]
            for backend, value in ((onnx, a), (torchscript, b)):
                fig(f"engines.{model}.{backend}.in_process.b{batch}", value, "rows/s", f"{torchscript} in process")
        for c in ENGINE_CONCURRENCY:
            a_run, b_run = bench.get(onnx, model, c), bench.get(torchscript, model, c)
            a, b = (a_run.throughput if a_run else None), (b_run.throughput if b_run else None)
            cells += [a, b, ratio(a, b)]
            for backend, run in ((onnx, a_run), (torchscript, b_run)):
                if run is not None:
                    key = f"engines.{model}.{backend}.served.c{c}"
                    versus = f"{torchscript} served at c={c}, batching on"
                    fig(f"{key}.throughput", run.throughput, "infer/s", versus, run.command)
                    fig(f"{key}.p50", run.p50_ms, "ms", versus, run.command)
                    fig(f"{key}.p99", run.p99_ms, "ms", versus, run.command)
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

    # Table 4: static INT8 against FP32, the heavy model at batch 32 in process.
    int8 = forward.int8
    results.print_table(
        ["in-process forward, batch 32", "FP32 rows/s", "INT8 rows/s", "INT8/FP32", "max |score diff|"],
        [
            [
                f"{HEAVY} onnxruntime (Q/DQ ONNX)",
                int8["fp32_rows_s"],
                int8["int8_rows_s"],
                ratio(int8["int8_rows_s"], int8["fp32_rows_s"]),
                f"{int8['max_abs_diff']:.5f}",
            ],
            [
                f"{HEAVY} torchscript (static at load)",
                int8["torchscript_fp32_rows_s"],
                int8["torchscript_int8_rows_s"],
                ratio(int8["torchscript_int8_rows_s"], int8["torchscript_fp32_rows_s"]),
                f"{int8['torchscript_max_abs_diff']:.5f}",
            ],
        ],
        title=f"static INT8 vs FP32 (score diffs over {forward.rows_compared} rows)",
    )
    for prefix, backend in (("", "onnxruntime"), ("torchscript_", "torchscript")):
        fig(f"{HEAVY}.{backend}.in_process.fp32.b{FORWARD_BATCH}", int8[f"{prefix}fp32_rows_s"], "rows/s", "")
        versus = f"{backend} FP32 in process"
        fig(f"{HEAVY}.{backend}.in_process.int8.b{FORWARD_BATCH}", int8[f"{prefix}int8_rows_s"], "rows/s", versus)
        rows_note = f"{backend} FP32, {forward.rows_compared} rows"
        fig(f"{HEAVY}.{backend}.int8.max_abs_diff", int8[f"{prefix}max_abs_diff"], "score", rows_note)

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
            "target.int8_static_vs_fp32_speed",
            ratio(int8["int8_rows_s"], int8["fp32_rows_s"]),
            f"{HEAVY} static INT8 / FP32, onnxruntime CPU, batch {FORWARD_BATCH}",
            2.5,
            "ge",
            "FP32 forward (onnxruntime)",
        ),
        (
            "target.int8_static_max_abs_diff",
            int8["max_abs_diff"],
            f"{HEAVY} static INT8 largest |score diff| vs FP32",
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
        if value is not None:  # a section not run (--only) leaves the figure last measured, with its time
            fig(name, value, "ratio" if "diff" not in name else "score", f"{versus}; target {sign} {threshold:g}")
    results.print_table(["target", "measured", "target", "result"], rows, title="targets")
    return figures


if __name__ == "__main__":
    sys.exit(main())
