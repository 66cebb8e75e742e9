"""Server-interceptor overhead: meshserve's own interceptor against opentelemetry-instrumentation-grpc's aio server
interceptor, per call, side by side (`python -m bench.experiments.interceptor_overhead`, not in `make bench`).

One process runs a grpc.aio server per configuration on loopback and a client that calls them in turn; rounds
alternate between the configurations (each round in a rotated order) so that the machine's drift hits each alike,
and each figure is the median over the rounds. The costs are CPU time of this process per call (client, servers,
the batch span processor's thread), which the other tenants of a shared machine move much less than wall time.

Configurations:
* `bare`: no interceptor (the floor).
* `metrics`: meshserve's interceptor without a tracer provider (error mapping and metrics only).
* `ours`: meshserve's interceptor with tracing, as every service runs it.
* `library`: `opentelemetry.instrumentation.grpc.aio_server_interceptor()` (health and reflection filtered out
  by a plain prefix test)
  in front of meshserve's interceptor without tracing: what adopting the library would run, since it maps no
  errors and counts nothing. Unary only: its stream wrapper iterates the handler with `async for`, so it fails
  (TypeError) on any stream written with context.write, which is what meshserve's interceptor hands it.
* `library inner`: the same two the other way round (streams then work, but the error mapping runs outside the
  span, so a failed RPC's span keeps status code OK and latency exemplars lose their trace): streams' cost.

Paths: a unary call and a 10-message response stream, each with a W3C traceparent whose sampled flag is off
(meshserve's interceptor then skips the span and the context extraction) and one whose flag is on (a SERVER span,
exported through a BatchSpanProcessor to an exporter that drops it).

The library is an optional import: run with a Python where `opentelemetry-instrumentation-grpc` is installed to
get the `library` column (without it, the others are measured alone).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.lib.results import figure, print_table, record
from services.common.interceptors import UNTRACED_PREFIXES, ErrorAndMetricsInterceptor

COMMAND = "python -m bench.experiments.interceptor_overhead"
SERVICE = "bench.Echo"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADERS = {
    "unsampled": (("traceparent", f"00-{TRACE}-00f067aa0ba902b7-00"),),
    "sampled": (("traceparent", f"00-{TRACE}-00f067aa0ba902b7-01"),),
}
STREAM_MESSAGES = 10


class Discard(SpanExporter):
    """Drops every span: the cost measured is the span's creation and processing, not an exporter's encoding."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(STREAM_MESSAGES):
        yield request


def interceptors(provider: TracerProvider) -> dict[str, Callable[[], list[grpc.aio.ServerInterceptor]]]:
    """Each configuration's server interceptors (the library's only where it is installed)."""
    configs: dict[str, Callable[[], list[grpc.aio.ServerInterceptor]]] = {
        "bare": lambda: [],
        "metrics": lambda: [ErrorAndMetricsInterceptor("bench-metrics")],
        "ours": lambda: [ErrorAndMetricsInterceptor("bench-ours", provider)],
    }
    try:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor
    except ImportError:
        return configs

    def untraced(details: grpc.HandlerCallDetails) -> bool:
        # The same test as meshserve's: the library's own filters (health_check(), service_prefix()) cost about
        # as much again as the rest of its interceptor.
        return not details.method.startswith(UNTRACED_PREFIXES)

    configs["library"] = lambda: [
        aio_server_interceptor(tracer_provider=provider, filter_=untraced),
        ErrorAndMetricsInterceptor("bench-library"),
    ]
    configs["library inner"] = lambda: [
        ErrorAndMetricsInterceptor("bench-library-inner"),
        aio_server_interceptor(tracer_provider=provider, filter_=untraced),
    ]
    return configs


async def serve(chain: list[grpc.aio.ServerInterceptor]) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=chain)
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@dataclass
class Target:
    """One configuration's server and the client's callables to it."""

    server: grpc.aio.Server
    channel: grpc.aio.Channel

    def caller(self, path: str) -> Callable[[], object]:
        kind, _, sampling = path.partition(" ")
        metadata = HEADERS[sampling]
        if kind == "unary":
            unary = self.channel.unary_unary(f"/{SERVICE}/Echo")
            return lambda: unary(b"x", metadata=metadata)
        streamed = self.channel.unary_stream(f"/{SERVICE}/Stream")

        async def drain() -> None:
            async for _ in streamed(b"x", metadata=metadata):
                pass

        return drain


async def timed(call: Callable[[], object], calls: int, concurrency: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call for `calls` calls from `concurrency` concurrent callers."""

    async def worker(n: int) -> None:
        for _ in range(n):
            await call()  # type: ignore[misc]

    share = [calls // concurrency + (1 if i < calls % concurrency else 0) for i in range(concurrency)]
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(n) for n in share))
    return (time.process_time() - cpu) / calls * 1e6, (time.perf_counter() - wall) / calls * 1e6


def runs(config: str, path: str) -> bool:
    """Whether the configuration can serve the path (see the module docstring for `library` and streams)."""
    return not (config == "library" and path.startswith("stream"))


async def measure(args: argparse.Namespace) -> tuple[list[str], dict[tuple[str, str], list[tuple[float, float]]]]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    targets: dict[str, Target] = {}
    for name, chain in interceptors(provider).items():
        server, port = await serve(chain())
        targets[name] = Target(server, grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    paths = [f"{kind} {sampling}" for kind in ("unary", "stream") for sampling in HEADERS]
    calls = {"unary": args.calls, "stream": max(1, args.calls // 4)}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {
        (c, p): [] for c in targets for p in paths if runs(c, p)
    }
    names = list(targets)
    try:
        for path in paths:  # warm-up: connections, handler wrappers, label children
            for name in names:
                if runs(name, path):
                    await timed(targets[name].caller(path), 200, args.concurrency)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for path in paths:
                n = calls[path.split()[0]]
                for name in (n for n in order if runs(n, path)):
                    results[(name, path)].append(await timed(targets[name].caller(path), n, args.concurrency))
    finally:
        for target in targets.values():
            await target.channel.close()
            await target.server.stop(None)
        provider.shutdown()
    return paths, results


def paired(a: list[tuple[float, float]], b: list[tuple[float, float]], op: Callable[[float, float], float]) -> float:
    """The median over rounds of op(a's CPU, b's CPU) within each round (drift between rounds cancels)."""
    return statistics.median(op(x[0], y[0]) for x, y in zip(a, b, strict=True))


def report(
    paths: list[str], results: dict[tuple[str, str], list[tuple[float, float]]], args: argparse.Namespace
) -> None:
    names = sorted({c for c, _ in results}, key=["bare", "metrics", "ours", "library", "library inner"].index)
    rows, figures = [], []
    for path in paths:
        bare, ours = results[("bare", path)], results[("ours", path)]
        for name in names:
            runs_ = results.get((name, path))
            if runs_ is None:
                rows.append([path, name, "fails", "", "", ""])
                continue
            cpu = statistics.median(r[0] for r in runs_)
            over = paired(runs_, bare, lambda x, y: x - y)
            ratio = paired(runs_, ours, lambda x, y: x / y)
            wall = statistics.median(r[1] for r in runs_)
            rows.append([path, name, cpu, over, wall, f"{ratio:.2f}x"])
            slug = f"interceptor.{name.replace(' ', '_')}.{path.replace(' ', '_')}"
            figures.append(figure(f"{slug}.cpu_us", round(cpu, 1), "µs/call", "CPU per call, one run", COMMAND))
            if name.startswith("library"):
                figures.append(
                    figure(
                        f"{slug}.vs_ours",
                        round(ratio, 3),
                        "ratio",
                        "CPU per call against meshserve's interceptor with tracing, paired within alternated rounds",
                        COMMAND,
                    )
                )
    title = (
        f"server interceptor overhead: CPU µs per call (client and server in one process), concurrency "
        f"{args.concurrency}, {args.rounds} alternated rounds of {args.calls} unary calls / "
        f"{max(1, args.calls // 4)} streams of {STREAM_MESSAGES} messages; medians, 'over bare' and 'vs ours' "
        "paired within each round"
    )
    print_table(["path", "interceptor", "CPU µs/call", "over bare", "wall µs/call", "vs ours"], rows, title)
    if args.record:
        print(f"\nrecorded in {record(figures)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternated rounds per configuration (medians)")
    parser.add_argument("--calls", type=int, default=1000, help="unary calls per round (a quarter as many streams)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-record", dest="record", action="store_false", help="do not write bench/results")
    args = parser.parse_args()
    paths, results = asyncio.run(measure(args))
    report(paths, results, args)


if __name__ == "__main__":
    main()
