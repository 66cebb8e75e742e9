"""The `meshserve` console script: up, down, token, ca, infer, demo, status, canary, traces."""

from __future__ import annotations

import asyncio
import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from services.cli.stack.state import default_log_dir, entry_dir, stack_address
from services.traces.cli import app as traces_app

if TYPE_CHECKING:
    from services.cli.connect import Endpoint
    from services.cli.stack.layout import StackLayout

app = typer.Typer(
    name="meshserve",
    help="Serve AI models as gRPC microservices on a service mesh: run the local stack and talk to it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)


class TracingMode(enum.StrEnum):
    retroactive = "retroactive"
    head = "head"


PORT_BASE_HELP = (
    "gRPC ports from here (gateway +0, model v1 +1/+11, feature +2, cache +3, scaler +5, canary +21; "
    "metrics +1000); 0 picks free ports."
)
DEFAULT_ADDRESS = "127.0.0.1:8080"
DEFAULT_LOG_DIR = default_log_dir()
Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        "-a",
        help=f"host:port to call (default: the ingress of the stack in --log-dir, or its gateway with `up --no-mesh`; "
        f"{DEFAULT_ADDRESS} when none runs there).",
    ),
]
StackDir = Annotated[
    Path,
    typer.Option(
        "--log-dir",
        help="The --log-dir of `meshserve up`: its stack.json and secrets give the ingress's TLS and token.",
    ),
]
Token = Annotated[
    str | None, typer.Option(help="Bearer token to send (default: minted from the local stack's key, if secure).")
]
CaFile = Annotated[
    Path | None, typer.Option("--ca", help="Use TLS, trusting this CA certificate (PEM), e.g. a remote stack's.")
]


def _endpoint(
    address: str | None, log_dir: Path, token: str | None, ca: Path | None, subject: str = "meshserve-cli"
) -> Endpoint:
    """Where and how to call: `address`, else the entry of the stack running in `log_dir` (TLS and a token as it
    wants them)."""
    from services.cli.connect import ConnectError, resolve

    try:
        return resolve(address or stack_address(log_dir, DEFAULT_ADDRESS), log_dir, token, ca, subject)
    except ConnectError as e:
        err.print(f"[red]connect[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


PortBase = Annotated[int, typer.Option(help=PORT_BASE_HELP)]
GatewayPort = Annotated[int | None, typer.Option(help="Gateway port (overrides the port base).")]
TopologyFile = Annotated[
    Path | None,
    typer.Option(
        help="Stack topology YAML: model replica groups, subsets, pinned versions (default: the demo's); "
        "`edge_cloud` (or a file with `cloud` and `edge` tiers) runs an edge and a cloud stack."
    ),
]
UpLogDir = Annotated[Path, typer.Option(help="Folder for each process's log (and stack.json).")]
Models = Annotated[Path | None, typer.Option(help="Model repository (default: ./models).")]
Pipelines = Annotated[Path | None, typer.Option(help="Pipelines folder (default: the gateway's).")]
RedisUrl = Annotated[str | None, typer.Option(help="Use this Redis instead of running Valkey under the supervisor.")]
Replicas = Annotated[
    int | None, typer.Option(min=1, max=8, help="Stable (v1) model replicas (default: the topology's).")
]
Canary = Annotated[bool | None, typer.Option(help="Run the topology's canary (v2) replicas (default: if it has them).")]
GatewayReplicas = Annotated[
    int | None, typer.Option(min=1, max=8, help="Gateway replicas behind the mesh (default: the topology's).")
]
Insecure = Annotated[
    bool, typer.Option(help="Plaintext ingress without tokens (quick trials, benchmarks); admin RPCs closed.")
]
Mesh = Annotated[
    bool, typer.Option(help="Put Envoy (rendered from istio/) in front of every service, with the ingress.")
]
Host = Annotated[str, typer.Option(help="Address every service binds.")]
StartTimeout = Annotated[float, typer.Option(help="Seconds each service has to become SERVING.")]
StopTimeout = Annotated[float, typer.Option(help="Seconds after SIGTERM before a service is killed.")]
Traces = Annotated[bool, typer.Option(help="Run the local OTLP receiver; every service and Envoy export spans to it.")]
Tracing = Annotated[
    TracingMode,
    typer.Option(
        help="retroactive: record every request, keep the slow, failed, degraded and sampled ones plus 1% "
        "(MESHSERVE_TRACING_*); head: export only what Envoy or the caller sampled."
    ),
]
DemoSeconds = Annotated[
    float, typer.Option(help="Once up, send this many seconds of demo traffic, then explain how to call it.")
]


@app.command()
def up(
    port_base: PortBase = 8000,
    gateway_port: GatewayPort = None,
    topology: TopologyFile = None,
    log_dir: UpLogDir = DEFAULT_LOG_DIR,
    models: Models = None,
    pipelines: Pipelines = None,
    redis_url: RedisUrl = None,
    replicas: Replicas = None,
    canary: Canary = None,
    gateway_replicas: GatewayReplicas = None,
    insecure: Insecure = False,
    mesh: Mesh = True,
    host: Host = "127.0.0.1",
    start_timeout: StartTimeout = 120.0,
    stop_timeout: StopTimeout = 15.0,
    traces: Traces = True,
    tracing_mode: Tracing = TracingMode.retroactive,
    demo: DemoSeconds = 0.0,
) -> None:
    """Run the local stack (Valkey, the topology's model replicas, feature, cache, gateway, Envoy) until Ctrl-C.

    The default topology is the demo's: model v1 on two replicas and v2 as canary
    (services/cli/stack/demo_topology.yaml). The ingress speaks TLS with a certificate of the stack's own CA and wants
    a token (`meshserve token`); the secrets live in <log-dir>/secrets, made at the first `up` and kept.
    """
    from services.cli.stack.tiers.layout import tier_topology_file
    from services.cli.stack.up import run_stack
    from services.mesh import MeshConfigError

    tiers_file = tier_topology_file(topology)
    if tiers_file is not None:
        single = (gateway_port, pipelines, redis_url, replicas, canary, gateway_replicas, None if mesh else False)
        _refuse_single_tier_flags(*single)
        options = dict(host=host, traces=traces, insecure=insecure, tracing_mode=tracing_mode.value)
        _up_tiers(tiers_file, log_dir, port_base, models, start_timeout, stop_timeout, demo, options)
    layout = _stack_layout(
        topology,
        log_dir,
        (replicas, canary, gateway_replicas),
        redis_url,
        tracing_mode,
        port_base=port_base,
        gateway_port=gateway_port,
        models_dir=models,
        pipelines_dir=pipelines,
        host=host,
        mesh=mesh,
        traces=traces,
        insecure=insecure,
    )
    run = run_stack(
        layout, log_dir.resolve(), console, redis_url, start_timeout, stop_timeout_s=stop_timeout, demo_s=demo
    )
    try:
        code = asyncio.run(run)
    except MeshConfigError as e:
        err.print(f"[red]mesh configuration[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _refuse_single_tier_flags(*values: object) -> None:
    """Exit 2 naming the flags of a one-tier stack that were given with a two-tier topology (in `up`'s order)."""
    flags = ("--gateway-port", "--pipelines", "--redis-url", "--replicas", "--canary", "--gateway-replicas")
    given = [flag for flag, value in zip((*flags, "--no-mesh"), values, strict=True) if value is not None]
    if given:
        err.print(f"[red]topology[/]: {', '.join(given)}: not with two tiers (their file says each tier's stack)")
        raise typer.Exit(2)


def _up_tiers(
    path: Any,
    log_dir: Path,
    port_base: int,
    models: Path | None,
    start_timeout: float,
    stop_timeout: float,
    demo: float,
    options: dict[str, Any],
) -> None:
    """`up` with a two-tier topology (services/cli/stack/tiers/layout.py): the cloud and the edge stack, each in its own
    state dir under `log_dir`; exits with their run's code (2 on a bad topology, clashing ports, a bad mesh)."""
    from services.cli.stack.tiers.layout import EdgeCloudTopology, tier_layouts
    from services.cli.stack.tiers.up import run_tiers
    from services.cli.stack.topology import TopologyFileError
    from services.mesh import MeshConfigError

    try:
        layouts = tier_layouts(EdgeCloudTopology.load(path), log_dir, port_base, models, **options)
    except TopologyFileError as e:
        err.print(f"[red]topology[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ValueError as e:
        err.print(f"[red]layout[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if not layouts.edge.models_dir.is_dir():
        err.print(f"model repository {layouts.edge.models_dir} not found (build it with `make models`, or --models)")
        raise typer.Exit(2)
    try:
        code = asyncio.run(run_tiers(layouts, console, start_timeout, stop_timeout, demo_s=demo))
    except MeshConfigError as e:
        err.print(f"[red]mesh configuration[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _stack_layout(
    topology: Path | None,
    log_dir: Path,
    counts: tuple[int | None, bool | None, int | None],
    redis_url: str | None,
    tracing_mode: TracingMode,
    **options: Any,
) -> StackLayout:
    """The layout `up` runs: the topology file's (default: the demo's) with the command line's replica counts, the
    trace store's file in the log dir, Valkey unless there is an external Redis, Envoy's admin on a socket with the
    mesh, and `options` (StackLayout.local's). Exits 2 on a bad topology, clashing ports or no model repository."""
    from services.cli.stack.layout import StackLayout
    from services.cli.stack.topology import StackTopology, TopologyFileError, demo_file

    try:
        stack = StackTopology.load(topology) if topology is not None else StackTopology.demo()
        try:
            stack = stack.with_counts(*counts, on_demand=options["mesh"])
        except TopologyFileError as e:
            where = topology if topology is not None else demo_file()
            hint = " (or --no-canary)" if "needs the mesh" in str(e) and "canary" in str(e) else ""
            raise TopologyFileError(f"{where}: {e}{hint}") from None
        layout = StackLayout.local(
            topology=stack,
            traces_db=log_dir / "traces.sqlite",
            tracing_mode=tracing_mode.value,
            valkey=redis_url is None,
            log_dir=log_dir,
            admin_socket=options["mesh"],
            **options,
        )
    except TopologyFileError as e:
        err.print(f"[red]topology[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ValueError as e:  # ports that clash
        err.print(f"[red]layout[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if not layout.models_dir.is_dir():
        err.print(f"model repository {layout.models_dir} not found (build it with `make models`, or --models)")
        raise typer.Exit(2)
    return layout


@app.command()
def infer(
    pipeline: Annotated[str, typer.Argument(help="Pipeline (or model) name, e.g. fraud or digits.")],
    json_: Annotated[
        str, typer.Option("--json", "-j", help="One row object or a list of rows (JSON); @file reads a file.")
    ],
    address: Address = None,
    debug: Annotated[bool, typer.Option(help="Ask for per-stage timings (request parameter debug=true).")] = False,
    version: Annotated[str, typer.Option(help="Model version (empty: the server's choice).")] = "",
    timeout: Annotated[float, typer.Option(help="Seconds per RPC.")] = 10.0,
    log_dir: StackDir = DEFAULT_LOG_DIR,
    token: Token = None,
    ca: CaFile = None,
) -> None:
    """Send one request; print outputs and response parameters as JSON."""
    import grpc

    from services.cli.infer import InputError, dumps, infer, rpc_error_message

    endpoint = _endpoint(address, log_dir, token, ca)
    try:
        result = infer(endpoint, pipeline, json_, debug=debug, version=version, timeout_s=timeout)
    except InputError as e:
        err.print(f"[red]bad input[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    except grpc.RpcError as e:
        err.print(f"[red]{pipeline}[/]: {rpc_error_message(e, endpoint.address)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    print(dumps(result))


@app.command()
def demo(
    duration: Annotated[float, typer.Option(min=0.1, help="Seconds of traffic.")] = 20.0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Concurrent requests in flight.")] = 8,
    address: Address = None,
    pipeline: Annotated[str, typer.Option(help="Pipeline taking fraud transactions.")] = "fraud",
    seed: Annotated[int, typer.Option(help="Traffic generator seed.")] = 0,
    repeat: Annotated[float, typer.Option(min=0, max=1, help="Share of requests re-sending an earlier one.")] = 0.3,
    live: Annotated[bool | None, typer.Option(help="Live view (default: when stdout is a terminal).")] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Also write the summary here as JSON.")] = None,
    log_dir: StackDir = DEFAULT_LOG_DIR,
    token: Token = None,
    ca: CaFile = None,
    tier_mix: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=1,
            help="Two tiers (`up --topology edge_cloud`): this share of requests sensitive (identifiers present), "
            "the rest general (identifiers empty); the summary shows answers per tier and bytes sent to the cloud.",
        ),
    ] = None,
) -> None:
    """Send synthetic transactions to the fraud pipeline with a live view; print a summary."""
    import grpc

    from services.cli.demo import render, run_demo
    from services.cli.infer import rpc_error_message

    endpoint = _endpoint(address, log_dir, token, ca, subject="demo")
    if tier_mix is not None:
        _tier_demo(endpoint, duration, concurrency, tier_mix, log_dir, summary_json)
        return
    try:
        summary = asyncio.run(run_demo(endpoint, duration, concurrency, pipeline, seed, repeat, live=live))
    except grpc.RpcError as e:
        err.print(f"[red]{pipeline}[/]: {rpc_error_message(e, endpoint.address)}", highlight=False, soft_wrap=True)
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


def _tier_demo(
    endpoint: Endpoint, duration: float, concurrency: int, share: float, log_dir: Path, summary_json: Path | None
) -> None:
    """`demo --tier-mix`: the mix of sensitive and general requests, answers per tier, bytes sent to the cloud."""
    import grpc

    from services.cli.infer import rpc_error_message
    from services.cli.tier_demo import render_tiers, run_tier_demo, summary_line

    try:
        summary = asyncio.run(run_tier_demo(endpoint, duration, concurrency, share, log_dir))
    except grpc.RpcError as e:
        err.print(f"[red]fraud[/]: {rpc_error_message(e, endpoint.address)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(render_tiers(summary))
    console.print(f"[bold]summary[/]: {summary_line(summary)}", highlight=False, soft_wrap=True)
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=2))
    if not summary.answers:
        raise typer.Exit(1)


@app.command()
def status(
    log_dir: Annotated[Path, typer.Option(help="Where `meshserve up` wrote stack.json.")] = DEFAULT_LOG_DIR,
    port_base: Annotated[int, typer.Option(help="Without stack.json: the ports of this base.")] = 8000,
) -> None:
    """Health of each process of the local stack (grpc.health.v1, Envoy's /ready, Valkey's PING) and its ingress."""
    from services.cli.status import check_all

    raise typer.Exit(check_all(log_dir, port_base, console))


@app.command()
def down(
    log_dir: Annotated[Path, typer.Option(help="The --log-dir of `meshserve up`.")] = DEFAULT_LOG_DIR,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for it to stop.")] = 60.0,
) -> None:
    """Stop the local stack running in --log-dir (both tiers of `up --topology edge_cloud`): SIGTERM to its
    `meshserve up`, then wait until every process has stopped."""
    from services.cli.stack.tiers.up import stop_running

    try:
        console.print(stop_running(log_dir, timeout), highlight=False)
    except ProcessLookupError as e:
        err.print(f"[red]down[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
def token(
    client: Annotated[
        str | None, typer.Argument(help="The client's name: the token's subject (rate limits key on it).")
    ] = None,
    operator: Annotated[
        bool, typer.Option(help="The operator's token (the only one that may load/unload models).")
    ] = False,
    ttl: Annotated[str, typer.Option(help="How long it is valid: 30d, 12h, 90m, 45s or seconds.")] = "30d",
    log_dir: Annotated[
        Path, typer.Option(help="The --log-dir of `meshserve up` (its secrets/ sign the token).")
    ] = DEFAULT_LOG_DIR,
) -> None:
    """Print a JWT for CLIENT (or, with --operator, the operator) that the local stack's ingress accepts."""
    from services.cli.stack.credentials import SecretsError
    from services.cli.tokens import issue
    from services.common.tokens import TokenError

    try:
        print(issue(log_dir, client, operator, ttl))
    except SecretsError as e:
        err.print(f"[red]token[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (ValueError, TokenError) as e:
        err.print(f"[red]token[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command("ca")
def ca_path(
    log_dir: Annotated[Path, typer.Option(help="The --log-dir of `meshserve up`.")] = DEFAULT_LOG_DIR,
) -> None:
    """Print the absolute path of the local stack's CA certificate, which clients trust for the ingress's TLS
    (grpcurl -cacert, tritonclient's root_certificates, perf_analyzer's --ssl-grpc-root-certifications-file)."""
    from services.cli.stack.credentials import StackSecrets

    path = StackSecrets.of(entry_dir(log_dir)).ca_cert
    if not path.is_file():
        err.print(f"[red]ca[/]: no CA certificate at {path} (`meshserve up` makes it)", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    print(path)


app.add_typer(
    traces_app, name="traces", help="Recent traces from the local store: list, show, hotspots, ui (the web UI)."
)
models_app = typer.Typer(help="Model repository tools.")
app.add_typer(models_app, name="models")


@models_app.command(
    "export",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def models_export(ctx: typer.Context) -> None:
    """Export an eager torch module to ONNX in the model repository, verified against torch (1,000 rows, 1e-5),
    with its config: MODULE:FACTORY --name N --version V --input name:DATATYPE:dims --output name ... (--help for
    every option; the same as `python -m services.model.export`)."""
    from services.model.export import main as export_main  # torch loads only for this command

    raise typer.Exit(export_main(list(ctx.args)))


canary_app = typer.Typer(help="Show or change the local mesh's canary split at run time (no restart).")
app.add_typer(canary_app, name="canary")
LogDir = Annotated[Path, typer.Option(help="The --log-dir of `meshserve up`.")]
Service = Annotated[str, typer.Argument(help="Service whose route is split.")]


def _canary(log_dir: Path, service: str, **change_args: object) -> None:
    from services.cli.canary import CanaryError, change

    try:
        split = change(log_dir, service, **change_args)  # type: ignore[arg-type]
    except (CanaryError, TimeoutError) as e:
        err.print(f"[red]canary[/]: {e}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"{service}: " + ", ".join(f"{k} {v}%" for k, v in split.items()), highlight=False)


@canary_app.command("show")
def canary_show(service: Service = "model", log_dir: LogDir = DEFAULT_LOG_DIR) -> None:
    """The split in force, e.g. `model: v1 90%, v2 10%`."""
    _canary(log_dir, service)


@canary_app.command("set")
def canary_set(
    service: Service,
    percent: Annotated[
        str, typer.Argument(help="Canary (v2) percent, e.g. 25; or explicit weights such as v1=50,v2=50.")
    ],
    log_dir: LogDir = DEFAULT_LOG_DIR,
) -> None:
    """Send PERCENT of the split traffic to the canary: `meshserve canary set model 25`."""
    from services.cli.canary import CanaryError, parse_weights

    try:
        if percent.strip().isdigit():
            canary_share = int(percent)
            if not 0 <= canary_share <= 100:
                raise CanaryError(f"percent must be 0..100, got {canary_share}")
            weights = {"v1": 100 - canary_share, "v2": canary_share}
        else:
            weights = parse_weights(percent)
    except CanaryError as e:
        err.print(f"[red]canary[/]: {e}", highlight=False)
        raise typer.Exit(2) from None
    _canary(log_dir, service, weights=weights)


@canary_app.command("promote")
def canary_promote(service: Service = "model", log_dir: LogDir = DEFAULT_LOG_DIR) -> None:
    """All split traffic to the canary (v2)."""
    _canary(log_dir, service, promote=True)


@canary_app.command("rollback")
def canary_rollback(service: Service = "model", log_dir: LogDir = DEFAULT_LOG_DIR) -> None:
    """All split traffic back to the stable subset (v1)."""
    _canary(log_dir, service, rollback=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
