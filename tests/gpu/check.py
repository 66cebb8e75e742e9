"""`make gpu-check` (or a device bundle's run.sh): every GPU path of the model service this machine can run, checked
and measured within a time budget; without a GPU each GPU part says why it did not run.

On a GPU it: prepares heavy_mlp and fraud_mlp (from `make models`, or from a bundle: heavy_mlp rebuilt from its
seed), runs the GPU tests (tests/gpu), compares FP16 with FP32 and both with ONNX Runtime on the CPU, reports
whether a row's answer depends on its batch for each precision, reads GPU memory across 20 loads and unloads,
measures rows/s in process at batch 1, 32 and 256, then serves every path with dynamic batching on and off from one
model service and drives it over gRPC with the benchmarks' closed-loop client at c=1 and c=32, reading GPU
utilisation and rows per batch from the service's own /metrics, and prices the served throughput. With a bundle it
also builds pycuda from source alongside and runs the TensorRT backend's device-memory half with it.

    python -m tests.gpu.check [--bundle DIR] [--out DIR] [--budget-s 420] [--seconds 3] [--cpu-reference] [--quick]

The report (report.md), figures (figures.json) and logs go to --out, else $OUT, else bench/results/gpu-check/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.gpu.report import Report
from tests.gpu.variants import MODELS_ENV, ROOT, TOLERANCE, TORCH_FP16, VARIANTS, Variant, missing

# On-demand list prices, USD per hour, AWS EC2 Linux in us-east-1, one GPU per instance. g5.xlarge as a rate card of
# 2026-06-17 gives it; g4dn.xlarge and g6.xlarge as AWS listed them when this was written (2026-12-03), not re-read
# since: pass --price to use today's.
PRICES = {"T4": ("g4dn.xlarge", 0.526), "L4": ("g6.xlarge", 0.8048), "A10G": ("g5.xlarge", 1.006)}
PRICES_DATED = "2026-12-03"
CPU = Variant("onnxruntime CPU", "onnxruntime", "FP32", {"backend": "onnxruntime", "device": "cpu"})
TORCH_FP32 = next(v for v in VARIANTS if v.name == "torch CUDA")
BATCHES = (1, 32, 256)
CONCURRENCY = (1, 32)
MEMORY_SLACK_MIB = 64  # allocator and driver bookkeeping: a leak of buffers or engines is far larger
FOLDERS = {"heavy_mlp": Path("bench") / "heavy_mlp", "fraud_mlp": Path("fraud_mlp")}
PYTEST_MOST_S = 150


def cost_per_million(price_per_hour: float, inferences_per_second: float) -> float:
    """USD per million inferences on an instance at `price_per_hour` serving `inferences_per_second` flat out."""
    return price_per_hour / (inferences_per_second * 3600.0) * 1e6


def parse_prices(values: list[str]) -> dict[str, tuple[str, float]]:
    prices = dict(PRICES)
    for value in values:
        gpu, _, price = value.partition("=")
        if gpu not in prices or not price:
            raise SystemExit(f"--price {value!r}: expected one of {', '.join(prices)}=<USD per hour>")
        prices[gpu] = (prices[gpu][0], float(price))
    return prices


def key(variant: Variant) -> str:
    return variant.name.replace(" ", "_")


class Check:
    """One run: its arguments, deadline, report, work folder and what earlier parts left for later ones."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.deadline = time.monotonic() + args.budget_s
        self.report = Report("python -m tests.gpu.check" + (" (bundle run.sh)" if args.bundle else ""))
        self.out: Path = args.out
        self.gpu_reason: str | None = None
        self.gpu_name = "no GPU"
        self.models: Path | None = None
        self.pycuda: subprocess.Popen[bytes] | None = None
        self.paths: list[Variant] = [CPU]
        self.served_best: dict[str, float] = {}

    def model_dir(self, name: str) -> Path:
        assert self.models is not None
        return self.models / FOLDERS[name]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self, part: str, needs_s: float) -> bool:
        """True (and the part reported skipped) when less than `needs_s` of the budget is left."""
        if self.left() >= needs_s:
            return False
        self.report.skip(part, f"time budget spent ({self.args.budget_s:.0f} s in all, {max(0, self.left()):.0f} left)")
        return True

    def no_gpu(self, part: str) -> bool:
        if self.gpu_reason is None:
            return False
        self.report.skip(part, f"no GPU ({self.gpu_reason})")
        return True

    # ------------------------------------------------------------------ parts

    def environment(self) -> None:
        from services.model.backends.gpu import gpus, why_no_gpu

        r = self.report
        r.section("Machine and paths")
        r.line(f"python {sys.version.split()[0]} at {sys.executable}")
        self.gpu_reason = why_no_gpu()
        if self.gpu_reason is None:
            gpu = gpus()[0]
            self.gpu_name = gpu.name
            cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
            r.line(f"GPU 0: {gpu.name}, compute capability {cc}, {gpu.memory_total / 2**30:.0f} GiB (NVML)")
        else:
            r.line(f"no GPU: {self.gpu_reason}")
        try:
            import torch

            cuda = torch.version.cuda or "none"
            r.line(f"torch {torch.__version__} (CUDA {cuda}), torch.cuda.is_available() = {torch.cuda.is_available()}")
        except Exception as exc:  # the check reports what it found, whatever breaks
            r.line(f"torch cannot be imported: {exc}")
        try:
            import onnxruntime as ort

            r.line(f"onnxruntime {ort.__version__}, providers {ort.get_available_providers()}")
        except Exception as exc:
            r.line(f"onnxruntime cannot be imported: {exc}")
        self.bundle_notes()
        rows = []
        for variant in [CPU, TORCH_FP32, TORCH_FP16, *[v for v in VARIANTS if v is not TORCH_FP32]]:
            why = None if variant is CPU else missing(variant)
            rows.append([variant.name, variant.precision, "present" if why is None else f"missing: {why}"])
            if why is None and variant is not CPU and variant.library == "torch":
                self.paths.append(variant)
            elif why is None and variant is not CPU:
                self.report.line(f"{variant.name} is present but this check measures torch on CUDA beside the CPU")
        r.table(["path", "precision", "here"], rows)

    def bundle_notes(self) -> None:
        """What the bundle could not carry, and what its installer did (run.sh leaves install.json)."""
        if self.args.bundle is None:
            return
        manifest = json.loads((self.args.bundle / "manifest.json").read_text())
        for item in manifest.get("not_carried", []):
            self.report.line(f"not carried: {item['name']}: {item['why']}")
        if self.args.install_report and self.args.install_report.is_file():
            installed = json.loads(self.args.install_report.read_text())
            count, target = len(installed["installed"]), installed["target"]
            self.report.line(f"bundle installed {count} wheels with --no-index into {target}")
            for line in installed.get("notes", []):
                self.report.line(line)

    def start_pycuda(self) -> None:
        """pycuda's build from the bundle's sdist, in the background (it compiles on the CPU cores)."""
        sdists = sorted(self.args.bundle.glob("sdist/pycuda-*.tar.gz")) if self.args.bundle else []
        if not sdists or self.gpu_reason is not None:
            return
        log = (self.out / "pycuda-build.log").open("wb")
        tool = str(ROOT / "tools" / "gpu_pycuda.py")
        command = [sys.executable, tool, "build", str(sdists[0]), str(self.work / "pycuda")]
        self.pycuda = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.report.line(f"pycuda: building {sdists[0].name} in the background ({os.cpu_count()} cores)")

    def prepare_models(self) -> None:
        from tests.gpu.models import prepare

        r = self.report
        r.section("Models")
        if self.gpu_reason is not None and not self.args.cpu_reference:
            self.no_gpu("models (nothing to measure)")
            return
        source = self.args.models or (self.args.bundle / "models" if self.args.bundle else ROOT / "models")
        try:
            self.models, lines = prepare(source, self.work)
        except Exception as exc:
            r.fail(f"models from {source}: {type(exc).__name__}: {exc}")
            return
        for line in lines:
            r.line(line)
        os.environ[MODELS_ENV] = str(self.models)

    def gpu_tests(self) -> None:
        r = self.report
        r.section("GPU tests (tests/gpu)")
        if self.args.skip_tests:
            r.skip("GPU tests", "--skip-tests")
            return
        if self.no_gpu("GPU tests") or self.spent("GPU tests", 60):
            return
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/gpu"]
        r.line(f"$ python {' '.join(command[1:])}")
        env = {**os.environ, MODELS_ENV: str(self.models)}
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=min(PYTEST_MOST_S, self.left() - 30)
            )
        except subprocess.TimeoutExpired as exc:
            r.fail(f"GPU tests did not finish in {exc.timeout:.0f} s")
            return
        (self.out / "pytest.log").write_text(done.stdout + done.stderr)
        summary = [line for line in done.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
        for line in done.stdout.splitlines():
            if line.startswith(("SKIPPED", "FAILED", "ERROR")):
                r.line(line[:300])
        r.line(f"pytest: {summary[0]}")
        if done.returncode not in (0, 5):
            r.fail(f"GPU tests exited {done.returncode} (pytest.log)")

    def precision_and_invariance(self) -> None:
        from tests.gpu.measure import (
            COMPARE_ROWS,
            INVARIANCE_BATCHES,
            INVARIANCE_ROWS,
            batch_invariance,
            loaded,
            max_diff,
            rows,
            scores,
        )

        r = self.report
        r.section("FP16 against FP32, and batch invariance")
        if self.no_gpu("FP16 vs FP32 and GPU batch invariance") or self.spent("precision", 30):
            return
        precision_rows, invariance_rows = [], []
        for name in FOLDERS:
            model_dir = self.model_dir(name)
            x = rows(COMPARE_ROWS, seed=3)
            answers = {}
            for variant in self.paths:
                try:
                    with loaded(model_dir, variant) as model:
                        answers[variant.precision if variant is not CPU else "CPU"] = scores(model, x, batch=256)
                        inv = batch_invariance(model)
                except Exception as exc:
                    r.fail(f"{name} through {variant.name}: {type(exc).__name__}: {str(exc)[:800]}")
                    continue
                identical = "yes" if all(v == 0 for v in inv.values()) else "no"
                invariance_rows.append([name, variant.name, *inv.values(), identical])
                for batch, diff in inv.items():
                    r.figure(f"{name}.{key(variant)}.batch_invariance.b{batch}", diff, "max |diff|", "rows alone")
            fp32_cpu = max_diff(answers["FP32"], answers["CPU"]) if "FP32" in answers else None
            fp16_fp32 = max_diff(answers["FP16"], answers["FP32"]) if {"FP16", "FP32"} <= answers.keys() else None
            fp16_cpu = max_diff(answers["FP16"], answers["CPU"]) if "FP16" in answers else None
            ok = fp16_fp32 is not None and fp16_fp32 <= TOLERANCE["FP16"]
            precision_rows.append([name, fp32_cpu, fp16_fp32, fp16_cpu, "yes" if ok else "NO"])
            r.figure(f"{name}.torch_CUDA.vs_cpu.max_abs_diff", fp32_cpu, "max |diff|", f"{COMPARE_ROWS} rows")
            r.figure(f"{name}.fp16_vs_fp32.max_abs_diff", fp16_fp32, "max |diff|", f"{COMPARE_ROWS} rows")
            if fp16_fp32 is None or fp16_fp32 > TOLERANCE["FP16"]:
                r.fail(f"{name}: FP16 vs FP32 max |diff| {fp16_fp32} (at most {TOLERANCE['FP16']})")
            if fp32_cpu is None or fp32_cpu > TOLERANCE["FP32"]:
                bound = TOLERANCE["FP32"]
                r.fail(f"{name}: torch CUDA FP32 vs ONNX Runtime CPU max |diff| {fp32_cpu} (at most {bound})")
        r.table(["model", "FP32 vs CPU", "FP16 vs FP32", "FP16 vs CPU", "FP16 within 1e-2"], precision_rows)
        r.line(f"max |diff| over {COMPARE_ROWS} rows; the CPU is ONNX Runtime on model.onnx, the reference")
        batches = [f"batch {b} vs alone" for b in INVARIANCE_BATCHES]
        r.table(["model", "path", *batches, "bit-identical"], invariance_rows)
        r.line(
            f"each of {INVARIANCE_ROWS} rows answered alone and inside batches of "
            f"{' and '.join(map(str, INVARIANCE_BATCHES))}: max |diff|; a non-zero value means the library computes "
            "a row differently by batch size (cuBLAS picks kernels by shape): reported, not hidden"
        )

    def memory(self) -> None:
        from tests.gpu.measure import RELOADS, reload_memory

        r = self.report
        r.section(f"GPU memory across {RELOADS} loads and unloads (heavy_mlp)")
        if self.no_gpu("GPU memory across reloads") or self.spent("GPU memory across reloads", 40):
            return
        table = []
        for variant in self.paths[1:]:
            baseline, after = asyncio.run(reload_memory(variant, self.work, RELOADS, self.model_dir("heavy_mlp")))
            grown = (after - baseline) / 2**20
            table.append([variant.name, baseline / 2**20, after / 2**20, grown])
            r.figure(f"heavy_mlp.{key(variant)}.reload_memory_growth", grown, "MiB", f"{RELOADS} reloads")
            if grown > MEMORY_SLACK_MIB:
                r.fail(f"{variant.name}: {RELOADS} reloads left {grown:.0f} MiB more in use")
        r.table(["path", "in use after 1 (MiB)", f"after {RELOADS} more (MiB)", "growth (MiB)"], table)
        r.line("NVML's memory in use on the whole GPU (the model manager loads and unloads in this process)")

    def cores_free(self, most_s: float = 90.0) -> None:
        """Let pycuda's build (it compiles on every core) finish before the timed parts, for at most `most_s`."""
        if self.pycuda is None or self.pycuda.poll() is not None:
            return
        started = time.monotonic()
        try:
            self.pycuda.wait(timeout=min(most_s, max(0.0, self.left() - 200)))
            self.report.line(f"waited {time.monotonic() - started:.0f} s for pycuda's build to free the cores")
        except subprocess.TimeoutExpired:
            self.report.line("pycuda's build is still compiling: the timed parts below share the cores with it")

    def in_process(self) -> None:
        from tests.gpu.measure import loaded, rows_per_second

        r = self.report
        r.section("In-process rows/s")
        self.cores_free()
        if self.gpu_reason is not None and not self.args.cpu_reference:
            self.no_gpu("in-process rows/s")
            return
        if self.gpu_reason is not None:
            self.no_gpu("in-process rows/s on the GPU paths (ONNX Runtime CPU measured alone)")
        batches = (1, 32) if self.args.quick else BATCHES
        names = ("fraud_mlp",) if self.args.quick else tuple(FOLDERS)
        table = []
        for name in names:
            model_dir = self.model_dir(name)
            for variant in self.paths:
                if self.spent(f"in-process rows/s of {name} through {variant.name}", 15):
                    continue
                repeats, window = (3, 0.05) if self.args.quick else (5, 0.2)
                try:
                    with loaded(model_dir, variant) as model:
                        found = rows_per_second(model, batches, repeats, window)
                except Exception as exc:
                    r.fail(f"rows/s of {name} through {variant.name}: {type(exc).__name__}: {str(exc)[:800]}")
                    continue
                table.append([name, variant.name, *(found.get(b) for b in BATCHES)])
                for batch, rate in found.items():
                    r.figure(f"{name}.{key(variant)}.in_process.b{batch}", rate, "rows/s", "forward, input to output")
        r.table(["model", "path", *(f"b{b} rows/s" for b in BATCHES)], table)

    def served(self) -> None:
        from tests.gpu.served import Entry, serve_and_drive

        r = self.report
        r.section("Served over gRPC (closed loop, one-row requests)")
        if self.gpu_reason is not None and not self.args.cpu_reference:
            self.no_gpu("served throughput and GPU utilisation")
            return
        if self.gpu_reason is not None:
            self.no_gpu("served GPU paths and GPU utilisation (ONNX Runtime CPU served alone)")
        if self.spent("served throughput", 40):
            return
        names = ("fraud_mlp",) if self.args.quick else ("heavy_mlp", "fraud_mlp")
        entries = [Entry(m, v, b) for m in names for v in self.paths for b in (True, False)]
        table: list[list[Any]] = []
        cells_here = []

        def on_cell(c: Any) -> None:
            cells_here.append(c)
            batching = "on" if c.entry.batching else "off"
            r.line(
                f"{c.entry.model} {c.entry.variant.name} batching {batching} c={c.concurrency}: "
                f"{c.throughput:,.0f} infer/s, p99 {c.p99_ms:.2f} ms, rows/batch {c.rows_per_batch or 0:.1f}, "
                f"GPU {'n/a' if c.gpu_utilization is None else f'{c.gpu_utilization:.0%}'}"
            )

        try:
            cells = serve_and_drive(
                self.models,
                FOLDERS,
                entries,
                CONCURRENCY,
                self.args.seconds,
                0.2 if self.args.quick else 0.5,
                self.work,
                self.out,
                self.deadline - 20,
                on_cell,
                r.line,
                r.skip,
            )
        except Exception as exc:
            r.fail(f"serving: {type(exc).__name__}: {str(exc)[:2000]}")
            return
        if cells and all(c.gpu_utilization is None for c in cells):
            r.line(
                "no meshserve_gpu_utilization_ratio in the service's /metrics: it exports NVML's gauges only where "
                "NVML sees a GPU"
            )
        for c in cells:
            batching = "batched" if c.entry.batching else "unbatched"
            base = f"{c.entry.model}.{key(c.entry.variant)}.served.{batching}.c{c.concurrency}"
            versus = f"{self.gpu_name}; closed loop, one-row requests, {self.args.seconds:g} s"
            r.figure(f"{base}.throughput", c.throughput, "infer/s", versus)
            r.figure(f"{base}.p99", c.p99_ms, "ms", versus)
            r.figure(f"{base}.rows_per_batch", c.rows_per_batch, "rows", "service /metrics")
            r.figure(f"{base}.gpu_utilization", c.gpu_utilization, "ratio", "service /metrics (NVML)")
            table.append(
                [
                    c.entry.model,
                    c.entry.variant.name,
                    "on" if c.entry.batching else "off",
                    c.concurrency,
                    c.throughput,
                    c.p50_ms,
                    c.p99_ms,
                    c.rows_per_batch,
                    c.gpu_utilization,
                    sum(c.errors.values()),
                ]
            )
            if c.entry.model == "heavy_mlp" or self.args.quick:
                best = self.served_best.get(c.entry.variant.name, 0.0)
                self.served_best[c.entry.variant.name] = max(best, c.throughput)
            if c.errors:
                r.line(f"{base}: errors {c.errors}")
        r.table(
            ["model", "path", "batching", "c", "infer/s", "p50 ms", "p99 ms", "rows/batch", "GPU util", "errors"], table
        )
        r.line(
            "GPU util: the mean of meshserve_gpu_utilization_ratio read from the service's /metrics every "
            "0.25 s during the cell (NVML: share of time a kernel ran); rows/batch: inferences / executions"
        )

    def cost(self) -> None:
        r = self.report
        r.section("Cost per million inferences")
        if self.no_gpu("cost per million"):
            return
        if not self.served_best:
            r.skip("cost per million", "no served throughput was measured")
            return
        prices = parse_prices(self.args.price)
        model = "fraud_mlp" if self.args.quick else "heavy_mlp"
        table = []
        for path, best in self.served_best.items():
            costs = {g: cost_per_million(p, best) if best else None for g, (_, p) in prices.items()}
            table.append([path, best, *costs.values()])
            for g, c in costs.items():
                r.figure(
                    f"{model}.{path.replace(' ', '_')}.usd_per_million.{g}",
                    c,
                    "USD",
                    f"{prices[g][0]} at ${prices[g][1]}/h ({PRICES_DATED})",
                )
        r.table([f"{model} path", "best infer/s", *(f"$/1M {g}" for g in prices)], table)
        r.line(
            f"USD per hour / (best served infer/s x 3600) x 1e6, at the {PRICES_DATED} list prices of "
            f"{', '.join(f'{g} {i} ${p}/h' for g, (i, p) in prices.items())}: the throughput was measured on "
            f"{self.gpu_name}, so each price says what that throughput would cost on that instance, not what "
            "those GPUs would reach"
        )

    def pycuda_part(self) -> None:
        r = self.report
        r.section("pycuda from source (the TensorRT backend's device-memory half)")
        if self.no_gpu("pycuda build and probe"):
            return
        if self.pycuda is None:
            r.skip("pycuda build", "no pycuda sdist here (a device bundle carries it)")
            return
        try:
            self.pycuda.wait(timeout=max(1.0, self.left()))
        except subprocess.TimeoutExpired:
            self.pycuda.kill()
            self.pycuda.wait()
            r.skip("pycuda build", f"still compiling when the time budget ran out ({self.args.budget_s:.0f} s)")
            return
        log = (self.out / "pycuda-build.log").read_text(errors="replace").strip().splitlines()
        built = json.loads(log[-1]) if log and log[-1].startswith("{") else {"built": False, "why": "no result"}
        if not built["built"]:
            r.fail(f"pycuda build: {built['why'][:1500]}")
            return
        r.line(f"pycuda built from source in {built['seconds']} s")
        command = [sys.executable, str(ROOT / "tools" / "gpu_pycuda.py"), "probe", built["source"]]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(10.0, self.left()))
        lines = done.stdout.strip().splitlines()
        probe = json.loads(lines[-1]) if lines else {"ran": False, "why": done.stderr[-1500:]}
        if probe.get("ran"):
            r.line(
                f"TensorRTModel.forward/unload with pycuda {probe['pycuda']} (driver {probe['driver_version']}): "
                f"{probe['rows_checked']} rows host -> device -> device -> host through {probe['instances']} "
                f"instances (streams, pagelocked and device buffers), equal, in {probe['seconds']} s"
            )
        else:
            r.fail(f"pycuda probe: {probe['why'][:1500]}")

    def part(self, step: Callable[[], None]) -> None:
        """Run one part; an exception fails that part alone (a GPU run is too rare to lose to one bug)."""
        try:
            step()
        except Exception as exc:
            traceback.print_exc()
            self.report.fail(f"{step.__name__}: {type(exc).__name__}: {str(exc)[:1500]}")

    def run(self) -> int:
        self.part(self.environment)
        self.part(self.start_pycuda)
        self.part(self.prepare_models)
        expected = self.gpu_reason is not None and not self.args.cpu_reference  # no models: each part says why
        for step in (self.gpu_tests, self.precision_and_invariance, self.memory, self.in_process, self.served):
            if self.models is None and not expected:
                self.report.skip(step.__name__, "no models to measure (see Models)")
            else:
                self.part(step)
        self.part(self.cost)
        self.part(self.pycuda_part)
        written = self.report.write(self.out)
        print(f"\nwrote {', '.join(str(p) for p in written)}")
        if self.gpu_reason is None:
            from bench.lib import results

            results.record(self.report.figures)
        return 1 if self.report.failed else 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.check", description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, help="a device bundle (make gpu-bundle): its models, sdists, manifest")
    parser.add_argument("--models", type=Path, help="a models/ folder (default: the bundle's, else models/)")
    parser.add_argument("--out", type=Path, help="where report.md, figures.json and logs go (default $OUT)")
    parser.add_argument("--install-report", type=Path, help="the bundle installer's install.json")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting parts after this long")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per served cell")
    parser.add_argument("--cpu-reference", action="store_true", help="without a GPU, still run the CPU path")
    parser.add_argument("--quick", action="store_true", help="fraud_mlp only, short windows (a dry run)")
    parser.add_argument("--skip-tests", action="store_true", help="no pytest run of tests/gpu")
    parser.add_argument("--price", action="append", default=[], help="GPU=USD/hour, e.g. L4=0.80 (T4, L4, A10G)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results" / "gpu-check"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="meshserve-gpu-check-") as work:
        return Check(args, Path(work)).run()


if __name__ == "__main__":
    sys.exit(main())
