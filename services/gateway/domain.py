"""The gateway's domain types: a pipeline request as the handler takes it, the answers runner and handler give."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from services.gateway.admission import Priority
from services.model.api import RawTensor

PIPELINE_VERSION = "1"  # a pipeline has one version; its model's versions live behind it


class WireTensor(NamedTuple):
    """One input as it came in raw_input_contents, not yet decoded: what the near cache's fast path reads."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes


@dataclass
class PipelineRequest:
    """One ModelInfer for a pipeline: inputs as numpy arrays (not yet checked against the pipeline), or, when every
    input came as raw contents, `wire` (decoded by the handler only when the near cache does not know the request);
    `inputs` is then empty."""

    pipeline: str
    inputs: dict[str, np.ndarray]
    version: str = ""
    id: str = ""
    requested_outputs: list[str] = field(default_factory=list)  # empty: every output of the pipeline
    debug: bool = False  # answer with per-stage times
    priority: Priority = Priority.NORMAL
    wire: list[WireTensor] | None = None


@dataclass
class OutputSpec:
    """One model output without its batch dimension (learnt from ModelMetadata)."""

    datatype: str
    dims: list[int]


@dataclass
class Answer:
    """What a pipeline's runner answered: the output tensors and how the answer came about."""

    outputs: list[RawTensor]
    model_version: str
    cache: str  # hit, miss or stale
    degraded: str | None = None  # cause:remedy, e.g. model_unavailable:stale_cache
    degraded_detail: str | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)  # stage -> requests its downstream call served
    default_decision: str | None = None  # set on a default answer: what the pipeline says it means
    tier: str | None = None  # a two-tier gateway's: whose model answered (edge, cloud); None: this gateway's


@dataclass
class PipelineResponse:
    """The handler's answer to a PipelineRequest: the outputs asked for and what the response parameters say."""

    pipeline: str
    id: str
    outputs: list[RawTensor]
    model_version: str
    cache: str
    degraded: str | None = None
    degraded_detail: str | None = None
    # Only with debug: each stage's ms, plus `total` (inside the gateway) and `gateway` (its own time).
    stages_ms: dict[str, float] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)  # only with debug: requests per stage's call
    default_decision: str | None = None  # a default answer: what the pipeline says it means
    tier: str | None = None  # a two-tier gateway's: the tier whose model answered (edge, cloud)
