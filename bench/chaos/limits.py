"""The two concurrency limits an overload meets, sampled over time from a running `meshserve up`: the ingress's
adaptive limit (Envoy's gradient controller, from its admin /stats; shipped off, switched on for an overload phase
through Envoy's admin runtime) and each gateway's own adaptive limit (its meshserve_gateway_concurrency_limit gauge on
its /metrics port)."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.faults import read_state
from services.cli.stack.credentials import state_internal_token
from services.common.internal_auth import auth_headers

CONTROLLER = "http.ingress.adaptive_concurrency.gradient_controller."
GATEWAY_LIMIT = "meshserve_gateway_concurrency_limit"
_GAUGE = re.compile(rf'^{GATEWAY_LIMIT}\{{[^}}]*pipeline="([^"]*)"[^}}]*\}}\s+(\S+)$', re.MULTILINE)
SAMPLE_EVERY_S = 0.5
# The RuntimeFeatureFlag of istio/envoyfilters.yaml's `ingress-adaptive-concurrency` (default false: shipped off).
ADAPTIVE_FLAG = "meshserve.ingress.adaptive_concurrency_enabled"
MIN_RTT_WAIT_S = 10.0  # turned on, the controller first measures its minRTT over 50 calls at the load running then


@dataclass(frozen=True, slots=True)
class LimitSample:
    """Both limits at one moment (`t_s`: seconds since the run's start, as the samples of answers count them).

    `ingress_*`: the gradient controller's limit, its minRTT and last sample RTT (ms) and how many calls it has
    refused since Envoy started; None where the admin interface did not answer. `gateways`: per gateway process,
    its limit for each pipeline (empty where its /metrics did not answer)."""

    t_s: float
    ingress_limit: int | None = None
    ingress_min_rtt_ms: int | None = None
    ingress_sample_rtt_ms: int | None = None
    ingress_blocked: int | None = None
    gateways: dict[str, dict[str, float]] = field(default_factory=dict)


def gateway_limits(metrics_text: str) -> dict[str, float]:
    """Pipeline -> limit, from a gateway's Prometheus text (pipelines without an adaptive limit export none)."""
    return {pipeline: float(value) for pipeline, value in _GAUGE.findall(metrics_text)}


def gateway_metrics_urls(state: Mapping[str, object]) -> dict[str, str]:
    """Gateway process name -> its /metrics URL, from stack.json's services."""
    out: dict[str, str] = {}
    services = state.get("services")
    for s in services if isinstance(services, list) else []:
        name, address, port = s.get("name", ""), s.get("address") or "", s.get("metrics_port")
        if name.startswith("gateway") and s.get("metrics"):  # host:port (the gRPC address may be a Unix socket)
            out[name] = f"http://{s['metrics']}/metrics"
        elif name.startswith("gateway") and port and ":" in address:
            out[name] = f"http://{address.rpartition(':')[0]}:{port}/metrics"
    return out


def _get(url: str, token: str = "") -> str:
    """The body at `url`, with the stack's internal `token` (its /metrics needs it)."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth_headers(token)), timeout=1.0) as response:
        body: bytes = response.read()
    return body.decode()


class LimitProbe:
    """Reads both limits of the stack whose stack.json is in `log_dir` (the addresses are read once)."""

    def __init__(self, log_dir: Path, fetch: Callable[[str], str] | None = None) -> None:
        from services.mesh.admin import EnvoyAdmin

        try:
            state = read_state(log_dir)
        except (OSError, ValueError):
            state = {}
        admin = state.get("admin")
        self.admin = EnvoyAdmin(str(admin), timeout=1.0) if admin else None
        self.gateways = gateway_metrics_urls(state)
        token = state_internal_token(state)
        self.fetch = fetch or (lambda url: _get(url, token))

    def switch_ingress_limit(self, on: bool, min_rtt_wait_s: float = MIN_RTT_WAIT_S) -> str:
        """Turns the ingress's adaptive concurrency limit on or off (ADAPTIVE_FLAG through Envoy's admin runtime,
        live); turned on, waits up to `min_rtt_wait_s` for the minRTT it measures first. What was done, for the
        report; never raises."""
        state = "on" if on else "off"
        if self.admin is None:
            return f"ingress adaptive limit not turned {state}: no Envoy admin in stack.json"
        try:
            self.admin.set_runtime({ADAPTIVE_FLAG: "true" if on else "false"})
        except OSError as e:
            return f"ingress adaptive limit not turned {state}: {e}"
        if not on:
            return "ingress adaptive limit off"
        started = time.monotonic()
        while True:
            stats = self._controller_stats()
            measured = stats.get(CONTROLLER + "min_rtt_calculation_active") == 0
            waited = time.monotonic() - started
            if measured or waited >= min_rtt_wait_s:
                break
            time.sleep(0.1)
        if not measured:
            return f"ingress adaptive limit on (its minRTT not measured within {min_rtt_wait_s:g} s)"
        return f"ingress adaptive limit on (minRTT {stats.get(CONTROLLER + 'min_rtt_msecs')} ms after {waited:.1f} s)"

    def _controller_stats(self) -> dict[str, int]:
        if self.admin is None:
            return {}
        try:
            return self.admin.stats(re.escape(CONTROLLER))
        except OSError:
            return {}

    def read(self, t_s: float) -> LimitSample:
        """One sample, stamped `t_s`; what does not answer is left empty, never raised."""
        stats = self._controller_stats()
        gateways: dict[str, dict[str, float]] = {}
        for name, url in self.gateways.items():
            try:
                gateways[name] = gateway_limits(self.fetch(url))
            except OSError:
                gateways[name] = {}
        return LimitSample(
            t_s,
            stats.get(CONTROLLER + "concurrency_limit"),
            stats.get(CONTROLLER + "min_rtt_msecs"),
            stats.get(CONTROLLER + "sample_rtt_msecs"),
            stats.get(CONTROLLER + "rq_blocked"),
            gateways,
        )

    async def sample(
        self, now_s: Callable[[], float], stop: asyncio.Event, every_s: float = SAMPLE_EVERY_S
    ) -> list[LimitSample]:
        """Samples every `every_s` until `stop` is set (each read in a thread: the load's loop never waits on it)."""
        out: list[LimitSample] = []
        while not stop.is_set():
            out.append(await asyncio.to_thread(self.read, now_s()))
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass
        return out
