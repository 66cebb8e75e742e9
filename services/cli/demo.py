"""`meshserve demo`: synthetic transactions to the `fraud` pipeline, a live view, and a summary; after `make run`'s
demo, a model group going to zero replicas and waking on the next requests."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from services.cli.connect import Endpoint
from services.cli.infer import build_request, decode_outputs, input_specs, parameter_value, rows_to_arrays
from services.cli.traffic import TrafficGenerator
from services.protos import inference_pb2, inference_pb2_grpc

if TYPE_CHECKING:
    from services.cli.stack.autoscaler import Autoscaler
    from services.cli.stack.topology import ModelGroup

BINS = 10


@dataclass
class DemoSummary:
    """What one demo run measured (also returned to callers such as `make run` and tests)."""

    pipeline: str
    address: str
    duration_s: float
    concurrency: int
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cache: dict[str, int] = field(default_factory=dict)
    cache_hit_ratio: float = 0.0
    degraded: int = 0
    degraded_reasons: dict[str, int] = field(default_factory=dict)
    model_versions: dict[str, int] = field(default_factory=dict)
    score_histogram: list[int] = field(default_factory=lambda: [0] * BINS)
    # Micro-batching as the gateway formed it: per stage, mean and largest requests per downstream call.
    batches: dict[str, tuple[float, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DemoStats:
    """Counters updated by the workers; `summary()` at any time."""

    def __init__(self, pipeline: str, address: str, concurrency: int) -> None:
        self.pipeline = pipeline
        self.address = address
        self.concurrency = concurrency
        self.started = time.monotonic()
        self.latencies_ms: list[float] = []
        self.errors: Counter[str] = Counter()
        self.cache: Counter[str] = Counter()
        self.degraded: Counter[str] = Counter()
        self.versions: Counter[str] = Counter()
        self.histogram = [0] * BINS
        self.calls: Counter[str] = Counter()  # stage -> requests seen in it
        self.call_shares: dict[str, float] = {}  # stage -> sum of 1/size: the calls those requests made
        self.largest: Counter[str] = Counter()

    def ok(self, latency_ms: float, parameters: dict[str, Any], scores: np.ndarray | None) -> None:
        self.latencies_ms.append(latency_ms)
        if "cache" in parameters:
            self.cache[str(parameters["cache"])] += 1
        if parameters.get("degraded"):
            self.degraded[str(parameters["degraded"])] += 1
        if "model_version" in parameters:
            self.versions[str(parameters["model_version"])] += 1
        for key, value in parameters.items():
            if key.startswith("batch_") and isinstance(value, int) and value > 0:
                stage = key[6:]
                self.calls[stage] += 1
                self.call_shares[stage] = self.call_shares.get(stage, 0.0) + 1.0 / value
                self.largest[stage] = max(self.largest[stage], value)
        if scores is not None:
            for s in np.asarray(scores, dtype=np.float64).reshape(-1):
                if np.isfinite(s):
                    self.histogram[min(BINS - 1, max(0, int(s * BINS)))] += 1

    def error(self, code: str) -> None:
        self.errors[code] += 1

    def summary(self, elapsed_s: float | None = None) -> DemoSummary:
        elapsed = elapsed_s if elapsed_s is not None else time.monotonic() - self.started
        ok = len(self.latencies_ms)
        lat = np.asarray(self.latencies_ms) if ok else np.zeros(1)
        looked_up = sum(self.cache.values())
        return DemoSummary(
            pipeline=self.pipeline,
            address=self.address,
            duration_s=round(elapsed, 3),
            concurrency=self.concurrency,
            requests=ok + sum(self.errors.values()),
            ok=ok,
            errors=dict(self.errors),
            rps=round(ok / elapsed, 1) if elapsed > 0 else 0.0,
            p50_ms=round(float(np.percentile(lat, 50)), 2),
            p99_ms=round(float(np.percentile(lat, 99)), 2),
            cache=dict(self.cache),
            cache_hit_ratio=round(self.cache["hit"] / looked_up, 3) if looked_up else 0.0,
            degraded=sum(self.degraded.values()),
            degraded_reasons=dict(self.degraded),
            model_versions=dict(self.versions),
            score_histogram=list(self.histogram),
            batches={
                stage: (round(n / self.call_shares[stage], 2), self.largest[stage]) for stage, n in self.calls.items()
            },
        )


def histogram_lines(counts: list[int], width: int = 30) -> list[str]:
    top = max(counts) or 1
    return [
        f"{i / BINS:.1f}-{(i + 1) / BINS:.1f} {'█' * round(width * c / top):<{width}} {c}" for i, c in enumerate(counts)
    ]


def render(summary: DemoSummary) -> Table:
    """The live view's table of rates, latencies, cache, degradation, errors and the score histogram."""
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("requests", f"{summary.requests} ({summary.ok} ok)")
    table.add_row("requests/s", f"{summary.rps:.1f}")
    table.add_row("latency", f"p50 {summary.p50_ms:.2f} ms   p99 {summary.p99_ms:.2f} ms")
    cache = ", ".join(f"{k} {v}" for k, v in sorted(summary.cache.items())) or "-"
    table.add_row("cache hit ratio", f"{summary.cache_hit_ratio:.1%}  ({cache})")
    reasons = ", ".join(f"{k}: {v}" for k, v in summary.degraded_reasons.items())
    table.add_row("degraded", f"{summary.degraded}" + (f"  ({reasons})" if reasons else ""))
    table.add_row("errors", ", ".join(f"{k} {v}" for k, v in sorted(summary.errors.items())) or "0")
    versions = ", ".join(f"{k}: {v}" for k, v in sorted(summary.model_versions.items())) or "-"
    table.add_row("model versions", versions)
    table.add_row("score histogram", "\n".join(histogram_lines(summary.score_histogram)))
    batches = ", ".join(f"{stage} {mean:.1f} (max {most})" for stage, (mean, most) in sorted(summary.batches.items()))
    table.add_row("requests per call", batches or "-")
    return table


def retry_after_s(error: grpc.aio.AioRpcError, default_ms: int = 50) -> float:
    """The server's `grpc-retry-pushback-ms` hint (seconds), else `default_ms`."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-retry-pushback-ms":
            with contextlib.suppress(ValueError):
                return max(0, int(value)) / 1000.0
    return default_ms / 1000.0


async def _worker(
    stub: inference_pb2_grpc.GRPCInferenceServiceStub,
    pipeline: str,
    specs: list,
    traffic: TrafficGenerator,
    stats: DemoStats,
    deadline: float,
    stop: asyncio.Event,
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...],
) -> None:
    while time.monotonic() < deadline and not stop.is_set():
        request = build_request(pipeline, rows_to_arrays([traffic.next()], specs), parameters={"debug": True})
        t0 = time.perf_counter()
        try:
            response = await stub.ModelInfer(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            stats.error(e.code().name)
            if e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                await asyncio.sleep(retry_after_s(e))  # shed or restarting: back off as a well-behaved client
            continue
        latency_ms = (time.perf_counter() - t0) * 1000.0
        parameters = {k: parameter_value(v) for k, v in response.parameters.items()}
        outputs = decode_outputs(response)
        stats.ok(latency_ms, parameters, outputs.get("score"))


async def run_demo(
    address: str | Endpoint = "127.0.0.1:8000",
    duration_s: float = 20.0,
    concurrency: int = 8,
    pipeline: str = "fraud",
    seed: int = 0,
    repeat: float = 0.3,
    timeout_s: float = 5.0,
    console: Console | None = None,
    live: bool | None = None,
) -> DemoSummary:
    """Send synthetic transactions for `duration_s` from `concurrency` workers on one channel; the summary.

    `address` is plaintext without a token, or an Endpoint (TLS, token). Raises grpc.RpcError when the pipeline's
    metadata cannot be read (stack down, unknown pipeline, no token).
    """
    endpoint = Endpoint(address) if isinstance(address, str) else address
    address = endpoint.address
    metadata = endpoint.metadata()
    console = console or Console()
    live = console.is_terminal if live is None else live
    traffic = TrafficGenerator(seed=seed, repeat=repeat)
    stats = DemoStats(pipeline, address, concurrency)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        async with endpoint.aio_channel() as channel:
            stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
            model = await stub.ModelMetadata(
                inference_pb2.ModelMetadataRequest(name=pipeline), timeout=timeout_s, metadata=metadata
            )
            specs = input_specs(model)
            stats.started = time.monotonic()
            deadline = stats.started + duration_s
            workers = [
                asyncio.create_task(_worker(stub, pipeline, specs, traffic, stats, deadline, stop, timeout_s, metadata))
                for _ in range(concurrency)
            ]
            if live:
                await _live_view(console, stats, workers, duration_s)
            await asyncio.gather(*workers)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    summary = stats.summary()
    return summary


async def _live_view(console: Console, stats: DemoStats, workers: list[asyncio.Task[None]], duration_s: float) -> None:
    """A progress bar over the run and the table of its figures, four times a second until the workers are done."""
    progress = Progress(
        TextColumn(f"[bold]{stats.pipeline}[/] @ {stats.address}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
    )
    task = progress.add_task("demo", total=duration_s)
    with Live(console=console, refresh_per_second=4, transient=False) as view:
        while not all(w.done() for w in workers):
            progress.update(task, completed=min(duration_s, time.monotonic() - stats.started))
            view.update(Group(progress, render(stats.summary())))
            await asyncio.wait(workers, timeout=0.25)
        progress.update(task, completed=duration_s)
        view.update(Group(progress, render(stats.summary())))


@dataclass
class WakeUp:
    """What `wake_up` saw: the requests sent while a group woke, and when the first answer from it came."""

    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    first_ms: float | None = None  # the very first request's latency (sent with the group at zero)
    woken_after_s: float | None = None  # from the first request until the first answer the woken group gave
    woken_ms: float | None = None  # that answer's own latency


async def wake_up(
    address: str | Endpoint,
    versions: set[str] | None,
    timeout_s: float = 30.0,
    concurrency: int = 2,
    pipeline: str = "fraud",
    seed: int = 1,
) -> WakeUp:
    """Send transactions from `concurrency` workers until an answer comes from one of `versions` (its
    `model_version`; None: any answer) or `timeout_s` passes; what happened."""
    endpoint = Endpoint(address) if isinstance(address, str) else address
    metadata = endpoint.metadata()
    traffic = TrafficGenerator(seed=seed, repeat=0.0)
    out = WakeUp()
    errors: Counter[str] = Counter()
    done = asyncio.Event()
    async with endpoint.aio_channel() as channel:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        model = await stub.ModelMetadata(inference_pb2.ModelMetadataRequest(name=pipeline), metadata=metadata)
        specs = input_specs(model)
        started = time.perf_counter()

        async def worker() -> None:
            while not done.is_set() and time.perf_counter() - started < timeout_s:
                request = build_request(pipeline, rows_to_arrays([traffic.next()], specs))
                t0 = time.perf_counter()
                out.requests += 1
                first = out.requests == 1
                try:
                    response = await stub.ModelInfer(request, timeout=timeout_s, metadata=metadata)
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] += 1
                    await asyncio.sleep(retry_after_s(e))
                    continue
                latency_ms = (time.perf_counter() - t0) * 1000.0
                out.ok += 1
                if first:
                    out.first_ms = latency_ms
                parameters = {k: parameter_value(v) for k, v in response.parameters.items()}
                woke = versions is None or str(parameters.get("model_version")) in versions
                if woke and not parameters.get("degraded"):
                    if out.woken_after_s is None:
                        out.woken_after_s = time.perf_counter() - started
                        out.woken_ms = latency_ms
                    done.set()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.errors = dict(errors)
    return out


async def scale_to_zero_demo(autoscaler: Autoscaler, group: ModelGroup, endpoint: Endpoint, console: Console) -> None:
    """Wait (printing progress) until `group` is at zero replicas after its scale-down window without demand, then
    send requests until it answers again; print how long that took and the first answer's latency from zero."""
    subset, window = group.subset, group.scale_down_window_s
    scaler = autoscaler.groups[subset]
    console.rule(f"scale to zero: {subset} sleeps after {window:g} s without demand and wakes on the next request")
    deadline = time.monotonic() + window + 30.0  # the window, then a retire's drain
    while scaler.current > 0 or scaler.busy:  # until the last replica has drained and exited
        left = deadline - time.monotonic()
        if left <= 0:
            console.print(f"[yellow]{subset} still at {scaler.current} replicas[/] (autoscale.json)", highlight=False)
            return
        console.print(
            f"{subset}: {scaler.current} replica(s), idle for {scaler.idle_s():.0f} of {window:g} s", highlight=False
        )
        await autoscaler.wait_for(subset, lambda n: n == 0, min(5.0, left))
    console.print(f"[green]{subset} is at 0 replicas[/] ({_last_reason(autoscaler, subset)})", highlight=False)
    versions = group.pinned_versions.get(group.model or "")
    woken = {str(v) for v in versions} if versions else None
    sent = time.monotonic()
    waiting = asyncio.create_task(autoscaler.wait_for(subset, lambda n: n > 0, 60.0))
    wake = await wake_up(endpoint, woken, timeout_s=60.0)
    back_s = time.monotonic() - sent if await waiting else None
    errors = ", ".join(f"{k} {v}" for k, v in sorted(wake.errors.items()))
    if wake.woken_after_s is None:
        console.print(f"[yellow]{subset} did not answer within 60 s[/] ({wake.ok}/{wake.requests} ok {errors})")
        return
    replica = f"a replica serving {back_s:.1f} s after the first request" if back_s is not None else "replicas back"
    console.print(
        f"[green]{subset} is back[/]: {replica} ({_last_reason(autoscaler, subset, up=True)}); its first answer "
        f"came {wake.woken_after_s:.2f} s after the first request and took {wake.woken_ms:.0f} ms; "
        f"{wake.ok}/{wake.requests} requests ok" + (f" ({errors})" if errors else ""),
        highlight=False,
    )


def _last_reason(autoscaler: Autoscaler, subset: str, up: bool = False) -> str:
    """The reason of the group's last decision (its last upward one with `up`)."""
    for d in reversed(autoscaler.decisions):
        if d.subset == subset and (not up or d.after > d.before):
            return d.reason
    return "no decision yet"
