"""Triton's own perf_analyzer (from the tritonclient wheel) runs against the model service unmodified.

perf_analyzer refuses to start unless ModelMetadata and ModelConfig answer with Triton's messages, and
reads ModelStatistics for its server-side breakdown, so a short run is a real compatibility check.
perf_analyzer (and the libcudart.so.12 it links against) come from the `.venv-perf` tool virtualenv that
`make setup` makes; it also needs Debian's libb64-0d (`make test` installs it with apt); without them this
test skips.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bench.lib.perf_analyzer import has_libb64, installed_cudart_lib, run_perf_analyzer
from tests.helpers.servers import model_service

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    not (has_libb64() and installed_cudart_lib() is not None),
    reason="perf_analyzer needs Debian's libb64-0d (`make test` installs it) and `.venv-perf` (`make setup`)",
)
def test_perf_analyzer_measures_fraud_mlp(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "models" / "fraud_mlp", repo / "fraud_mlp")
    config = yaml.safe_load((repo / "fraud_mlp" / "config.yaml").read_text())
    config["version_policy"] = {"specific": {"versions": [1]}}
    (repo / "fraud_mlp" / "config.yaml").write_text(yaml.safe_dump(config))
    with model_service(repo, tmp_path / "logs") as server:
        result = run_perf_analyzer("fraud_mlp", server.address, concurrency=4, measurement_ms=1000)
    assert result.throughput > 0
    assert result.has_server_stats  # it read our ModelStatistics
    assert result.server_compute_infer_us is not None and result.server_compute_infer_us > 0
