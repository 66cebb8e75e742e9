"""The shipped pipelines copied for a test, fraud's stage limits roomy for a busy test machine, and a model
repository holding only fraud_mlp (a link to the built demo model)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.servers import ROOT

ROOMY_TIMEOUTS = {"total_ms": 20000, "cache_ms": 2000, "features_ms": 5000, "model_ms": 5000, "adaptive": False}


def roomy_pipelines(folder: Path, change: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """`pipelines/` copied into `folder`, fraud's timeouts roomy; `change` edits fraud's spec further."""
    shutil.copytree(ROOT / "pipelines", folder)
    spec = yaml.safe_load((folder / "fraud.yaml").read_text())
    spec["timeouts"] = dict(ROOMY_TIMEOUTS)
    if change is not None:
        change(spec)
    (folder / "fraud.yaml").write_text(yaml.safe_dump(spec))
    return folder


def fraud_repository(root: Path) -> Path:
    """A model repository under `root` with fraud_mlp only."""
    repo = root / "repo"
    repo.mkdir()
    (repo / "fraud_mlp").symlink_to(ROOT / "models" / "fraud_mlp")
    return repo
