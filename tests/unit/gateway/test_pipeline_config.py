"""Pipeline YAML: the demo pipelines load; mistakes name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.gateway.pipeline import PipelineError, load_pipeline, load_pipelines

ROOT = Path(__file__).resolve().parents[3]

GOOD = """\
name: p
inputs:
  - {name: x, datatype: FP32, dims: [8]}
model: {name: m}
outputs: [y]
degradation: {on_model_failure: [stale_cache], on_feature_failure: []}
"""


def test_demo_pipelines_load() -> None:
    pipelines = load_pipelines(ROOT / "pipelines")
    assert set(pipelines) == {"fraud", "digits"}
    fraud = pipelines["fraud"]
    assert fraud.features is not None and fraud.features.feature_set == "fraud_v1"
    assert fraud.model_inputs() == {"features": "features"}
    assert pipelines["digits"].model_inputs() == {"image": "image"}


def write(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_minimal_pipeline_loads(tmp_path: Path) -> None:
    spec = load_pipeline(write(tmp_path, GOOD))
    assert spec.cache.enabled and spec.admission.max_inflight == 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("datatype: FP32", "datatype: FLOAT"), ":3: inputs[0].datatype:"),
        (GOOD + "cache: {ttl: 5}\n", ":7: cache.ttl: Extra inputs are not permitted"),
        (GOOD.replace("outputs: [y]", "outputs: []"), ":5: outputs:"),
        (GOOD.replace("[stale_cache]", "[fallback_model]"), "names none"),
        (GOOD.replace("[stale_cache]", "[default]"), "no default_outputs"),
        (
            GOOD.replace("on_feature_failure: []}", "on_feature_failure: [default], default_outputs: {y: 1}}"),
            "no default_decision: say what a default answer means",
        ),
        (GOOD + "cache: {key_inputs: [z]}\n", "cache key input 'z'"),
    ],
)
def test_mistakes_name_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_the_file_name_must_match(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"must be named p\.yaml"):
        load_pipeline(write(tmp_path, GOOD, name="other"))


TIERED = """\
name: p
inputs:
  - {name: user_id, datatype: BYTES, data_class: sensitive}
  - {name: amount, datatype: FP32}
features: {feature_set: f}
model: {name: m}
outputs: [y]
degradation: {on_model_failure: [stale_cache], on_feature_failure: []}
placement: {tiers: {sensitive: [edge], general: [edge, cloud]}, leave_edge: derived_features}
"""


def test_a_tiered_pipeline_loads(tmp_path: Path) -> None:
    spec = load_pipeline(write(tmp_path, TIERED))
    assert spec.sensitive_inputs() == ["user_id"]
    assert spec.placement is not None and spec.placement.cloud_timeout_ms == 200
    assert load_pipeline(write(tmp_path, GOOD)).placement is None  # no block: one tier


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            TIERED.replace("sensitive: [edge]", "sensitive: [edge, cloud]"),
            "placement.tiers.sensitive lists cloud: sensitive inputs (inputs ['user_id']) must never reach",
        ),
        (TIERED.replace("data_class: sensitive", "data_class: secret"), ":3: inputs[0].data_class:"),
        (TIERED.replace("sensitive: [edge],", "secret: [edge],"), "placement.tiers.secret: Extra inputs"),
        (TIERED.replace("features: {feature_set: f}\n", ""), "placement.leave_edge is derived_features but the"),
        (
            TIERED.replace("features: {feature_set: f}\n", "").replace("derived_features", "request"),
            "placement.leave_edge is request but input 'user_id' is sensitive and feeds the model directly",
        ),
        (
            TIERED.replace("general: [edge, cloud]}", "general: [edge]}"),
            "placement.general_to is cloud, which placement.tiers.general does not list",
        ),
        (
            TIERED.replace("leave_edge: derived_features", "on_edge_model_down: default"),
            "placement.on_edge_model_down is default but degradation gives no default_outputs",
        ),
        (TIERED.replace("leave_edge: derived_features", "leave_edge: everything"), "placement.leave_edge:"),
    ],
)
def test_placement_mistakes_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PipelineError) as info:
        load_pipeline(path)
    assert expected in str(info.value)
