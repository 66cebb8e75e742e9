"""The model repository on disk in Triton's layout: `<root>/<model>/config.yaml` and `<root>/<model>/<version>/`."""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.common.errors import InvalidArgument, NotFound, quoted
from services.model.config import ModelConfig, load_model_config

CONFIG_FILE = "config.yaml"
# A model is a folder, so its name fits in a file name (NAME_MAX on Linux): a longer one is bad input.
MAX_NAME_BYTES = 255


def check_name(name: str) -> None:
    """InvalidArgument for a name no model can have (too long for a folder), so that it is never echoed."""
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(f"model name of {size} bytes; a model name has at most {MAX_NAME_BYTES}")


def not_in_repository(name: str) -> NotFound:
    """The error for a name the repository does not hold (InvalidArgument raised for one no model can have)."""
    check_name(name)
    return NotFound(f"model {quoted(name)} is not in the repository")


def _folder_name(name: str) -> bool:
    """Whether `name` names one folder inside the repository (no separator, no NUL, not hidden or a parent)."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


class ModelRepository:
    """Read-only view of the repository folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / CONFIG_FILE).is_file())

    def has_model(self, name: str) -> bool:
        if not _folder_name(name) or len(name.encode()) > MAX_NAME_BYTES:
            return False
        return (self.root / name / CONFIG_FILE).is_file()

    def read_config(self, name: str) -> ModelConfig:
        if not self.has_model(name):
            raise not_in_repository(name)
        return load_model_config(self.root / name / CONFIG_FILE, expected_name=name, shown=f"{name}/{CONFIG_FILE}")

    def relative(self, text: str) -> str:
        """`text` (an error from loading, say) with the repository's location left out: what a client may see."""
        for root in sorted({str(self.root.resolve()), str(self.root.absolute())}, key=len, reverse=True):
            text = text.replace(root + "/", "")
        return text

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
