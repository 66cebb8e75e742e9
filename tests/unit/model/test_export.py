"""services.model.export: a user's eager module into a version folder as ONNX, verified against torch, with a config
written (or checked), a static INT8 copy on request, and the command line that wraps it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from services.model.backends.onnx_io import quantization_of, read_onnx
from services.model.config import load_model_config
from services.model.export import (
    ExportError,
    export_version,
    main,
    onnx_session,
    parse_input,
    save_rows,
)
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from tests.helpers.models import Mlp, reference_output


class TwoHeads(nn.Module):
    """An image to (probabilities FP32 [10], label INT64 [1]): a softmax and an argmax, as digits_cnn answers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.linear = nn.Linear(16, 10)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(image.flatten(1))
        return torch.softmax(logits, dim=1), torch.argmax(logits, dim=1, keepdim=True)


class Noisy(nn.Module):
    """Answers differently on every call: no export of it can be verified."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1, keepdim=True) + torch.rand(x.shape[0], 1)


def test_parse_input() -> None:
    spec = parse_input("image:fp32:1x4x4")
    assert (spec.name, spec.datatype, spec.dims) == ("image", "FP32", [1, 4, 4])
    with pytest.raises(ValueError, match="expected name:DATATYPE:dims"):
        parse_input("features")


async def test_an_export_writes_a_config_and_serves_as_torch_answers(tmp_path: Path) -> None:
    report = export_version(
        TwoHeads(),
        tmp_path,
        "heads",
        1,
        inputs=[parse_input("image:FP32:1x4x4")],
        outputs=["probs", "label"],
        max_batch_size=32,
    )
    assert report.verification.ok and report.verification.rows == 1000
    assert report.verification.max_abs_diff["probs"] <= 1e-5 and report.verification.mismatched == {"label": 0}
    config = load_model_config(report.config_path, expected_name="heads")
    assert (config.backend, config.default_model_filename, config.max_batch_size) == ("onnxruntime", "model.onnx", 32)
    assert [(o.name, o.datatype, o.dims) for o in config.outputs] == [("probs", "FP32", [10]), ("label", "INT64", [1])]
    manager = ModelManager(ModelRepository(tmp_path))
    await manager.load("heads")
    try:
        image = np.random.default_rng(0).random((3, 1, 4, 4), dtype=np.float32)
        out = manager.get("heads").model.forward({"image": image})
        with torch.inference_mode():
            probs, label = TwoHeads().eval()(torch.from_numpy(image))
        np.testing.assert_allclose(out["probs"], probs.numpy(), atol=1e-5)
        assert np.array_equal(out["label"], label.numpy())
    finally:
        await manager.close()


def test_an_existing_config_is_kept_and_the_export_must_agree_with_it(tmp_path: Path) -> None:
    first = export_version(Mlp(1), tmp_path, "m", 1, inputs=[parse_input("x:FP32:8")], outputs=["y"], max_batch_size=8)
    written = first.config_path.read_text()
    second = export_version(Mlp(2), tmp_path, "m", 2, rows={"x": np.ones((40, 8), np.float32)})
    assert second.config_path.read_text() == written and second.verification.rows == 40
    with pytest.raises(ExportError, match=r"torch\.onnx\.export failed"):
        export_version(nn.Linear(9, 1), tmp_path, "m", 3)  # the config says 8 features
    with pytest.raises(ExportError, match="does not exist: give the inputs and the output names"):
        export_version(Mlp(1), tmp_path, "other", 1)


def test_an_export_that_does_not_answer_as_torch_is_refused_and_removed(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"does not answer as the module does: 1000 rows: y max \|diff\|"):
        export_version(Noisy(), tmp_path, "n", 1, inputs=[parse_input("x:FP32:8")], outputs=["y"], max_batch_size=8)
    assert not (tmp_path / "n" / "1" / "model.onnx").exists() and not (tmp_path / "n" / "config.yaml").exists()


def test_int8_calibration_writes_a_static_qdq_version_and_marks_it_int8(tmp_path: Path) -> None:
    calibration = {"x": np.random.default_rng(5).standard_normal((512, 8)).astype(np.float32)}
    report = export_version(
        Mlp(4),
        tmp_path,
        "q",
        1,
        inputs=[parse_input("x:FP32:8")],
        outputs=["y"],
        max_batch_size=16,
        int8_calibration=calibration,
        int8_version=2,
    )
    assert report.int8_path == tmp_path / "q" / "2" / "model.onnx" and report.int8_verification is not None
    assert 0 < report.int8_verification.max_abs_diff["y"] < 0.05
    assert quantization_of(read_onnx(report.int8_path)) == "static"
    assert quantization_of(read_onnx(report.onnx_path)) == "none"
    config = load_model_config(report.config_path)
    assert config.optimization_for(2).quantization == "int8" and config.version_policy.select([1, 2]) == [1, 2]


def test_the_command_line_exports_a_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make():
                torch.manual_seed(7)
                return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    rows = save_rows(tmp_path / "rows.npz", {"features": np.ones((20, 4), np.float32)})
    argv = ["userpkg.model:make", "--name", "tiny", "--version", "3", "--input", "features:FP32:4"]
    assert main([*argv, "--output", "score", "--max-batch-size", "8", "--repository", "repo", "--rows", str(rows)]) == 0
    printed = capsys.readouterr().out
    assert "wrote repo/tiny/3/model.onnx (20 rows: score max |diff|" in printed
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    from userpkg.model import make  # type: ignore[import-not-found]

    got = onnx_session(tmp_path / "repo" / "tiny" / "3" / "model.onnx").run(None, {"features": x})[0]
    np.testing.assert_allclose(got, reference_output(make(), x), atol=1e-5)
    assert main(["nope:missing", "--name", "x", "--version", "1"]) == 1
    assert "export failed" in capsys.readouterr().err
