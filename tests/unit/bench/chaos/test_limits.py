"""bench.chaos.limits and its report: both concurrency limits read from a running stack (Envoy's admin /stats, each
gateway's /metrics), tolerant of what does not answer, printed over the overload phase; the ingress's limit, shipped
off, turned on through Envoy's admin runtime for the overload phase alone; the ingress's own refusals told from the
gateways'; --steps runs a part of the script."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.chaos import report
from bench.chaos import run as chaos
from bench.chaos.limits import (
    ADAPTIVE_FLAG,
    CONTROLLER,
    LimitProbe,
    LimitSample,
    gateway_limits,
    gateway_metrics_urls,
)
from bench.chaos.outcomes import REFUSED, Outcome, errored
from bench.chaos.phases import OVERLOAD, Phase
from bench.chaos.script import SCRIPT, Context, Durations

STATS = "\n".join(
    [
        f"{CONTROLLER}concurrency_limit: 12",
        f"{CONTROLLER}min_rtt_msecs: 21",
        f"{CONTROLLER}sample_rtt_msecs: 34",
        f"{CONTROLLER}rq_blocked: 480",
    ]
)
METRICS = """# HELP meshserve_gateway_concurrency_limit Current (adaptive) concurrency limit.
# TYPE meshserve_gateway_concurrency_limit gauge
meshserve_gateway_concurrency_limit{pipeline="fraud"} 42.0
meshserve_gateway_concurrency_limit{pipeline="digits"} 64.0
meshserve_gateway_inflight{pipeline="fraud"} 3.0
"""


class _Admin(BaseHTTPRequestHandler):
    """Envoy's admin as the chaos run uses it: /stats, and /runtime_modify into an admin layer; the controller has
    measured its minRTT once the flag is on (with `measures`)."""

    runtime: dict[str, str] = {}
    measures = True

    def do_GET(self) -> None:
        on = _Admin.runtime.get(ADAPTIVE_FLAG) == "true"
        active = f"\n{CONTROLLER}min_rtt_calculation_active: {0 if on and _Admin.measures else 1}"
        body = (STATS + active).encode() if self.path.startswith("/stats") else b""
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/runtime_modify":
            _Admin.runtime.update(urllib.parse.parse_qsl(query))
        self.send_response(200 if path == "/runtime_modify" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def admin() -> Iterator[str]:
    _Admin.runtime = {}
    _Admin.measures = True
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def stack_json(tmp_path: Path, admin: str | None) -> Path:
    services = [
        {"name": "gateway", "address": "127.0.0.1:8000", "metrics_port": 9000},
        {"name": "gateway-2", "address": "127.0.0.1:8010", "metrics_port": 9010},
        {"name": "model-v1", "address": "127.0.0.1:8001", "metrics_port": 9001},
    ]
    (tmp_path / "stack.json").write_text(json.dumps({"admin": admin, "services": services}))
    return tmp_path


def test_gateway_limits_per_pipeline_and_where_to_read_them() -> None:
    assert gateway_limits(METRICS) == {"fraud": 42.0, "digits": 64.0}
    assert gateway_limits("") == {}
    state = {"services": [{"name": "gateway-2", "address": "127.0.0.1:8010", "metrics_port": 1}]}
    assert gateway_metrics_urls(state) == {"gateway-2": "http://127.0.0.1:1/metrics"}
    on_socket = {"name": "gateway", "address": "unix:/run/s/gateway.sock", "metrics_port": 2, "metrics": "127.0.0.1:2"}
    assert gateway_metrics_urls({"services": [on_socket]}) == {"gateway": "http://127.0.0.1:2/metrics"}


def test_a_probe_reads_both_limits(tmp_path: Path, admin: str) -> None:
    def fetch(url: str) -> str:
        if url.endswith(":9010/metrics"):
            raise OSError("connection refused")  # one gateway not answering leaves its limits empty
        return METRICS

    sample = LimitProbe(stack_json(tmp_path, admin), fetch).read(7.5)
    assert sample == LimitSample(7.5, 12, 21, 34, 480, {"gateway": {"fraud": 42.0, "digits": 64.0}, "gateway-2": {}})


def test_a_probe_of_a_stack_without_envoy_or_state_samples_nothing_and_never_raises(tmp_path: Path) -> None:
    assert LimitProbe(tmp_path).read(1.0) == LimitSample(1.0)  # no stack.json
    sample = LimitProbe(stack_json(tmp_path, "127.0.0.1:1"), lambda url: "").read(2.0)  # nothing listens on :1
    assert sample.ingress_limit is None and sample.gateways == {"gateway": {}, "gateway-2": {}}


def test_the_ingress_limit_is_switched_through_the_admin_runtime(tmp_path: Path, admin: str) -> None:
    probe = LimitProbe(stack_json(tmp_path, admin))
    assert probe.switch_ingress_limit(True).startswith("ingress adaptive limit on (minRTT 21 ms after ")
    assert _Admin.runtime == {ADAPTIVE_FLAG: "true"}
    assert probe.switch_ingress_limit(False) == "ingress adaptive limit off"
    assert _Admin.runtime == {ADAPTIVE_FLAG: "false"}
    _Admin.measures = False  # on, but no minRTT yet (too few calls): said, not waited for past the bound
    said = probe.switch_ingress_limit(True, min_rtt_wait_s=0.2)
    assert said == "ingress adaptive limit on (its minRTT not measured within 0.2 s)" and _Admin.runtime[ADAPTIVE_FLAG]


def test_a_switch_that_cannot_be_made_is_said_never_raised(tmp_path: Path) -> None:
    assert LimitProbe(tmp_path).switch_ingress_limit(True) == (
        "ingress adaptive limit not turned on: no Envoy admin in stack.json"
    )
    said = LimitProbe(stack_json(tmp_path, "127.0.0.1:1")).switch_ingress_limit(False)  # nothing listens on :1
    assert said.startswith("ingress adaptive limit not turned off: ")


class _Load:
    """What a phase uses of the open-loop load: its clock, its rate (noting the ingress flag at each change)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.samples: list[object] = []
        self.rates: list[tuple[float, str | None]] = []

    def now_s(self) -> float:
        return time.perf_counter() - self.origin

    def set_rate(self, rate: float) -> None:
        self.rates.append((rate, _Admin.runtime.get(ADAPTIVE_FLAG)))


def test_the_overload_phase_runs_with_the_ingress_limit_on_and_leaves_it_off(tmp_path: Path, admin: str) -> None:
    load = _Load()
    ctx = Context(stack_json(tmp_path, admin), 0, tmp_path, load, base_rate=10.0, overload_rate=30.0)  # type: ignore[arg-type]
    (overload,) = [s for s in SCRIPT if s.kind == OVERLOAD]
    run = report.Run("", "", True, None, "", None, [], [])
    d = Durations(lead=0.01, tail=0.01, overload=0.3)
    phase = asyncio.run(chaos.sampled_phase(ctx, 0.5, overload, d, run))
    assert phase.kind == OVERLOAD
    assert load.rates == [(30.0, "true"), (10.0, "true")]  # the overload and the way back, both with the limit on
    assert _Admin.runtime == {ADAPTIVE_FLAG: "false"}  # off after the phase
    said = run.faults["50%/overload 3x"]
    assert said.startswith("ingress adaptive limit on (minRTT 21 ms") and said.endswith("; ingress adaptive limit off")
    assert "30 req/s; back to 10 req/s" in said
    assert run.limits["50%/overload 3x"] and run.limits["50%/overload 3x"][0].ingress_limit == 12


def test_sampling_runs_until_stopped(tmp_path: Path) -> None:
    probe = LimitProbe(tmp_path)

    async def sample() -> list[LimitSample]:
        stop = asyncio.Event()
        clock = iter(range(100))
        task = asyncio.create_task(probe.sample(lambda: float(next(clock)), stop, every_s=0.01))
        await asyncio.sleep(0.1)
        stop.set()
        return await task

    samples = asyncio.run(sample())
    assert len(samples) >= 2 and [s.t_s for s in samples] == [float(i) for i in range(len(samples))]


def test_limit_rows_one_a_second_with_the_ingress_refusals_between_rows() -> None:
    phase = Phase("overload 3x", 0.5, 100, 10.0, 20.0, OVERLOAD, 11.0, 15.0)
    gateways = {"gateway": {"fraud": 40.0}, "gateway-2": {"fraud": 38.0}}
    samples = [LimitSample(10.0 + i / 2, 64 - i, 20, 22 + i, 10 * i, gateways) for i in range(20)]
    rows = report.limit_rows(phase, samples)
    assert [r[0] for r in rows] == [float(t) for t in range(10)]  # every second of the phase
    assert [r[1] for r in rows] == ["base"] + ["overload"] * 4 + ["base"] * 5
    assert rows[0][2:6] == [64, 20, 22, None] and rows[1][2:6] == [62, 20, 24, 20]
    assert rows[0][6] == "gateway 40, gateway-2 38"
    assert report.gateway_cell({"gateway": {"a": 1.0, "b": 2.0}, "gateway-2": {}}) == "gateway a 1 b 2"
    assert report.gateway_cell({}) == "-"


def test_the_report_prints_and_keeps_the_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.bench.chaos.test_report import a_run

    run = a_run()
    run.limits = {"50%/kill cache": [LimitSample(31.0, 9, 20, 40, 0, {"gateway": {"fraud": 30.0}})]}
    report.print_report(run)
    assert "concurrency limits over time, 50%/kill cache" in capsys.readouterr().out
    assert "## Concurrency limits over time, 50%/kill cache" in report.markdown(run)
    assert report.as_json(run)["limits"]["50%/kill cache"][0]["ingress_limit"] == 9


def test_the_ingress_refusals_are_told_from_the_gateways() -> None:
    ingress = "meshserve ingress: more requests in flight than the gateways serve at their healthy latency"
    assert errored("RESOURCE_EXHAUSTED", True, 0.001, 2.0, ingress) == Outcome(REFUSED, "RESOURCE_EXHAUSTED:ingress")
    gateway = "overloaded: fraud at its limit; retry after 50 ms"
    assert errored("RESOURCE_EXHAUSTED", True, 0.001, 2.0, gateway) == Outcome(REFUSED, "RESOURCE_EXHAUSTED")


def test_steps_select_part_of_the_script() -> None:
    assert chaos.parse(["--steps", "overload 3x"]).steps == ["overload 3x"]
    assert chaos.parse([]).steps is None
    with pytest.raises(SystemExit):
        chaos.parse(["--steps", "no such step"])


def test_a_probe_reads_a_gateways_metrics_with_the_stacks_internal_credential(tmp_path: Path) -> None:
    """The stack's /metrics want its internal token: the probe finds it from stack.json's secrets folder."""
    from prometheus_client import CollectorRegistry, Gauge

    from services.cli.stack.credentials import StackSecrets
    from services.common.metrics import start_metrics_server
    from tests.helpers.servers import free_port

    secrets = StackSecrets.ensure(tmp_path)
    registry = CollectorRegistry()
    Gauge("meshserve_gateway_concurrency_limit", "limit", ["pipeline"], registry=registry).labels("fraud").set(42)
    port = start_metrics_server(free_port(), "127.0.0.1", token=secrets.internal_token(), registry=registry)
    services = [{"name": "gateway", "address": "127.0.0.1:8000", "metrics_port": port}]
    state = {"admin": None, "services": services, "secrets_dir": str(secrets.dir)}
    (tmp_path / "stack.json").write_text(json.dumps(state))
    assert LimitProbe(tmp_path).read(1.0).gateways == {"gateway": {"fraud": 42.0}}
    del state["secrets_dir"]  # a client without the credential reads nothing (and never raises)
    (tmp_path / "stack.json").write_text(json.dumps(state))
    assert LimitProbe(tmp_path).read(1.0).gateways == {"gateway": {}}
