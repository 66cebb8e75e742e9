"""Settings of always-on recording and retroactive trace collection, shared by every service (`MESHSERVE_TRACING_*`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from services.common.settings import EnvSettings


class RecordingSettings(EnvSettings):
    """How a process traces once an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT; without one, nothing).

    The same variables go to every process of a stack (like MESHSERVE_REDIS_URL). The gateway's per-pipeline
    triggers live in the pipeline files (`tracing:`); the values here are the defaults of pipelines without one and
    of calls that are not pipeline requests.
    """

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_TRACING_", extra="ignore", frozen=True)

    mode: Literal["auto", "head", "retroactive"] = Field(
        "auto",
        description="`retroactive`: record every request into a bounded in-memory buffer and export a trace only "
        "once the edge keeps it (slow, failed, degraded, sampled by its caller, or the random baseline), collected "
        "from every process it touched; `head`: the OpenTelemetry SDK with its sampler (OTEL_TRACES_SAMPLER), every "
        "sampled span exported; `auto`: retroactive when `peers` or `peers_file` are given, else head.",
    )
    peers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Admin (metrics) addresses `host:port` of every process whose buffer a kept trace is collected "
        "from (JSON list or comma-separated); a name resolving to several addresses (a Kubernetes headless Service) "
        "means every one of them. This process's own address may be listed.",
    )
    peers_file: Path | None = Field(
        None,
        description="A file of more peers, `host:port` one a line (or a JSON list), read again every few seconds: what "
        "a supervisor that knows the stack's ports writes (`meshserve up`), or a mounted ConfigMap.",
    )
    buffer_spans: int = Field(
        20_000,
        ge=1,
        description="Spans one process keeps in memory; past it the oldest traces go, whole, and a trace collected "
        "after losing spans to it is marked partial.",
    )
    remember_evicted: int = Field(
        200_000, ge=0, description="Evicted trace ids remembered, so that a collection can tell lost from untouched."
    )
    collect_delay_ms: float = Field(
        300.0,
        ge=0,
        description="How long after the keep decision the collection starts (work that ends after the answer, such "
        "as the cache store, lands first); kept traces are collected together, one request per process.",
    )
    collect_interval_ms: float = Field(
        1000.0, ge=0, description="Least time between two collections (each costs every peer one request)."
    )
    collect_timeout_ms: float = Field(1000.0, gt=0, description="How long a process's buffer may take to answer.")
    max_kept_per_s: float = Field(
        200.0,
        gt=0,
        description="Most traces kept per second and process (a burst of errors must not become a collection storm); "
        "beyond it keeps are dropped and counted (meshserve_tracing_keep_dropped_total).",
    )
    max_pending: int = Field(
        10_000, ge=1, description="Kept traces waiting for collection; beyond it keeps are dropped and counted."
    )
    slow_ms: float = Field(
        0.0, ge=0, description="Default latency trigger: keep a request slower than this (ms); 0: no fixed bound."
    )
    slow_percentile: float = Field(
        99.0,
        ge=0,
        lt=100,
        description="Default latency trigger: keep a request slower than this rolling percentile of its pipeline's "
        "recent successful requests; 0: no rolling bound.",
    )
    baseline: float = Field(0.01, ge=0, le=1, description="Share of requests kept at random, whatever they did.")
    queue_wait_ms: float = Field(
        0.0,
        ge=0,
        description="Model service trigger: keep a request whose wait in a batch queue exceeded this (ms); 0: off.",
    )
    parent_header: bool = Field(
        True,
        description="Send the caller's span id in x-meshserve-parent on every call, so that a callee behind a proxy "
        "that replaces the traceparent's parent without recording (an unsampled Envoy) hangs on the caller's span; "
        "off saves a header per call where no such proxy sits between processes.",
    )
    gc_young_threshold: int = Field(
        10_000,
        ge=0,
        description="The garbage collector's young-generation threshold while recording (Python's default is 700): "
        "recording allocates a few objects per span and keeps the buffer's alive, and with the default the young "
        "collections ran often enough to be a third of recording's cost; 0 keeps the interpreter's setting.",
    )
    export_delay_ms: float = Field(
        500.0, gt=0, description="How often head-sampled spans (a caller's sampled traceparent) are exported."
    )
    export_max_spans: int = Field(
        20_000, ge=1, description="Head-sampled spans waiting for export; past it they are dropped (and counted)."
    )

    @field_validator("peers", mode="before")
    @classmethod
    def _peer_list(cls, value: Any) -> Any:
        return peer_list(value) if isinstance(value, str) else value

    def all_peers(self) -> list[str]:
        """`peers` and what `peers_file` lists now (a missing or unreadable file lists none)."""
        listed: list[str] = []
        if self.peers_file is not None:
            try:
                listed = peer_list(self.peers_file.read_text())
            except (OSError, ValueError):
                listed = []
        return [*self.peers, *(p for p in listed if p not in self.peers)]

    @property
    def retroactive(self) -> bool:
        """Whether this process records and collects (the mode, with `auto` resolved)."""
        return self.mode == "retroactive" or (self.mode == "auto" and bool(self.peers or self.peers_file))


def peer_list(text: str) -> list[str]:
    """Peers from text: a JSON list, or `host:port` separated by commas, spaces or lines."""
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list):
            raise ValueError("peers: not a list")
        return [str(p) for p in value]
    return [p for p in text.replace(",", " ").split() if p]
