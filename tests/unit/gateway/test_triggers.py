"""The gateway's keep decision at the end of a request: error, degraded, the caller's sampled flag, the pipeline's
latency bound (fixed or its rolling percentile) and the random baseline; the pipeline file's `tracing:` section."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.common.recording import DEGRADED, PIPELINE, RecordedSpan, Recorder, RecordingSettings
from services.gateway.pipeline import PipelineError, load_pipeline
from services.gateway.triggers import MIN_SAMPLES, RECOMPUTE_EVERY, EdgeTriggers, LatencyBound

ROOT = Path(__file__).resolve().parents[3]
MS = 1_000_000


def fraud(tmp_path: Path, **tracing: object) -> Path:
    spec = yaml.safe_load((ROOT / "pipelines/fraud.yaml").read_text())
    spec["tracing"] = tracing
    path = tmp_path / "fraud.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def ended(rec: Recorder, ms: float, flags: int = 0, **attributes: object) -> RecordedSpan:
    span = RecordedSpan(rec, "t", "rpc", 1, 2, flags, None, SpanKind.SERVER, 0, attributes, None, True)
    span.end_ns = int(ms * MS)
    return span


@pytest.fixture()
def rec() -> Recorder:
    return Recorder("gateway", {}, 10, 10)


def test_a_fixed_bound(rec: Recorder, tmp_path: Path) -> None:
    spec = load_pipeline(fraud(tmp_path, slow_ms=50, slow_percentile=0, baseline=0))
    edge = EdgeTriggers({"fraud": spec}, RecordingSettings())
    assert edge(ended(rec, 49, **{PIPELINE: "fraud"})) == []
    assert edge(ended(rec, 51, **{PIPELINE: "fraud"})) == ["latency"]


def test_errors_degraded_answers_and_sampled_callers_are_kept(rec: Recorder, tmp_path: Path) -> None:
    spec = load_pipeline(fraud(tmp_path, slow_ms=0, slow_percentile=0, baseline=0))
    edge = EdgeTriggers({"fraud": spec}, RecordingSettings())
    failed = ended(rec, 500, **{PIPELINE: "fraud", "rpc.grpc.status_code": 14})
    assert edge(failed) == ["error"]
    errored = ended(rec, 1, **{PIPELINE: "fraud"})
    errored.set_status(Status(StatusCode.ERROR, "boom"))
    assert edge(errored) == ["error"]
    assert edge(ended(rec, 1, **{PIPELINE: "fraud", DEGRADED: "model_unavailable:default"})) == ["degraded"]
    assert edge(ended(rec, 1, flags=1, **{PIPELINE: "fraud"})) == ["sampled"]


def test_the_baseline_keeps_its_share(rec: Recorder, tmp_path: Path) -> None:
    spec = load_pipeline(fraud(tmp_path, slow_ms=0, slow_percentile=0, baseline=0.1))
    edge = EdgeTriggers({"fraud": spec}, RecordingSettings())
    kept = sum(1 for _ in range(5000) if edge(ended(rec, 1, **{PIPELINE: "fraud"})) == ["baseline"])
    assert 350 < kept < 650


def test_a_rolling_percentile_keeps_the_slowest_share_once_it_has_samples() -> None:
    bound = LatencyBound(None, 99.0)
    assert not any(bound.slow(10_000 * MS) for _ in range(MIN_SAMPLES - 1))  # a cold start keeps nothing by it
    bound = LatencyBound(None, 99.0)
    rng = random.Random(16)
    slow = [bound.slow(int(rng.uniform(1, 100) * MS)) for _ in range(50 * RECOMPUTE_EVERY)]
    late = slow[len(slow) // 2 :]
    assert 0.004 < sum(late) / len(late) < 0.02  # the slowest 1%
    assert 97 * MS < bound.rolling_ns < 100 * MS


def test_calls_that_are_not_pipeline_requests_take_the_defaults(rec: Recorder) -> None:
    edge = EdgeTriggers({}, RecordingSettings(slow_ms=20, slow_percentile=0, baseline=0))
    assert edge(ended(rec, 30)) == ["latency"] and edge(ended(rec, 10)) == []


def test_pipeline_defaults_come_from_the_settings(rec: Recorder, tmp_path: Path) -> None:
    spec = load_pipeline(fraud(tmp_path))
    assert (spec.tracing.slow_ms, spec.tracing.slow_percentile, spec.tracing.baseline) == (None, None, None)
    edge = EdgeTriggers({"fraud": spec}, RecordingSettings(slow_ms=5, slow_percentile=0, baseline=0))
    assert edge(ended(rec, 6, **{PIPELINE: "fraud"})) == ["latency"]


@pytest.mark.parametrize("tracing", [{"baseline": 2}, {"slow_percentile": 100}, {"slow_ms": -1}, {"sampled": True}])
def test_a_bad_tracing_section_is_refused(tmp_path: Path, tracing: dict[str, object]) -> None:
    with pytest.raises(PipelineError, match="tracing"):
        load_pipeline(fraud(tmp_path, **tracing))
