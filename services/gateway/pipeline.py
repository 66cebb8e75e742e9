"""Pipelines declared in YAML (`pipelines/<name>.yaml`): inputs, stages, cache, degradation and placement policy.

A pipeline appears to clients as a v2 model. Its raw inputs are named tensors; an optional feature
stage turns them into a feature matrix (feature service), optional preprocessing scales tensors in the
gateway, and the model stage calls the model service. Inputs carry a data class, and an optional
`placement` block says which tier (edge, cloud) may see each class. Errors name the file, line and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.budgets import LatencyBudget
from services.common.yaml_docs import DocumentError, load_document, located_error

Datatype = Literal["BOOL", "INT32", "INT64", "FP32", "FP64", "BYTES"]
Remedy = Literal["stale_cache", "fallback_model", "default"]
FeatureRemedy = Literal["stale_cache", "default"]
DataClass = Literal["sensitive", "general"]
Tier = Literal["edge", "cloud"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """One raw input tensor: shape [rows, *dims]."""

    name: str = Field(min_length=1)
    datatype: Datatype
    dims: list[int] = Field(default_factory=lambda: [1], description="Dims after the row dimension.")
    description: str = ""
    data_class: DataClass = Field(
        "general",
        description="sensitive: a value in this input keeps the request on the edge tier (placement); general: "
        "may go wherever the placement sends general requests. Ignored by a single-tier gateway.",
    )


class FeatureStage(_Strict):
    """Raw fields -> FP32 feature matrix by the feature service; each input named here is one field."""

    feature_set: str = Field(min_length=1, description="Versioned feature set id, e.g. fraud_v1.")
    output: str = Field("features", description="Name of the pipeline tensor that holds the matrix.")
    budget_ms: float = Field(
        0.0, ge=0, description="Online-lookup budget passed to the feature service (0: the service's default)."
    )


class Preprocess(_Strict):
    """A vectorised transform in the gateway: out = clip(in * scale + offset, clip)."""

    input: str
    output: str | None = Field(None, description="Tensor name to write (default: replace the input).")
    scale: float = 1.0
    offset: float = 0.0
    clip: tuple[float, float] | None = None


class ModelStage(_Strict):
    """The model the pipeline ends in, and which pipeline tensors feed its inputs."""

    name: str = Field(min_length=1)
    version: str = Field("", description="Version to ask for; empty lets the mesh/canary decide.")
    inputs: dict[str, str] = Field(
        default_factory=dict, description="model input name -> pipeline tensor (default: same name)."
    )


class CachePolicy(_Strict):
    enabled: bool = True
    key_inputs: list[str] | None = Field(None, description="Inputs that form the cache key (default: all).")
    ttl_s: float = Field(60.0, gt=0, description="Seconds an answer is served as fresh.")
    stale_s: float = Field(600.0, ge=0, description="Seconds after that it may be served when degraded.")


class Timeouts(_Strict):
    """Per-stage limits in ms; each hop gets the smaller of its limit and what is left of the deadline.

    With `adaptive`, a stage's limit is the configured one stretched to 3x the p99 of that stage's recent
    successful calls, at most `stretch_max` times the configured value (services.common.budgets): a busy machine
    moves the limit with its latency, a dependency that stops answering still trips it."""

    total_ms: float = Field(1000.0, gt=0)
    cache_ms: float = Field(20.0, gt=0)
    features_ms: float = Field(100.0, gt=0)
    model_ms: float = Field(500.0, gt=0)
    adaptive: bool = Field(True, description="Stretch each stage limit with its recent healthy latency.")
    stretch_max: float = Field(4.0, ge=1.0, description="The most a stage limit stretches (x the configured ms).")

    def budget(self, stage_ms: float) -> LatencyBudget:
        """The limit of one stage: fixed (stretch 1) unless adaptive."""
        return LatencyBudget(stage_ms / 1e3, stretch_max=self.stretch_max if self.adaptive else 1.0)


class FallbackModel(_Strict):
    name: str
    version: str = ""


def _model_remedies() -> list[Remedy]:
    return ["stale_cache", "fallback_model", "default"]


def _feature_remedies() -> list[FeatureRemedy]:
    return ["stale_cache", "default"]


class Degradation(_Strict):
    """What answers when the model fails (overloaded, down, timed out) or the features are degraded.

    Each list is tried in its order; a remedy that cannot answer (no stale entry, the fallback failed too)
    falls through to the next."""

    on_model_failure: list[Remedy] = Field(default_factory=_model_remedies)
    on_feature_failure: list[FeatureRemedy] = Field(default_factory=_feature_remedies)
    fallback_model: FallbackModel | None = None
    default_outputs: dict[str, float] | None = Field(
        None, description="Constant output values (every element of that output), e.g. {score: 0.5}."
    )
    default_decision: Literal["approve", "review", "decline"] | None = Field(
        None,
        description="What a default answer means for the caller's decision (required when `default` is listed); "
        "every default answer carries it as the response parameter `default_decision`, so a client acts on the "
        "pipeline's explicit choice instead of reading a score it did not compute.",
    )


class Admission(_Strict):
    max_inflight: int = Field(64, ge=1, description="Hard cap on concurrent requests of this pipeline.")
    adaptive: bool = Field(True, description="Adapt the limit to observed latency (gradient, below the cap).")


class BatchRows(_Strict):
    """The most a stage's batch holds: keys for the cache lookup and store, rows for features and the model
    (at most the model's own max_batch_size, or the model refuses the batch and its members go one by one)."""

    cache: int = Field(256, ge=1)
    features: int = Field(64, ge=1)
    model: int = Field(64, ge=1)
    store: int = Field(256, ge=1)


class Batching(_Strict):
    """Micro-batching between stages: concurrent requests that miss the near cache share one cache lookup,
    one feature call, one model call and one cache store; each gets its own answer. A lone request goes at
    once; requests that arrive while a stage's batch is in flight form its next one."""

    enabled: bool = True
    max_rows: BatchRows = BatchRows()
    max_inflight: int = Field(1, ge=1, description="Batches of one stage (and model version) in flight at once.")
    max_delay_ms: float = Field(
        0.0, ge=0, le=100, description="Wait this long for company before sending (0: never wait)."
    )
    max_gather_ms: float = Field(
        2.0,
        ge=0,
        le=100,
        description="Without max_delay_ms, a stage's next call goes when the gateway runs out of other work "
        "(so under load callers join while it is busy anyway) or after this long; 0: in the next loop step.",
    )


class Tracing(_Strict):
    """When the gateway keeps a request's trace under always-on recording (MESHSERVE_TRACING_MODE retroactive, or
    auto with peers): a non-OK status, a degraded answer or a caller's sampled traceparent always keep it; these
    add a latency bound and a random baseline. Unset fields take MESHSERVE_TRACING_SLOW_MS, _SLOW_PERCENTILE and
    _BASELINE; 0 turns a latency bound off."""

    slow_ms: float | None = Field(None, ge=0, description="Keep a request slower than this (ms); 0: no fixed bound.")
    slow_percentile: float | None = Field(
        None,
        ge=0,
        lt=100,
        description="Keep a request slower than this percentile of the pipeline's recent successful requests "
        "(e.g. 99: the slowest 1%); 0: no rolling bound.",
    )
    baseline: float | None = Field(None, ge=0, le=1, description="Share of requests kept at random (e.g. 0.01).")


def _edge_only() -> list[Tier]:
    return ["edge"]


def _both_tiers() -> list[Tier]:
    return ["edge", "cloud"]


class PlacementTiers(_Strict):
    """Which tiers may see a request of each data class."""

    sensitive: list[Tier] = Field(default_factory=_edge_only, min_length=1)
    general: list[Tier] = Field(default_factory=_both_tiers, min_length=1)


class Placement(_Strict):
    """Where a request is answered on a two-tier deployment (MESHSERVE_GATEWAY_TIER edge or cloud), by its data class.

    A request is sensitive when any input marked sensitive carries a value (non-empty bytes; any number) in any
    row, or the client's `x-meshserve-data-class: sensitive` header says so; else general. Sensitive requests are
    answered at the edge and never cross; general ones go to `general_to`."""

    tiers: PlacementTiers = PlacementTiers()
    general_to: Tier = Field("cloud", description="Where a general request is answered while that tier is up.")
    leave_edge: Literal["request", "derived_features"] = Field(
        "derived_features",
        description="What crosses to the cloud for a general request: request (its general inputs, to the cloud's "
        "pipeline of the same name) or derived_features (the feature matrix computed at the edge, to the cloud's "
        "model; no sensitive input is in it).",
    )
    on_edge_model_down: Literal["unavailable", "default"] = Field(
        "unavailable",
        description="A sensitive request whose edge model fails: UNAVAILABLE naming this policy, or the "
        "pipeline's default outputs marked degraded. Never the cloud.",
    )
    on_cloud_down: Literal["edge_only"] = Field(
        "edge_only",
        description="A general request whose cloud call fails or is late: answered at the edge, "
        "marked degraded edge_only.",
    )
    cloud_timeout_ms: float = Field(200.0, gt=0, description="The most the cloud call may take (ms).")


class PipelineSpec(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_\-]*$")
    description: str = ""
    max_batch_size: int = Field(64, ge=1, description="Most rows in one request.")
    inputs: list[InputSpec] = Field(min_length=1)
    features: FeatureStage | None = None
    preprocess: list[Preprocess] = Field(default_factory=list)
    model: ModelStage
    outputs: list[str] = Field(min_length=1, description="Model outputs returned to the client, in order.")
    cache: CachePolicy = CachePolicy()
    timeouts: Timeouts = Timeouts()
    degradation: Degradation = Degradation()
    admission: Admission = Admission()
    batching: Batching = Batching()
    tracing: Tracing = Tracing()
    placement: Placement | None = Field(None, description="Two-tier placement by data class (absent: one tier).")

    @model_validator(mode="after")
    def _references(self) -> PipelineSpec:
        names = [i.name for i in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names repeat: {names}")
        tensors = set(names)
        for p in self.preprocess:
            if p.input not in tensors:
                raise ValueError(f"preprocess input {p.input!r} is not an input")
            tensors.add(p.output or p.input)
        if self.features is not None:
            tensors.add(self.features.output)
        for model_input, tensor in self.model.inputs.items():
            if tensor not in tensors:
                raise ValueError(f"model input {model_input!r} takes {tensor!r}, which no stage produces")
        for name in self.cache.key_inputs or ():
            if name not in names:
                raise ValueError(f"cache key input {name!r} is not an input")
        if "fallback_model" in self.degradation.on_model_failure and self.degradation.fallback_model is None:
            raise ValueError("degradation lists fallback_model but names none (degradation.fallback_model)")
        remedies = [*self.degradation.on_model_failure, *self.degradation.on_feature_failure]
        if "default" in remedies and self.degradation.default_outputs is None:
            raise ValueError("degradation lists default but gives no default_outputs")
        if "default" in remedies and self.degradation.default_decision is None:
            raise ValueError(
                "degradation lists default but gives no default_decision: say what a default answer means "
                "(approve, review or decline)"
            )
        unknown = set(self.degradation.default_outputs or {}) - set(self.outputs)
        if unknown:
            raise ValueError(f"default_outputs names {sorted(unknown)}, which are not outputs")
        if self.placement is not None:
            self._check_placement(self.placement)
        return self

    def sensitive_inputs(self) -> list[str]:
        """The inputs marked sensitive, in the pipeline's order."""
        return [i.name for i in self.inputs if i.data_class == "sensitive"]

    def _check_placement(self, placement: Placement) -> None:
        """Refuse a placement that would let a sensitive value reach the cloud, or that cannot be carried out;
        each message names the field."""
        sensitive = self.sensitive_inputs()
        if "cloud" in placement.tiers.sensitive:
            named = f" (inputs {sensitive})" if sensitive else ""
            raise ValueError(
                f"placement.tiers.sensitive lists cloud: sensitive inputs{named} must never reach the cloud tier"
            )
        if placement.general_to not in placement.tiers.general:
            raise ValueError(
                f"placement.general_to is {placement.general_to}, which placement.tiers.general does not list"
            )
        if placement.leave_edge == "derived_features" and self.features is None:
            raise ValueError(
                "placement.leave_edge is derived_features but the pipeline has no features stage: say "
                "leave_edge: request, or add features"
            )
        if placement.leave_edge == "request":
            fed = set(self.model_inputs().values())
            for p in self.preprocess:
                if p.input in sensitive and (p.output or p.input) in fed:
                    raise ValueError(
                        f"placement.leave_edge is request but input {p.input!r} is sensitive and feeds the model: "
                        "the cloud never gets it (use derived_features or general_to: edge)"
                    )
            direct = [name for name in sensitive if name in fed]
            if direct:
                raise ValueError(
                    f"placement.leave_edge is request but input {direct[0]!r} is sensitive and feeds the model "
                    "directly: the cloud never gets it (use derived_features or general_to: edge)"
                )
        if placement.on_edge_model_down == "default" and (
            self.degradation.default_outputs is None or self.degradation.default_decision is None
        ):
            raise ValueError(
                "placement.on_edge_model_down is default but degradation gives no default_outputs and default_decision"
            )

    def model_inputs(self) -> dict[str, str]:
        """model input -> pipeline tensor, with the feature matrix feeding the model's same-named input."""
        if self.model.inputs:
            return dict(self.model.inputs)
        produced = [i.name for i in self.inputs] if self.features is None else [self.features.output]
        return {name: name for name in produced}


class PipelineError(DocumentError):
    """A pipeline file that does not validate (file:line: field: problem)."""


def load_pipeline(path: Path) -> PipelineSpec:
    spec, root = load_document(path, PipelineSpec, PipelineError)
    if path.stem != spec.name:
        raise located_error(path, root, ("name",), f"file {path.name} must be named {spec.name}.yaml", PipelineError)
    return spec


def load_pipelines(folder: Path) -> dict[str, PipelineSpec]:
    """Every `*.yaml` of a folder, by pipeline name."""
    if not folder.is_dir():
        raise PipelineError(f"{folder}: no pipelines folder (set MESHSERVE_GATEWAY_PIPELINES_DIR)")
    return {spec.name: spec for spec in (load_pipeline(p) for p in sorted(folder.glob("*.yaml")))}
