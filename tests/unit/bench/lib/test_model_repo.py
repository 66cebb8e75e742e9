"""bench.lib.model_repo.write_variant: the one model measured alone in its repository, its config changes applied."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.lib.model_repo import write_variant
from services.model.config import load_model_config


def test_a_variant_changes_both_models_configs_and_they_stay_valid(tmp_path: Path) -> None:
    heavy = tmp_path / "heavy.pt"
    heavy.write_bytes(b"weights")
    for model in ("fraud_mlp", "heavy_mlp"):
        repo = tmp_path / model
        write_variant(repo, model, heavy, {"execution": "inline", "dynamic_batching.max_queue_delay_us": 0})
        assert [p.name for p in repo.iterdir()] == [model]
        config = load_model_config(repo / model / "config.yaml", model)
        assert config.execution == "inline"
        assert config.dynamic_batching is not None and config.dynamic_batching.max_queue_delay_us == 0
        assert yaml.safe_load((repo / model / "config.yaml").read_text())["version_policy"] == {
            "specific": {"versions": [1]}
        }
    assert (tmp_path / "heavy_mlp" / "heavy_mlp" / "1" / "model.pt").read_bytes() == b"weights"
