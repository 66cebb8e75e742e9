"""The model repository on disk in Triton's layout: `<root>/<model>/config.yaml` and `<root>/<model>/<version>/`."""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.common.errors import NotFound
from services.model.config import ModelConfig, load_model_config

CONFIG_FILE = "config.yaml"


class ModelRepository:
    """Read-only view of the repository folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / CONFIG_FILE).is_file())

    def has_model(self, name: str) -> bool:
        return (self.root / name / CONFIG_FILE).is_file()

    def read_config(self, name: str) -> ModelConfig:
        if "/" in name or name.startswith(".") or not self.has_model(name):
            raise NotFound(f"model '{name}' is not in the repository {self.root}")
        return load_model_config(self.root / name / CONFIG_FILE, expected_name=name)

    def versions(self, name: str) -> list[int]:
        """Version folders present on disk (positive integers), ascending."""
        folder = self.root / name
        return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)

    def version_dir(self, name: str, version: int) -> Path:
        return self.root / name / str(version)

    def fingerprint(self, name: str, version: int) -> str:
        """Changes when the config or any file of the version changes (name, size, mtime)."""
        digest = hashlib.sha256((self.root / name / CONFIG_FILE).read_bytes())
        folder = self.version_dir(name, version)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                st = path.stat()
                digest.update(f"{path.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}".encode())
        return digest.hexdigest()
