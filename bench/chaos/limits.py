"""The two concurrency limits an overload meets, sampled over time from a running `meshserve up`: the ingress's
adaptive limit (Envoy's gradient controller, from its admin /stats) and each gateway's own adaptive limit (its
meshserve_gateway_concurrency_limit gauge on its /metrics port)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.faults import read_state

CONTROLLER = "http.ingress.adaptive_concurrency.gradient_controller."
GATEWAY_LIMIT = "meshserve_gateway_concurrency_limit"
_GAUGE = re.compile(rf'^{GATEWAY_LIMIT}\{{[^}}]*pipeline="([^"]*)"[^}}]*\}}\s+(\S+)$', re.MULTILINE)
SAMPLE_EVERY_S = 0.5


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
        if name.startswith("gateway") and port and ":" in address:
            out[name] = f"http://{address.rpartition(':')[0]}:{port}/metrics"
    return out


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=1.0) as response:
        body: bytes = response.read()
    return body.decode()


class LimitProbe:
    """Reads both limits of the stack whose stack.json is in `log_dir` (the addresses are read once)."""

    def __init__(self, log_dir: Path, fetch: Callable[[str], str] = _get) -> None:
        from services.mesh.admin import EnvoyAdmin

        try:
            state = read_state(log_dir)
        except (OSError, ValueError):
            state = {}
        admin = state.get("admin")
        self.admin = EnvoyAdmin(str(admin), timeout=1.0) if admin else None
        self.gateways = gateway_metrics_urls(state)
        self.fetch = fetch

    def read(self, t_s: float) -> LimitSample:
        """One sample, stamped `t_s`; what does not answer is left empty, never raised."""
        stats: dict[str, int] = {}
        if self.admin is not None:
            try:
                stats = self.admin.stats(re.escape(CONTROLLER))
            except OSError:
                stats = {}
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
