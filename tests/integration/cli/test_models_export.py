"""`meshserve models export` is the export command (services.model.export) under the CLI: same options, same exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def meshserve(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": f"{cwd}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )


def test_the_cli_exports_a_user_module_and_reports_a_bad_factory(tmp_path: Path) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make():
                torch.manual_seed(3)
                return nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 1))
            """
        )
    )
    args = ["models", "export", "userpkg.model:make", "--name", "tiny", "--version", "1", "--input", "x:FP32:4"]
    done = meshserve(tmp_path, *args, "--output", "y", "--max-batch-size", "4", "--repository", "repo")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrote repo/tiny/1/model.onnx" in done.stdout
    assert (tmp_path / "repo" / "tiny" / "config.yaml").is_file()
    bad = meshserve(tmp_path, "models", "export", "nope:missing", "--name", "x", "--version", "1")
    assert bad.returncode == 1 and "export failed" in bad.stderr
