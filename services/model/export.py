"""Exports an eager torch module into a repository version folder as ONNX, proving the file answers as the module does.

`export_version` is the whole job (the `meshserve models export` command and `make models` call it): the module is
exported with torch's dynamo exporter (a dynamic batch dimension up to `max_batch_size`, one self-contained file),
run by ONNX Runtime on the CPU beside eager torch on the same rows (1,000 by default; FP32 outputs must agree to
1e-5), and, given calibration rows, quantized to a static Q/DQ INT8 ONNX that ONNX Runtime and TensorRT both run.
A config.yaml is written beside the versions when the model has none (its outputs' datatypes and dims read from
the module's answer), and an existing one must agree with the export. From the shell:

    python -m services.model.export my_pkg.models:make_model --name my_model --version 1 \\
        --input features:FP32:64 --output score --max-batch-size 128 --repository models
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from services.common.tensor_codec import NUMPY_DTYPES
from services.model.backends import BACKENDS
from services.model.config import FLOAT_DATATYPES, ModelConfig, TensorSpec, load_model_config
from services.model.repository import CONFIG_FILE

if TYPE_CHECKING:
    import torch

ONNX_FILE = "model.onnx"
DEFAULT_VERIFY_ROWS = 1000
FP32_TOLERANCE = 1e-5
# Operators quantized to INT8: those with integer kernels. The rest (activations, normalisation, the final sigmoid or
# softmax) stay float between a DequantizeLinear and the next QuantizeLinear, so outputs keep their resolution.
INT8_OPS = ["Gemm", "MatMul", "Conv"]
EXAMPLE_ROWS = 2  # the export traces a batch of two: a batch of one would fix the batch dimension at 1


class ExportError(RuntimeError):
    """The export failed, or the file does not answer as the module does; the message says which and by how much."""


@dataclass(frozen=True)
class Verification:
    """The ONNX file against eager torch on the same rows: per output, the largest |difference| (float outputs)
    or the number of differing values (integer outputs)."""

    rows: int
    tolerance: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    mismatched: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d <= self.tolerance for d in self.max_abs_diff.values()) and not any(self.mismatched.values())

    def summary(self) -> str:
        parts = [f"{name} max |diff| {diff:.2e}" for name, diff in self.max_abs_diff.items()]
        parts += [f"{name} {count} value(s) differ" for name, count in self.mismatched.items()]
        return f"{self.rows} rows: " + ", ".join(parts) + f" (tolerance {self.tolerance:g})"


@dataclass(frozen=True)
class ExportReport:
    """What `export_version` wrote and how the file compared with the module."""

    config_path: Path
    onnx_path: Path
    verification: Verification
    int8_path: Path | None = None
    int8_verification: Verification | None = None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's and quantizer's progress chatter (stdout, warnings, log lines) kept out of the caller's output."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def sample_rows(config: ModelConfig, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for verification when the caller has no real rows: standard normal floats, small integers,
    random booleans (variable dims as 1)."""
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        dims = [1 if d == -1 else d for d in spec.dims]
        shape = [rows, *dims] if config.max_batch_size > 0 else dims
        dtype = NUMPY_DTYPES[spec.datatype]
        if spec.datatype in FLOAT_DATATYPES:
            inputs[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif spec.datatype == "BOOL":
            inputs[spec.name] = rng.random(shape) < 0.5
        else:
            inputs[spec.name] = rng.integers(0, 8, shape).astype(dtype)
    return inputs


def _batch(inputs: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: array[start:stop] for name, array in inputs.items()}


def _torch_outputs(module: torch.nn.Module, config: ModelConfig, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        result = module(*(torch.from_numpy(np.ascontiguousarray(inputs[s.name])) for s in config.inputs))
    produced = [result] if isinstance(result, torch.Tensor) else list(result)
    return [tensor.detach().cpu().numpy() for tensor in produced]


def describe_outputs(
    module: torch.nn.Module, inputs: list[TensorSpec], names: Sequence[str], max_batch_size: int
) -> list[TensorSpec]:
    """The output specs of `module`: its answer to a sample batch, named `names` in order (datatype and dims read
    from the answer, the batch dimension left out of a batched model's dims)."""
    probe = ModelConfig(
        name="probe",
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=[TensorSpec(name=n, datatype="FP32", dims=[1]) for n in names],
    )
    produced = _torch_outputs(module.eval(), probe, sample_rows(probe, EXAMPLE_ROWS))
    if len(produced) != len(names):
        raise ExportError(f"the module returns {len(produced)} output(s), {len(names)} name(s) given: {list(names)}")
    by_dtype = {np.dtype(dtype): name for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"}
    specs = []
    for name, array in zip(names, produced, strict=True):
        datatype = by_dtype.get(array.dtype)
        if datatype is None:
            raise ExportError(f"output {name!r} is {array.dtype}, which no v2 datatype names")
        dims = list(array.shape[1:]) if max_batch_size > 0 else list(array.shape)
        specs.append(TensorSpec(name=name, datatype=datatype, dims=dims or [1]))
    return specs


def export_onnx(module: torch.nn.Module, config: ModelConfig, path: Path) -> Path:
    """Export `module` to `path` (written atomically) with the config's tensor names and, for a batched model, a
    dynamic batch dimension from 1 to max_batch_size."""
    import torch

    module = module.eval()
    rows = EXAMPLE_ROWS if config.max_batch_size > 0 else 0
    example = sample_rows(config, rows)
    args = tuple(torch.from_numpy(example[s.name]) for s in config.inputs)
    dynamic_shapes = None
    if config.max_batch_size > 0:
        batch = torch.export.Dim("batch", min=1, max=max(config.max_batch_size, EXAMPLE_ROWS))
        dynamic_shapes = tuple({0: batch} for _ in config.inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with _quiet():
            torch.onnx.export(
                module,
                args,
                str(tmp),
                input_names=[s.name for s in config.inputs],
                output_names=[s.name for s in config.outputs],
                dynamic_shapes=dynamic_shapes,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    tmp.replace(path)
    return path


def onnx_session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session for `path` (verification and benchmarks: what the onnxruntime backend runs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def compare(
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]],
    candidate: Callable[[dict[str, np.ndarray]], list[np.ndarray]],
    config: ModelConfig,
    inputs: dict[str, np.ndarray],
    tolerance: float,
) -> Verification:
    """Two implementations on the same rows, in batches of at most max_batch_size."""
    rows = len(next(iter(inputs.values()))) if config.max_batch_size > 0 else 1
    step = config.max_batch_size or rows
    diffs: dict[str, float] = {s.name: 0.0 for s in config.outputs if s.datatype in FLOAT_DATATYPES}
    mismatched: dict[str, int] = {s.name: 0 for s in config.outputs if s.datatype not in FLOAT_DATATYPES}
    for start in range(0, rows, step):
        batch = _batch(inputs, start, start + step) if config.max_batch_size > 0 else inputs
        for spec, want, got in zip(config.outputs, reference(batch), candidate(batch), strict=True):
            if want.shape != got.shape:
                raise ExportError(f"output {spec.name!r}: shape {list(got.shape)}, torch answers {list(want.shape)}")
            if spec.name in diffs:
                diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
                diffs[spec.name] = max(diffs[spec.name], float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
            else:
                mismatched[spec.name] += int((want != got).sum())
    return Verification(rows, tolerance, diffs, mismatched)


def verify_onnx(
    module: torch.nn.Module,
    path: Path,
    config: ModelConfig,
    inputs: dict[str, np.ndarray],
    tolerance: float = FP32_TOLERANCE,
) -> Verification:
    """ONNX Runtime on `path` against eager `module` on the same rows."""
    session = onnx_session(path)
    names = [s.name for s in config.outputs]
    return compare(
        lambda batch: _torch_outputs(module.eval(), config, batch),
        lambda batch: list(session.run(names, batch)),
        config,
        inputs,
        tolerance,
    )


@dataclass(frozen=True)
class Int8Recipe:
    """How a model is quantized to static INT8. The default quantizes every Gemm/MatMul/Conv, inputs and outputs,
    with min/max scales: what runs fastest (ONNX Runtime fuses DequantizeLinear -> Gemm -> QuantizeLinear into one
    integer kernel only when the output is quantized too). A small model whose scores must stay close keeps its
    first and last layers float (they see the raw features and make the score), leaves layer outputs float and
    clips activation ranges at a percentile of the calibration rows."""

    float_ends: bool = False  # the first and last quantizable layers stay FP32
    quantize_outputs: bool = True
    percentile: float | None = None  # of |activation| over the calibration rows; None: min/max

    def describe(self) -> str:
        parts = ["first and last layers FP32" if self.float_ends else "every Gemm/MatMul/Conv INT8"]
        parts.append("layer outputs quantized" if self.quantize_outputs else "layer outputs FP32")
        parts.append(f"{self.percentile}th percentile scales" if self.percentile else "min/max scales")
        return ", ".join(parts)


CALIBRATION_BATCH = 1024


def quantize_int8(
    fp32_path: Path,
    out: Path,
    calibration: dict[str, np.ndarray],
    recipe: Int8Recipe = Int8Recipe(),
) -> Path:
    """A static INT8 Q/DQ copy of `fp32_path` calibrated on `calibration` (rows, one array per input): symmetric
    INT8 activations and per-channel INT8 weights (zero points 0, what TensorRT's explicit quantization takes), the
    scales fixed in the file, so a row's answer never depends on its batch."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rows = len(next(iter(calibration.values())))
    # One batch when it fits; otherwise equal batches (the percentile collector stacks them), the remainder left out.
    step = rows if rows <= 8 * CALIBRATION_BATCH else CALIBRATION_BATCH
    batches = [_batch(calibration, s, s + step) for s in range(0, rows - step + 1, step)]

    class Rows(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    layers = [n.name for n in onnx.load(str(fp32_path), load_external_data=False).graph.node if n.op_type in INT8_OPS]
    excluded = [layers[0], layers[-1]] if recipe.float_ends and len(layers) > 2 else []
    extra: dict[str, Any] = {"ActivationSymmetric": True, "WeightSymmetric": True}
    if not recipe.quantize_outputs:
        extra["OpTypesToExcludeOutputQuantization"] = INT8_OPS
    if recipe.percentile is not None:
        extra["CalibPercentile"] = recipe.percentile
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _quiet():
        quantize_static(
            str(fp32_path),
            str(tmp),
            Rows(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=INT8_OPS,
            nodes_to_exclude=excluded,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.Percentile if recipe.percentile else CalibrationMethod.MinMax,
            extra_options=extra,
        )
    tmp.replace(out)
    return out


def save_rows(path: Path, rows: dict[str, np.ndarray]) -> Path:
    """Rows (one array per input) as an .npz, written atomically: calibration or verification rows a version ships."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.savez(handle, allow_pickle=False, **rows)
    tmp.replace(path)
    return path


def write_config(config: ModelConfig, folder: Path) -> Path:
    """`folder/config.yaml` for `config` (only the fields that differ from the defaults), written atomically."""
    document = config.model_dump(exclude_defaults=True)
    if document.get("default_model_filename") == BACKENDS[config.backend].filename:
        del document["default_model_filename"]
    document = {"name": config.name, "backend": config.backend, **document}
    path = folder / CONFIG_FILE
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp.replace(path)
    return path


def parse_input(text: str) -> TensorSpec:
    """`name:DATATYPE:dims` (dims like 64 or 1x8x8, -1 for any size) as a TensorSpec."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"--input {text!r}: expected name:DATATYPE:dims, e.g. features:FP32:64 or image:FP32:1x8x8")
    name, datatype, dims = parts
    return TensorSpec.model_validate(
        {"name": name, "datatype": datatype.upper(), "dims": [int(d) for d in dims.split("x")]}
    )


def export_version(
    module: torch.nn.Module,
    repository: Path,
    name: str,
    version: int,
    inputs: list[TensorSpec] | None = None,
    outputs: Sequence[str] | None = None,
    max_batch_size: int = 0,
    rows: dict[str, np.ndarray] | None = None,
    verify_rows: int = DEFAULT_VERIFY_ROWS,
    tolerance: float = FP32_TOLERANCE,
    int8_calibration: dict[str, np.ndarray] | None = None,
    int8_version: int | None = None,
    int8_recipe: Int8Recipe = Int8Recipe(),
    extra_config: dict[str, Any] | None = None,
) -> ExportReport:
    """Export `module` to `<repository>/<name>/<version>/model.onnx` and verify it on `rows` (else `verify_rows`
    random rows); raise ExportError when an FP32 output differs from torch by more than `tolerance`.

    The model's config.yaml is used when it exists (the export must match it); otherwise it is made from `inputs`,
    `outputs` (names; their datatypes and dims come from the module), `max_batch_size` and `extra_config`, with
    backend onnxruntime, and written once the export verified. With `int8_calibration` (rows, one array per input)
    a static Q/DQ INT8 file is also written, to `int8_version`'s folder (default: beside the FP32 file, as
    model.int8.onnx), its largest difference from the FP32 file reported (INT8 is close, not equal)."""
    folder = repository / name
    existing = folder / CONFIG_FILE
    if existing.is_file():
        config = load_model_config(existing, expected_name=name)
    else:
        if not inputs or not outputs:
            raise ExportError(f"{existing} does not exist: give the inputs and the output names to write one")
        config = _new_config(
            module, name, inputs, outputs, max_batch_size, int8_calibration, int8_version, extra_config
        )
    path = export_onnx(module, config, folder / str(version) / ONNX_FILE)
    from services.model.backends.onnx_io import check_io, read_onnx

    check_io(read_onnx(path), config, f"{name}/{version}/{ONNX_FILE}")
    if rows is None:
        rows = sample_rows(config, verify_rows)
    verification = verify_onnx(module, path, config, rows, tolerance)
    if not verification.ok:
        path.unlink()
        raise ExportError(f"{name}/{version}/{ONNX_FILE} does not answer as the module does: {verification.summary()}")
    config_path = existing if existing.is_file() else write_config(config, folder)
    int8_path = int8_check = None
    if int8_calibration is not None:
        target = folder / str(int8_version) / ONNX_FILE if int8_version else path.with_name("model.int8.onnx")
        int8_path, int8_check = _export_int8(path, target, config, rows, int8_calibration, int8_recipe)
    return ExportReport(config_path, path, verification, int8_path, int8_check)


def _new_config(
    module: torch.nn.Module,
    name: str,
    inputs: list[TensorSpec],
    outputs: Sequence[str],
    max_batch_size: int,
    int8_calibration: dict[str, np.ndarray] | None,
    int8_version: int | None,
    extra_config: dict[str, Any] | None,
) -> ModelConfig:
    """The config of a model that has none yet: `inputs`, the module's `outputs` (their datatypes and dims asked of
    the module), backend onnxruntime, and with an INT8 version of its own, that version's quantization."""
    specs = describe_outputs(module, inputs, outputs, max_batch_size)
    document = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "inputs": [s.model_dump() for s in inputs],
        "outputs": [s.model_dump() for s in specs],
        **(extra_config or {}),
    }
    if int8_calibration is not None and int8_version:
        document.setdefault("version_policy", {"all": {}})
        document.setdefault("version_overrides", {int8_version: {"optimization": {"quantization": "int8"}}})
    return ModelConfig.model_validate(document)


def _export_int8(
    path: Path,
    target: Path,
    config: ModelConfig,
    rows: dict[str, np.ndarray],
    calibration: dict[str, np.ndarray],
    recipe: Int8Recipe,
) -> tuple[Path, Verification]:
    """The INT8 file quantized from the FP32 one at `path`, written to `target`, and how it compares with it."""
    source = path
    if target == path:  # the INT8 file takes the FP32 one's place: quantize from (and compare with) a copy
        source = path.with_name(path.name + ".fp32.tmp")
        path.replace(source)
    try:
        int8_path = quantize_int8(source, target, calibration, recipe)
        fp32, int8 = onnx_session(source), onnx_session(int8_path)
        names = [s.name for s in config.outputs]
        check = compare(
            lambda batch: list(fp32.run(names, batch)),
            lambda batch: list(int8.run(names, batch)),
            config,
            rows,
            float("inf"),
        )
    finally:
        if source != path:
            source.unlink(missing_ok=True)
    return int8_path, check


def load_factory(target: str) -> torch.nn.Module:
    """`package.module:factory` called with no arguments (a class or a function returning an nn.Module)."""
    import torch

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ExportError(f"{target!r}: expected MODULE:FACTORY, e.g. my_pkg.models:make_model")
    sys.path.insert(0, str(Path.cwd()))
    factory = getattr(importlib.import_module(module_name), attribute)
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{target} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _load_rows(path: Path | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.model.export",
        description="Export an eager torch module to ONNX in a model repository and verify it against torch.",
    )
    parser.add_argument("factory", help="MODULE:FACTORY returning the eager nn.Module (with its weights loaded)")
    parser.add_argument("--name", required=True, help="model name (its folder in the repository)")
    parser.add_argument("--version", type=int, required=True, help="version folder to write")
    parser.add_argument("--repository", type=Path, default=Path("models"), help="repository root (default models/)")
    parser.add_argument("--input", action="append", default=[], help="name:DATATYPE:dims (repeat per input)")
    parser.add_argument("--output", action="append", default=[], help="output name, in the order forward returns")
    parser.add_argument("--max-batch-size", type=int, default=0, help="largest batch (0: no batch dimension)")
    parser.add_argument("--rows", type=Path, help=".npz of verification rows, one array per input (default random)")
    parser.add_argument("--verify-rows", type=int, default=DEFAULT_VERIFY_ROWS, help="random rows to verify on")
    parser.add_argument("--tolerance", type=float, default=FP32_TOLERANCE, help="largest |diff| allowed (FP32)")
    parser.add_argument("--int8-calibration", type=Path, help=".npz of calibration rows: also write a Q/DQ INT8 file")
    parser.add_argument("--int8-version", type=int, help="version folder for the INT8 file (default: beside FP32)")
    parser.add_argument("--int8-float-ends", action="store_true", help="keep the first and last layers FP32")
    parser.add_argument("--int8-float-outputs", action="store_true", help="keep INT8 layers' outputs FP32")
    parser.add_argument("--int8-percentile", type=float, help="activation scales at this percentile (default min/max)")
    args = parser.parse_args(argv)
    try:
        module = load_factory(args.factory)
        report = export_version(
            module,
            args.repository,
            args.name,
            args.version,
            inputs=[parse_input(text) for text in args.input],
            outputs=args.output,
            max_batch_size=args.max_batch_size,
            rows=_load_rows(args.rows),
            verify_rows=args.verify_rows,
            tolerance=args.tolerance,
            int8_calibration=_load_rows(args.int8_calibration),
            int8_version=args.int8_version,
            int8_recipe=Int8Recipe(args.int8_float_ends, not args.int8_float_outputs, args.int8_percentile),
        )
    except (ExportError, ValueError, ImportError, AttributeError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {report.onnx_path} ({report.verification.summary()})")
    if report.int8_path is not None and report.int8_verification is not None:
        print(f"wrote {report.int8_path} (INT8 against FP32: {report.int8_verification.summary()})")
    print(f"config: {report.config_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
