"""perf_analyzer runs against servers started for them, collected by (target, model, concurrency), and their cells."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lib import results
from bench.lib.model_repo import FRAUD
from bench.lib.perf_analyzer import PerfAnalyzerError, PerfResult, run_perf_analyzer
from bench.lib.serving import (
    ROOT,
    ServerStartError,
    floor_argv,
    free_port,
    model_service_argv,
    model_service_env,
    running,
)

FRAUD_CONCURRENCY = (1, 8, 32)  # fraud_mlp's batch-1 load, on the model service, its peers and the floor
FLOOR = "floor"
ON = "batching on"
OFF = "batching off"


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
        self.serve(FLOOR, floor_argv(port), port, loads, health=False, shown="python -m bench.lib.floor_server")


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


def perf_cells(r: PerfResult | None) -> list[float | None]:
    """Table cells for one measurement: infer/s, p50, p90, p99 (ms)."""
    if r is None:
        return [None, None, None, None]
    return [r.throughput, r.p50_ms, r.p90_ms, r.p99_ms]
