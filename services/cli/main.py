"""The `meshserve` console script: up, infer, demo, status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="meshserve",
    help="Serve AI models as gRPC microservices on a service mesh: run the local stack and talk to it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)

PORT_BASE_HELP = (
    "gRPC ports from here (gateway +0, model v1 +1/+11, feature +2, cache +3, canary +21; metrics +1000); "
    "0 picks free ports."
)
Address = Annotated[str, typer.Option("--address", "-a", help="Gateway host:port (the Envoy ingress is :8080).")]


@app.command()
def up(
    port_base: Annotated[int, typer.Option(help=PORT_BASE_HELP)] = 8000,
    gateway_port: Annotated[int | None, typer.Option(help="Gateway port (overrides the port base).")] = None,
    log_dir: Annotated[Path, typer.Option(help="Folder for each process's log (and stack.json).")] = Path(".logs"),
    models: Annotated[Path | None, typer.Option(help="Model repository (default: ./models).")] = None,
    pipelines: Annotated[Path | None, typer.Option(help="Pipelines folder (default: the gateway's).")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Use this Redis instead of an embedded Valkey.")] = None,
    replicas: Annotated[int, typer.Option(min=1, max=8, help="Model v1 replicas.")] = 2,
    canary: Annotated[bool, typer.Option(help="Run the model v2 canary replica.")] = True,
    mesh: Annotated[
        bool, typer.Option(help="Put Envoy (rendered from istio/) in front of every service, with the ingress.")
    ] = True,
    host: Annotated[str, typer.Option(help="Address every service binds.")] = "127.0.0.1",
    start_timeout: Annotated[float, typer.Option(help="Seconds each service has to become SERVING.")] = 120.0,
    stop_timeout: Annotated[float, typer.Option(help="Seconds after SIGTERM before a service is killed.")] = 15.0,
) -> None:
    """Run the local stack (Valkey, model v1 x2 + v2 canary, feature, cache, gateway, Envoy) until Ctrl-C."""
    from services.cli.topology import Topology
    from services.cli.up import run_stack
    from services.mesh import MeshConfigError

    topology = Topology.local(port_base, gateway_port, replicas, canary, models, pipelines, host, mesh)
    if not topology.models_dir.is_dir():
        err.print(f"model repository {topology.models_dir} not found (build it with `make models`, or --models)")
        raise typer.Exit(2)
    try:
        code = asyncio.run(
            run_stack(topology, log_dir.resolve(), console, redis_url, start_timeout, stop_timeout_s=stop_timeout)
        )
    except MeshConfigError as e:
        err.print(f"[red]mesh configuration[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def infer(
    pipeline: Annotated[str, typer.Argument(help="Pipeline (or model) name, e.g. fraud or digits.")],
    json_: Annotated[
        str, typer.Option("--json", "-j", help="One row object or a list of rows (JSON); @file reads a file.")
    ],
    address: Address = "127.0.0.1:8000",
    debug: Annotated[bool, typer.Option(help="Ask for per-stage timings (request parameter debug=true).")] = False,
    version: Annotated[str, typer.Option(help="Model version (empty: the server's choice).")] = "",
    timeout: Annotated[float, typer.Option(help="Seconds per RPC.")] = 10.0,
) -> None:
    """Send one request; print outputs and response parameters as JSON."""
    import grpc

    from services.cli.infer import InputError, dumps, infer, rpc_error_message

    try:
        result = infer(address, pipeline, json_, debug=debug, version=version, timeout_s=timeout)
    except InputError as e:
        err.print(f"[red]bad input[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    except grpc.RpcError as e:
        err.print(f"[red]{pipeline}[/]: {rpc_error_message(e, address)}", highlight=False)
        raise typer.Exit(1) from None
    print(dumps(result))


@app.command()
def demo(
    duration: Annotated[float, typer.Option(min=0.1, help="Seconds of traffic.")] = 20.0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Concurrent requests in flight.")] = 8,
    address: Address = "127.0.0.1:8000",
    pipeline: Annotated[str, typer.Option(help="Pipeline taking fraud transactions.")] = "fraud",
    seed: Annotated[int, typer.Option(help="Traffic generator seed.")] = 0,
    repeat: Annotated[float, typer.Option(min=0, max=1, help="Share of requests re-sending an earlier one.")] = 0.3,
    live: Annotated[bool | None, typer.Option(help="Live view (default: when stdout is a terminal).")] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Also write the summary here as JSON.")] = None,
) -> None:
    """Send synthetic transactions to the fraud pipeline with a live view; print a summary."""
    import grpc

    from services.cli.demo import render, run_demo
    from services.cli.infer import rpc_error_message

    try:
        summary = asyncio.run(run_demo(address, duration, concurrency, pipeline, seed, repeat, live=live))
    except grpc.RpcError as e:
        err.print(f"[red]{pipeline}[/]: {rpc_error_message(e, address)}", highlight=False)
        raise typer.Exit(1) from None
    if not (console.is_terminal if live is None else live):  # the live view already shows the final figures
        console.print(render(summary))
    console.print(
        f"[bold]summary[/]: {summary.ok}/{summary.requests} ok in {summary.duration_s:.1f}s, {summary.rps:.1f} req/s, "
        f"p50 {summary.p50_ms:.2f} ms, p99 {summary.p99_ms:.2f} ms, cache hits {summary.cache_hit_ratio:.1%}, "
        f"degraded {summary.degraded}, errors {sum(summary.errors.values())}",
        highlight=False,
    )
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=2))
    if summary.ok == 0:
        raise typer.Exit(1)


@app.command()
def status(
    log_dir: Annotated[Path, typer.Option(help="Where `meshserve up` wrote stack.json.")] = Path(".logs"),
    port_base: Annotated[int, typer.Option(help="Without stack.json: the ports of this base.")] = 8000,
) -> None:
    """Health (grpc.health.v1) of each service of the local stack."""
    from services.cli.status import check_all

    raise typer.Exit(check_all(log_dir, port_base, console))


@app.command()
def canary(
    weights: Annotated[str | None, typer.Option("--set", help="New split, e.g. v1=50,v2=50 (sums to 100).")] = None,
    promote: Annotated[bool, typer.Option(help="Send all split traffic to v2.")] = False,
    rollback: Annotated[bool, typer.Option(help="Send all split traffic back to v1.")] = False,
    service: Annotated[str, typer.Option(help="Service whose route is split.")] = "model",
    log_dir: Annotated[Path, typer.Option(help="The --log-dir of `meshserve up`.")] = Path(".logs"),
) -> None:
    """Show or change the canary split of the running local mesh (Envoy reloads routes; no restart)."""
    from services.cli.canary import CanaryError, change, parse_weights

    if sum([weights is not None, promote, rollback]) > 1:
        err.print("give one of --set, --promote, --rollback")
        raise typer.Exit(2)
    try:
        split = change(log_dir, service, parse_weights(weights) if weights else None, promote, rollback)
    except (CanaryError, TimeoutError) as e:
        err.print(f"[red]canary[/]: {e}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"{service}: " + ", ".join(f"{k} {v}%" for k, v in split.items()), highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
