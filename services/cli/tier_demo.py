"""`meshserve demo --tier-mix`: synthetic fraud transactions to an edge tier, a share of them sensitive (their
identifiers present) and the rest general (identifiers empty); a summary of answers per tier and class, `edge_only`
answers, and the bytes the edge gateway sent to the cloud (its metrics)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from services.cli.connect import Endpoint
from services.cli.demo import retry_after_s
from services.cli.infer import build_request, input_specs, parameter_value, rows_to_arrays
from services.cli.stack.state import read_state
from services.cli.traffic import TrafficGenerator
from services.protos import inference_pb2, inference_pb2_grpc

TIER_ANSWERS = "meshserve_gateway_tier_answers_total"
CLOUD_BYTES = "meshserve_gateway_cloud_bytes_total"
EDGE_ONLY = "meshserve_gateway_edge_only_total"


def sensitive_inputs(pipeline: str = "fraud", pipelines_dir: Path | None = None) -> list[str]:
    """The inputs the pipeline marks sensitive, from its YAML (the gateway's pipelines folder by default); a
    PipelineError or OSError says why it cannot be read."""
    from services.gateway.pipeline import load_pipeline
    from services.gateway.settings import GatewaySettings

    folder = pipelines_dir or GatewaySettings.model_fields["pipelines_dir"].default
    return load_pipeline(Path(folder) / f"{pipeline}.yaml").sensitive_inputs()


def general_row(row: dict[str, Any], sensitive: list[str]) -> dict[str, Any]:
    """The row with every sensitive field empty: a general request."""
    return {k: ("" if k in sensitive else v) for k, v in row.items()}


@dataclass
class TierDemoSummary:
    """What a tier-mix run saw: per class, requests and failures; answers per (class, tier); degraded reasons;
    and from the edge gateway's metrics, the bytes it sent to the cloud and its edge_only answers."""

    duration_s: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)  # "class tier" -> count
    degraded: dict[str, int] = field(default_factory=dict)
    p50_ms: dict[str, float] = field(default_factory=dict)
    cloud_bytes: float | None = None
    edge_only: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Counts:
    requests: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    degraded: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"sensitive": [], "general": []})


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of `name` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(url: str | None, token: str = "") -> str:
    """The Prometheus text at `url` (sending the stack's internal token when there is one); empty when unreachable."""
    if url is None:
        return ""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2.0) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def internal_token(tier_dir: Path) -> str:
    """The internal token a tier's /metrics wants (`secrets/internal-token`); empty when it has none."""
    try:
        return (tier_dir / "secrets" / "internal-token").read_text().strip()
    except OSError:
        return ""


def edge_gateway_metrics(log_dir: Path | None) -> tuple[str | None, str]:
    """The /metrics URL of the edge gateway of the tiers running in `log_dir` (None: no tiers there), and the token
    it wants."""
    state = read_state(log_dir) if log_dir is not None else None
    tiers = (state or {}).get("tiers") or {}
    if "edge" not in tiers:
        return None, ""
    edge_dir = Path(tiers["edge"])
    for s in (read_state(edge_dir) or {}).get("services") or []:
        if str(s.get("name", "")).startswith("gateway") and s.get("metrics_port"):
            return f"http://127.0.0.1:{s['metrics_port']}/metrics", internal_token(edge_dir)
    return None, ""


async def _worker(
    stub: inference_pb2_grpc.GRPCInferenceServiceStub,
    specs: list[Any],
    traffic: TrafficGenerator,
    share: float,
    sensitive: list[str],
    counts: _Counts,
    deadline: float,
    metadata: tuple[tuple[str, str], ...],
) -> None:
    rng = np.random.default_rng()
    while time.monotonic() < deadline:
        klass = "sensitive" if rng.random() < share else "general"
        row = traffic.next() if klass == "sensitive" else general_row(traffic.next(), sensitive)
        request = build_request("fraud", rows_to_arrays([row], specs))
        counts.requests[klass] += 1
        t0 = time.perf_counter()
        try:
            response = await stub.ModelInfer(request, timeout=5.0, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            counts.failed[f"{klass} {e.code().name}"] += 1
            await asyncio.sleep(retry_after_s(e))
            continue
        counts.latencies[klass].append((time.perf_counter() - t0) * 1000.0)
        parameters = {k: parameter_value(v) for k, v in response.parameters.items()}
        counts.answers[f"{klass} {parameters.get('meshserve_tier', '?')}"] += 1
        if parameters.get("degraded"):
            counts.degraded[str(parameters["degraded"])] += 1


async def run_tier_demo(
    endpoint: Endpoint,
    duration_s: float = 20.0,
    concurrency: int = 4,
    share: float = 0.5,
    log_dir: Path | None = None,
    seed: int = 0,
) -> TierDemoSummary:
    """Send fraud transactions to the edge's `endpoint` for `duration_s`, `share` of them sensitive; the summary
    (bytes to the cloud and edge_only answers from the edge gateway of the tiers in `log_dir`, when found)."""
    sensitive = sensitive_inputs()
    metrics, token = edge_gateway_metrics(log_dir)
    before = scrape(metrics, token)
    counts = _Counts()
    traffic = TrafficGenerator(seed=seed, repeat=0.0)
    started = time.monotonic()
    async with endpoint.aio_channel() as channel:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        model = await stub.ModelMetadata(
            inference_pb2.ModelMetadataRequest(name="fraud"), timeout=5.0, metadata=endpoint.metadata()
        )
        specs = input_specs(model)
        args = (stub, specs, traffic, share, sensitive, counts, started + duration_s, endpoint.metadata())
        await asyncio.gather(*(_worker(*args) for _ in range(concurrency)))
    after = scrape(metrics, token)
    summary = TierDemoSummary(
        duration_s=round(time.monotonic() - started, 2),
        requests=dict(counts.requests),
        failed=dict(counts.failed),
        answers=dict(counts.answers),
        degraded=dict(counts.degraded),
        p50_ms={k: round(float(np.percentile(v, 50)), 2) for k, v in counts.latencies.items() if v},
    )
    if after:
        summary.cloud_bytes = metric_sum(after, CLOUD_BYTES) - metric_sum(before, CLOUD_BYTES)
        summary.edge_only = metric_sum(after, EDGE_ONLY) - metric_sum(before, EDGE_ONLY)
    return summary


def render_tiers(summary: TierDemoSummary) -> Table:
    """Per class: requests, answers per tier, p50, failures; then edge_only answers and bytes to the cloud."""
    table = Table(title="answers per tier")
    for column in ("class", "requests", "edge", "cloud", "p50 ms", "failed"):
        table.add_column(column)
    for klass in ("sensitive", "general"):
        failed = sum(v for k, v in summary.failed.items() if k.startswith(klass))
        table.add_row(
            klass,
            str(summary.requests.get(klass, 0)),
            str(summary.answers.get(f"{klass} edge", 0)),
            str(summary.answers.get(f"{klass} cloud", 0)),
            f"{summary.p50_ms.get(klass, 0.0):.1f}",
            str(failed),
        )
    return table


def summary_line(summary: TierDemoSummary) -> str:
    general = summary.requests.get("general", 0)
    sent = "unknown (no edge gateway metrics)" if summary.cloud_bytes is None else f"{summary.cloud_bytes:.0f} B"
    per = f" ({summary.cloud_bytes / general:.0f} B per general request)" if summary.cloud_bytes and general else ""
    edge_only = "?" if summary.edge_only is None else f"{summary.edge_only:.0f}"
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(summary.degraded.items())) or "none"
    return f"edge_only answers {edge_only}; sent to the cloud {sent}{per}; degraded: {reasons}"


async def run_tier_demo_and_explain(endpoint: Endpoint, seconds: float, console: Console, log_dir: Path) -> None:
    """`make run`'s demo on two tiers: the mix for `seconds`, its table and summary line."""
    console.rule(f"demo: {seconds:.0f} s of card transactions to the edge, half sensitive, half general")
    summary = await run_tier_demo(endpoint, seconds, log_dir=log_dir)
    console.print(render_tiers(summary))
    console.print(f"[bold]summary[/]: {summary_line(summary)}", highlight=False, soft_wrap=True)
    console.print(f"[green]still serving at {endpoint.address}[/]; Ctrl-C stops both tiers", highlight=False)
