"""bench.model_variants writes each variant's repository with its config changes applied to both models."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.model_variants import write_variant
from services.model.config import load_model_config


def test_a_variant_changes_both_models_configs_and_they_stay_valid(tmp_path: Path) -> None:
    heavy = tmp_path / "heavy.pt"
    heavy.write_bytes(b"weights")
    repo = tmp_path / "inline"
    write_variant(repo, heavy, {"execution": "inline", "dynamic_batching.max_queue_delay_us": 0})
    for model in ("fraud_mlp", "heavy_mlp"):
        config = load_model_config(repo / model / "config.yaml", model)
        assert config.execution == "inline"
        assert config.dynamic_batching is not None and config.dynamic_batching.max_queue_delay_us == 0
        assert yaml.safe_load((repo / model / "config.yaml").read_text())["version_policy"] == {
            "specific": {"versions": [1]}
        }
    assert (repo / "heavy_mlp" / "1" / "model.pt").read_bytes() == b"weights"
