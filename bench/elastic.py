"""`python -m bench.elastic`: the local stack scaling its model replicas with the load (0 to 3, the shipped
elastic topology) against the same stack at a fixed size (the elastic one's most replicas), under the same open-loop
schedule through the ingress: nothing, low, high, low, idle until the group sleeps at zero, a burst. It reports per
phase what was sent, answered, failed and lost with p50/p99, the cold starts, the first answer after a start from
zero, the replica count over time, how long a load step waited for its added replica, what each stack's model
replicas used (replica-, CPU- and memory-seconds, cost per million requests) and the targets.

The elastic run comes first; the fixed run then repeats its schedule with the same phase lengths. Extra rounds from
zero (elastic only, after the schedule) add samples of the first answer; at each start from zero a few requests with
a deadline shorter than the cold start check that they end DEADLINE_EXCEEDED at their deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.chaos.load import TEMPLATES, OpenLoop, request_bytes, request_templates
from bench.chaos.stack import ingress_channel
from bench.lib import elastic_report
from bench.lib.elastic_report import ELASTIC, FIXED, StackResult
from bench.lib.elastic_targets import Probe
from bench.lib.fraud_load import MODEL_INFER, gateway_metric_samples
from bench.lib.load_phases import Phase
from bench.lib.local_stack import RunningStack, local_stack
from bench.lib.replica_usage import UsageSampler
from bench.lib.scaling import count_at, read_cold_starts, read_decisions
from bench.lib.serving import ROOT, ServerStartError
from services.cli.stack.credentials import state_internal_token

COMMAND = "python -m bench.elastic"
ELASTIC_TOPOLOGY = ROOT / "services" / "cli" / "stack" / "elastic_topology.yaml"
PROBE_IDS = 10**11  # probes' transaction numbers start here, far from the load's
POLL_S = 0.2
PARKED_METRIC = "meshserve_gateway_parked_seconds"


@dataclasses.dataclass
class Schedule:
    """The load of each phase and how long each lasts (every field a flag)."""

    low_rate: float = 20.0
    high_rate: float = 150.0
    burst: int = 60
    zero_s: float = 5.0
    low_s: float = 15.0
    high_s: float = 20.0
    burst_s: float = 12.0
    zero_hold_s: float = 5.0
    idle_most_s: float = 90.0
    cold_rounds: int = 3
    cold_round_s: float = 3.0
    probes: int = 2
    probe_deadline_s: float = 0.25
    deadline_s: float = 10.0


HELP = {
    "low_rate": "requests/s of the low phases",
    "high_rate": "requests/s of the high phase",
    "burst": "requests sent at once in the burst (the ingress admits 64 in flight: the gateway DestinationRule)",
    "zero_s": "the first phase, without load (the elastic group asleep at zero)",
    "low_s": "each low phase",
    "high_s": "the high phase",
    "burst_s": "the burst phase (its answers come back in it)",
    "zero_hold_s": "idle: how long the elastic group stays at zero before the burst",
    "idle_most_s": "idle: the longest wait for the elastic group to reach zero",
    "cold_rounds": "extra rounds from zero after the schedule (elastic only): low load after reaching zero",
    "cold_round_s": "each extra round's load",
    "probes": "requests with a short deadline sent at each start from zero",
    "probe_deadline_s": "their deadline (shorter than a cold start)",
    "deadline_s": "every other request's deadline (longer than a cold start)",
}


class Load(OpenLoop):
    """The chaos run's open loop, plus a burst: `n` requests at once."""

    def burst(self, n: int) -> None:
        for _ in range(n):
            self._spawn(0.0)


async def probe(channel: grpc.aio.Channel, payload: bytes, deadline_s: float, metadata: Any) -> Probe:
    """One request with a short deadline: the code it ended with and when."""
    call = channel.unary_unary(MODEL_INFER)
    t = time.perf_counter()
    try:
        await call(payload, timeout=deadline_s, metadata=metadata or None)
        code = "OK"
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name
    return Probe(code, time.perf_counter() - t, deadline_s)


class Driver:
    """Runs the schedule against one stack and notes its phases."""

    def __init__(self, load: Load, channel: grpc.aio.Channel, result: StackResult, schedule: Schedule) -> None:
        self.load = load
        self.channel = channel
        self.result = result
        self.s = schedule
        self.elastic = result.kind == ELASTIC
        self.probes_sent = 0
        self.probe_tasks: list[asyncio.Task[Probe]] = []

    def at_zero(self) -> bool:
        """The group is asleep: no model process, and the autoscaler's last decision (if it wrote any) says 0."""
        snapshots = self.result.snapshots
        if not snapshots or snapshots[-1].procs:
            return False
        decisions = read_decisions(self.result.log_dir, self.result.origin_wall, self.result.subset)
        return not decisions or count_at(decisions, self.result.initial_replicas, float("inf")) == 0

    async def until_zero(self, most_s: float) -> bool:
        """Wait (at most `most_s`) until the group sleeps at zero; whether it did."""
        deadline = time.perf_counter() + most_s
        while not self.at_zero():
            if time.perf_counter() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def send_probes(self) -> None:
        for _ in range(self.s.probes):
            payload = request_bytes(self.load.templates, PROBE_IDS + self.probes_sent)
            self.probes_sent += 1
            call = probe(self.channel, payload, self.s.probe_deadline_s, self.load.metadata)
            self.probe_tasks.append(asyncio.create_task(call))

    async def phase(self, name: str, seconds: float, rate: float = 0.0, burst: int = 0, compared: bool = True) -> Phase:
        """One phase: its load for `seconds`; probes first when it starts from zero."""
        start = self.load.now_s()
        from_zero = self.elastic and (rate > 0 or burst > 0) and self.at_zero()
        if from_zero:
            self.send_probes()
        self.load.set_rate(rate)
        if burst:
            self.load.burst(burst)
        await asyncio.sleep(seconds)
        return self.note(Phase(name, start, self.load.now_s(), rate, burst, from_zero, compared))

    def note(self, p: Phase) -> Phase:
        """Keep a phase that ended and say so."""
        self.result.phases.append(p)
        back = sum(1 for x in self.load.samples if p.start_s <= x.sent_s < p.end_s)
        alive = len(self.result.snapshots[-1].procs) if self.result.snapshots else "-"
        print(
            f"  {self.result.kind:<7} {p.name:<12} {p.end_s - p.start_s:5.1f} s  {p.load:>11}  back so far {back:5}  "
            f"model processes {alive}",
            flush=True,
        )
        return p

    async def idle(self, seconds: float | None) -> Phase:
        """No load: on the elastic stack until it sleeps at zero, then `zero_hold_s` more (at most `idle_most_s`
        in all); on the fixed one, `seconds` (the elastic idle's length)."""
        self.load.set_rate(0)
        if seconds is not None:
            return await self.phase("idle", seconds)
        start = self.load.now_s()
        reached = await self.until_zero(self.s.idle_most_s)
        zero_at = self.load.now_s()
        if reached:
            await asyncio.sleep(self.s.zero_hold_s)
            self.result.at_zero.append((zero_at, self.load.now_s()))
        else:
            print(f"  elastic did not reach zero within {self.s.idle_most_s:g} s")
        return self.note(Phase("idle", start, self.load.now_s()))


async def schedule_phases(d: Driver, lengths: dict[str, float] | None) -> None:
    """The compared schedule: zero, low, high, low again, idle, burst (`lengths`: the elastic run's, for the fixed
    run), then the elastic stack's extra rounds from zero."""
    s = d.s

    def length(name: str, default: float) -> float:
        return lengths.get(name, default) if lengths else default

    zero = await d.phase("zero", length("zero", s.zero_s))
    if d.elastic and d.at_zero():
        d.result.at_zero.append((zero.start_s, zero.end_s))
    await d.phase("low", length("low", s.low_s), rate=s.low_rate)
    await d.phase("high", length("high", s.high_s), rate=s.high_rate)
    await d.phase("low again", length("low again", s.low_s), rate=s.low_rate)
    await d.idle(lengths.get("idle") if lengths else None)
    await d.phase("burst", length("burst", s.burst_s), burst=s.burst)
    d.load.set_rate(0)
    if not d.elastic:
        return
    for i in range(s.cold_rounds):
        start = d.load.now_s()
        reached = await d.until_zero(s.idle_most_s)
        d.note(Phase(f"to zero {i + 1}", start, d.load.now_s(), compared=False))
        if not reached:
            print("  elastic did not reach zero: no more rounds from zero")
            return
        await d.phase(f"from zero {i + 1}", s.cold_round_s, rate=s.low_rate, compared=False)
        d.load.set_rate(0)
        await d.load.drain()


async def drive(
    stack: RunningStack, result: StackResult, s: Schedule, secure: bool, lengths: dict[str, float] | None
) -> None:
    """The schedule against `stack` through its ingress; fills `result`."""
    templates = await asyncio.to_thread(request_templates, TEMPLATES, int(time.time()) - 7200)
    channel, metadata = ingress_channel(stack.log_dir, stack.ingress, secure)
    async with channel:
        load = Load(channel, templates, s.deadline_s, result.origin, metadata)
        d = Driver(load, channel, result, s)
        stop = asyncio.Event()
        runner = asyncio.create_task(load.run(stop))
        try:
            await schedule_phases(d, lengths)
        finally:
            stop.set()
            load.set_rate(0)
            await runner
            await load.drain()
            result.probes = list(await asyncio.gather(*d.probe_tasks))
    result.samples = sorted(load.samples, key=lambda x: x.sent_s)
    result.unfinished = load.sent - len(load.samples)


# ----------------------------------------------------------------------------- the stacks


@dataclasses.dataclass(frozen=True)
class Group:
    """What the benchmark reads from a topology file: the stable group's subset, start count and scaled model."""

    subset: str
    replicas: int
    most: int
    model: str


def read_group(path: Path) -> Group:
    """The stable group of a topology file (raw YAML: the fields `meshserve up` validates when it starts)."""
    stable = yaml.safe_load(path.read_text())["stable"]
    replicas = int(stable.get("replicas", 1))
    pinned = list(stable.get("pinned_versions") or {})
    model = stable.get("scale_on") or (pinned[0] if len(pinned) == 1 else "fraud_mlp")
    return Group(str(stable["subset"]), replicas, int(stable.get("max_replicas", replicas)), str(model))


def fixed_topology(source: Path, dest: Path, replicas: int) -> Path:
    """`source` with its stable group fixed at `replicas` (replicas = min_replicas = max_replicas)."""
    data = yaml.safe_load(source.read_text())
    data["stable"].update(replicas=replicas, min_replicas=replicas, max_replicas=replicas)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def parked(stack: RunningStack) -> tuple[float, float] | None:
    """The gateways' parked requests so far: how many, and their seconds parked in all (None: no such metric)."""
    count = total = 0.0
    found = False
    for service in stack.state.get("services", []):
        if not str(service.get("name", "")).startswith("gateway") or not service.get("metrics_port"):
            continue
        try:
            samples = gateway_metric_samples(int(service["metrics_port"]), state_internal_token(stack.state))
        except OSError:
            continue
        for sample in samples:
            if sample.name == f"{PARKED_METRIC}_count":
                count, found = count + sample.value, True
            elif sample.name == f"{PARKED_METRIC}_sum":
                total += sample.value
    return (count, total) if found else None


def run_stack(
    kind: str,
    topology: Path,
    log_dir: Path,
    args: argparse.Namespace,
    schedule: Schedule,
    lengths: dict[str, float] | None = None,
) -> StackResult:
    """Start the stack of `topology`, run the schedule through its ingress while sampling its model replicas, stop
    it, and read its decisions and cold starts."""
    group = read_group(topology)
    up_args = ["--topology", str(topology), *([] if args.secure else ["--insecure"]), *args.up_arg]
    print(f"[{kind}] meshserve up {' '.join(up_args)} (logs {log_dir})", flush=True)
    with local_stack(log_dir, up_args) as stack:
        origin, origin_wall = time.perf_counter(), time.time()
        result = StackResult(kind, group.replicas, log_dir, origin, origin_wall, group.subset)
        with UsageSampler(stack.process.pid, origin, args.sample_s) as sampler:
            result.snapshots = sampler.snapshots
            asyncio.run(drive(stack, result, schedule, args.secure, lengths))
        result.parked = parked(stack)
    result.decisions = read_decisions(log_dir, origin_wall, group.subset)
    result.cold_starts = read_cold_starts(log_dir, origin_wall, group.model)
    if args.log_dir:
        print(f"  raw figures in {save_raw(result, log_dir / f'bench-{kind}.json')}")
    return result


def save_raw(result: StackResult, path: Path) -> Path:
    """Everything a stack's run measured, as JSON (for a look after the run: `--log-dir` keeps it)."""
    raw = {
        "kind": result.kind,
        "origin_wall": result.origin_wall,
        "phases": [dataclasses.asdict(p) for p in result.phases],
        "at_zero": result.at_zero,
        "samples": [[x.sent_s, x.latency_s, x.kind, x.reason] for x in result.samples],
        "probes": [dataclasses.asdict(p) for p in result.probes],
        "snapshots": [
            [x.t_s, x.reaped_cpu_s, [[p.pid, p.cpu_s, p.rss_bytes] for p in x.procs]] for x in result.snapshots
        ],
        "decisions": [dataclasses.asdict(d) for d in result.decisions],
        "cold_starts": [dataclasses.asdict(c) for c in result.cold_starts],
        "parked": result.parked,
    }
    path.write_text(json.dumps(raw))
    return path


# ----------------------------------------------------------------------------- the command


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Schedule]:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    defaults = Schedule()
    for name, value in defaults.__dict__.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=type(value), default=value, help=f"{HELP[name]} (default {value:g})")
    parser.add_argument("--topology", type=Path, default=ELASTIC_TOPOLOGY, help="the elastic stack's topology")
    parser.add_argument("--fixed-replicas", type=int, help="the fixed stack's replicas (default: the elastic max)")
    parser.add_argument("--no-fixed", action="store_true", help="run the elastic stack only (no comparison)")
    parser.add_argument(
        "--price-per-hour",
        type=float,
        default=elastic_report.USD_PER_INSTANCE_HOUR,
        help=f"USD per replica-hour (default: {elastic_report.PRICE_SOURCE})",
    )
    parser.add_argument("--sample-s", type=float, default=1.0, help="how often /proc is sampled")
    parser.add_argument("--secure", action="store_true", help="through the TLS + JWT ingress (default: --insecure)")
    parser.add_argument("--up-arg", action="append", default=[], help="an extra `meshserve up` argument (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="keep both stacks' logs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results/latest.json")
    args = parser.parse_args(argv)
    schedule = Schedule(**{name: getattr(args, name) for name in defaults.__dict__})
    return args, schedule


def main(argv: list[str] | None = None) -> int:
    args, schedule = parse(argv)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="meshserve-bench-elastic-") as tmp:
        logs = args.log_dir.resolve() if args.log_dir else Path(tmp) / "logs"
        topology = args.topology.resolve()
        most = args.fixed_replicas or read_group(topology).most
        fixed_path = fixed_topology(topology, Path(tmp) / "fixed_topology.yaml", most)
        try:
            elastic = run_stack(ELASTIC, topology, logs / ELASTIC, args, schedule)
            lengths = {p.name: p.end_s - p.start_s for p in elastic.phases if p.compared}
            fixed = None if args.no_fixed else run_stack(FIXED, fixed_path, logs / FIXED, args, schedule, lengths)
        except ServerStartError as exc:
            print(f"could not start: {exc}", file=sys.stderr)
            return 1
    machine = (
        f"{os.cpu_count()} cores, 1-min load average {load_before:.1f} before the first stack, "
        f"{os.getloadavg()[0]:.1f} after the last"
    )
    run = elastic_report.Run(command, schedule.deadline_s, elastic, fixed, most, args.price_per_hour, machine)
    table = elastic_report.print_report(run)
    if not args.no_record:
        path = elastic_report.record(run, table)
        print(f"\nrecorded in {path.relative_to(ROOT)}")
    print(f"took {time.monotonic() - started:.0f} s")
    return 0 if any(p.loaded for p in elastic.phases) and elastic.samples else 1


if __name__ == "__main__":
    sys.exit(main())
