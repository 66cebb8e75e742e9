"""`python -m bench.edge`: two tiers (`meshserve up --topology edge_cloud`, the 30 ms emulated WAN on the edge's
egress) side by side with the edge stack alone (the same INT8 model, one tier): sensitive p50 at the edge against
the edge alone; general p50 through the WAN against the WAN plus the cloud stack alone (its ingress called
directly); the bytes per general request each `leave_edge` policy sends to the cloud (the edge gateway's
meshserve_gateway_cloud_bytes_total). Phases alternate within each round; each p50 is the median of the rounds'."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.lib import results
from bench.lib.edge_load import LoopRun, closed_loop, stream
from bench.lib.fraud_load import gateway_metric_samples
from bench.lib.local_stack import RunningStack, local_stack
from bench.lib.serving import ROOT
from services.cli.stack.tiers.layout import EDGE_CLOUD_FILE, wan_delay_ms

CLOUD_BYTES = "meshserve_gateway_cloud_bytes_total"
POLICIES = {"derived_features": "fraud", "request": "fraud_request"}  # leave_edge -> the pipeline that says it


@dataclass(frozen=True)
class Phase:
    """One measured path: its name, where it is called, the pipeline, the class of its requests."""

    name: str
    target: str  # "alone" (the edge stack alone), "edge" or "cloud" (the two tiers' ingresses)
    pipeline: str
    sensitive: bool
    policy: str = ""  # the leave_edge policy a general request to the edge follows


PHASES = (
    Phase("sensitive, edge stack alone", "alone", "fraud", True),
    Phase("sensitive, two tiers", "edge", "fraud", True),
    Phase("general, cloud stack alone", "cloud", "fraud", False),
    Phase("general, two tiers, derived_features", "edge", "fraud", False, "derived_features"),
    Phase("general, two tiers, request", "edge", "fraud_request", False, "request"),
)


@dataclass
class Measured:
    """Per phase, every round's run, and for the two tiers' phases the bytes the edge gateway sent to the cloud and
    the answers."""

    runs: dict[str, list[LoopRun]] = field(default_factory=dict)
    sent_bytes: dict[str, float] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)  # warm-up included, as the gateway's bytes are

    def per_request(self, phase: str) -> float | None:
        answers = self.answers.get(phase, 0)
        return self.sent_bytes.get(phase, 0.0) / answers if answers else None

    def p50(self, phase: str) -> float | None:
        values = [p for r in self.runs.get(phase, []) if (p := r.p50_ms()) is not None]
        return statistics.median(values) if values else None


def pipelines_folder(folder: Path) -> Path:
    """pipelines/ with a second fraud pipeline, `fraud_request`, whose placement sends the raw general request to
    the cloud (leave_edge: request) where `fraud` sends the derived features."""
    folder.mkdir(parents=True)
    for path in (ROOT / "pipelines").glob("*.yaml"):
        (folder / path.name).write_text(path.read_text())
    spec = yaml.safe_load((folder / "fraud.yaml").read_text())
    spec["name"] = "fraud_request"
    spec["placement"] = {**spec.get("placement", {}), "leave_edge": "request"}
    (folder / "fraud_request.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def topologies(folder: Path, pipelines: Path) -> tuple[Path, Path]:
    """The two-tier topology with both tiers on `pipelines`, and the edge stack alone: the edge tier's model group
    as a one-tier topology."""
    tiers = yaml.safe_load((ROOT / "services/cli/stack" / EDGE_CLOUD_FILE).read_text())
    for tier in ("cloud", "edge"):
        tiers[tier]["pipelines"] = str(pipelines)
    two = folder / "edge_cloud.yaml"
    two.write_text(yaml.safe_dump(tiers))
    alone = folder / "edge_alone.yaml"
    alone.write_text(yaml.safe_dump({"stable": tiers["edge"]["stable"]}))
    return two, alone


def edge_gateway_metrics(tiers: RunningStack) -> tuple[int, str]:
    """The edge gateway's /metrics port and the internal token it wants."""
    import json

    edge_dir = Path(tiers.state["tiers"]["edge"])
    state = json.loads((edge_dir / "stack.json").read_text())
    port = next(s["metrics_port"] for s in state["services"] if s["name"].startswith("gateway"))
    token_file = edge_dir / "secrets" / "internal-token"
    return int(port), token_file.read_text().strip() if token_file.is_file() else ""


def cloud_bytes(port: int, token: str, policy: str) -> float:
    """What the edge gateway has counted so far of the bytes it sent to the cloud under `policy` (empty: all)."""
    return sum(
        s.value
        for s in gateway_metric_samples(port, token)
        if s.name == CLOUD_BYTES and s.labels.get("leave_edge") == (policy or s.labels.get("leave_edge"))
    )


def measure(
    addresses: dict[str, str], metrics: tuple[int, str], args: argparse.Namespace, log: Callable[[str], None]
) -> Measured:
    """Every phase once per round, in order, each a closed loop of new transactions."""
    out = Measured()
    t0, start = int(time.time()), 0
    for r in range(args.rounds):
        for phase in PHASES:
            before = cloud_bytes(*metrics, phase.policy) if phase.target == "edge" else 0.0
            requests = stream(phase.pipeline, phase.sensitive, t0, start)
            start += 1_000_000
            run = asyncio.run(
                closed_loop(addresses[phase.target], args.concurrency, args.seconds, requests, args.warm_s)
            )
            out.runs.setdefault(phase.name, []).append(run)
            if phase.target == "edge":
                sent = cloud_bytes(*metrics, phase.policy) - before
                out.sent_bytes[phase.name] = out.sent_bytes.get(phase.name, 0.0) + sent
                out.answers[phase.name] = out.answers.get(phase.name, 0) + run.tiers.total()
            errors = f", errors {dict(run.errors)}" if run.errors else ""
            log(f"round {r + 1} {phase.name}: p50 {run.p50_ms() or float('nan'):.2f} ms, {dict(run.tiers)}{errors}")
    return out


def table(m: Measured, wan_ms: float) -> tuple[list[str], list[list[Any]], list[dict[str, Any]]]:
    """The rows printed (phase, p50, compared with, ratio, bytes per request) and the figures recorded."""
    alone, sensitive = m.p50("sensitive, edge stack alone"), m.p50("sensitive, two tiers")
    cloud = m.p50("general, cloud stack alone")
    sensitive_bytes = m.per_request("sensitive, two tiers")
    wan_cloud = cloud + wan_ms if cloud is not None else None
    rows: list[list[Any]] = [
        ["sensitive, edge stack alone", alone, "", None, None],
        ["sensitive, two tiers", sensitive, "edge stack alone", results.ratio(sensitive, alone), sensitive_bytes],
        ["general, cloud stack alone", cloud, "", None, None],
        [f"WAN ({wan_ms:g} ms) + cloud stack alone", wan_cloud, "", None, None],
    ]
    figures = [
        results.figure("edge.sensitive_p50_ratio", results.ratio(sensitive, alone), "x", "the edge stack alone"),
        results.figure("edge.general_cloud_alone_p50", cloud, "ms", "the cloud ingress called directly"),
        results.figure("edge.sensitive_cloud_bytes_per_request", sensitive_bytes, "B", "none may cross"),
    ]
    for policy, pipeline in POLICIES.items():
        name = f"general, two tiers, {policy}"
        p50, per_request = m.p50(name), m.per_request(name)
        rows.append([name, p50, "WAN + cloud stack alone", results.ratio(p50, wan_cloud), per_request])
        figures += [
            results.figure(f"edge.general_p50.{policy}", p50, "ms", f"WAN + cloud alone {wan_cloud or 0:.2f} ms"),
            results.figure(f"edge.cloud_bytes_per_request.{policy}", per_request, "B", f"pipeline {pipeline}"),
        ]
    headers = ["path", "p50 ms", "compared with", "ratio", "B to the cloud per request"]
    return headers, rows, figures


@contextlib.contextmanager
def stacks(folder: Path, args: argparse.Namespace) -> Iterator[tuple[RunningStack, RunningStack]]:
    """The two tiers and the edge stack alone, both up (plaintext ingresses unless --secure is not offered)."""
    pipelines = pipelines_folder(folder / "pipelines")
    two, alone = topologies(folder, pipelines)
    common = ["--insecure", *args.up_arg]
    env = {"MESHSERVE_MODEL_SERVE_MODELS": '["fraud_mlp"]'}  # the edge alone serves what the edge tier serves
    with (
        local_stack(folder / "tiers", ["--topology", str(two), *common]) as tiers,
        local_stack(folder / "alone", ["--topology", str(alone), "--pipelines", str(pipelines), *common], env) as one,
    ):
        yield tiers, one


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.edge", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per phase per round")
    parser.add_argument("--warm-s", type=float, default=1.0, help="untimed seconds before each phase")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (each p50: the rounds' median)")
    parser.add_argument("--concurrency", type=int, default=1, choices=range(1, 5), help="calls in flight (1..4)")
    parser.add_argument("--up-arg", action="append", default=[], help="an extra `meshserve up` argument (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="keep the stacks' logs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results/latest.json")
    parser.add_argument("--short", action="store_true", help="a quick check that it works: 1 round of 2 s")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.short:
        args.rounds, args.seconds, args.warm_s = 1, 2.0, 0.5
    wan_ms = wan_delay_ms() or 0.0
    command = "python -m bench.edge " + " ".join(argv if argv is not None else sys.argv[1:])
    with contextlib.ExitStack() as cleanup:
        folder = args.log_dir or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="bench-edge-")))
        with stacks(folder, args) as (tiers, alone):
            addresses = {"alone": alone.ingress, "edge": tiers.ingress, "cloud": tiers.state["cloud_ingress"]}
            m = measure(addresses, edge_gateway_metrics(tiers), args, lambda line: print(line, flush=True))
    headers, rows, figures = table(m, wan_ms)
    results.print_table(headers, rows, f"two tiers, {wan_ms:g} ms WAN, c={args.concurrency}, {args.rounds} round(s)")
    if not args.no_record and not args.short:
        print(f"recorded in {results.record([{**f, 'command': command} for f in figures])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
