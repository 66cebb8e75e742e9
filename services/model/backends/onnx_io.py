"""An ONNX file held against its model config before any runtime takes it: it parses, its inputs and outputs are
the config's (names, datatypes, dims), and an INT8 version is a static Q/DQ graph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.model.config import ModelConfig, TensorSpec

if TYPE_CHECKING:
    import onnx

# ONNX TensorProto element types (onnx.TensorProto.FLOAT = 1, ...) by the v2 datatype a config names.
ONNX_ELEMENT_TYPES: dict[str, int] = {
    "FP32": 1,
    "UINT8": 2,
    "INT8": 3,
    "UINT16": 4,
    "INT16": 5,
    "INT32": 6,
    "INT64": 7,
    "BYTES": 8,
    "BOOL": 9,
    "FP16": 10,
    "FP64": 11,
    "UINT32": 12,
    "UINT64": 13,
    "BF16": 16,
}
DATATYPES_BY_ELEMENT = {code: name for name, code in ONNX_ELEMENT_TYPES.items()}
# Operators whose scales are computed from the batch at run time: their answers depend on a row's company.
DYNAMIC_QUANTIZATION_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulInteger", "ConvInteger"})


class OnnxMismatch(ValueError):
    """The ONNX file disagrees with its config (or is no ONNX at all); the message names the file and tensor."""


@dataclass(frozen=True, slots=True)
class OnnxTensor:
    """One graph input or output: its name, v2 datatype (None for a type a config cannot name) and dims, with a
    symbolic or unknown dimension as -1."""

    name: str
    datatype: str | None
    dims: tuple[int, ...]


def read_onnx(path: Path) -> onnx.ModelProto:
    """The parsed model (external weights not loaded), or OnnxMismatch saying why the file is no ONNX model."""
    import onnx

    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, and whatever a truncated protobuf raises
        raise OnnxMismatch(f"{path.name} is not a valid ONNX model: {type(exc).__name__}: {exc}") from exc
    if not model.graph.node and not model.graph.output:
        raise OnnxMismatch(f"{path.name} is not a valid ONNX model: its graph is empty")
    return model


def graph_tensors(model: onnx.ModelProto, kind: str) -> list[OnnxTensor]:
    """The graph's inputs (`kind` "input", initializers left out) or outputs, in graph order."""
    initializers = {init.name for init in model.graph.initializer}
    values = model.graph.input if kind == "input" else model.graph.output
    tensors = []
    for value in values:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        tensors.append(OnnxTensor(value.name, DATATYPES_BY_ELEMENT.get(tensor_type.elem_type), dims))
    return tensors


def _expected_dims(config: ModelConfig, spec: TensorSpec) -> list[int]:
    return [-1, *spec.dims] if config.max_batch_size > 0 else list(spec.dims)


def _dims_agree(expected: list[int], found: tuple[int, ...]) -> bool:
    return len(expected) == len(found) and all(
        e == -1 or f == -1 or e == f for e, f in zip(expected, found, strict=True)
    )


def check_io(model: onnx.ModelProto, config: ModelConfig, shown: str) -> None:
    """OnnxMismatch unless the graph's inputs and outputs are the config's, by name, datatype and dims (the batch
    dimension of a batched model may be symbolic or fixed in the file; other dims must agree)."""
    for kind, specs in (("input", config.inputs), ("output", config.outputs)):
        found = {t.name: t for t in graph_tensors(model, kind)}
        wanted = [s.name for s in specs]
        if sorted(found) != sorted(wanted):
            raise OnnxMismatch(f"{shown}: its {kind}s are {sorted(found)}, the config declares {wanted}")
        for spec in specs:
            tensor = found[spec.name]
            if tensor.datatype != spec.datatype:
                raise OnnxMismatch(
                    f"{shown}: {kind} {spec.name!r} is {tensor.datatype or 'of a type configs cannot name'} in the "
                    f"file, {spec.datatype} in the config"
                )
            expected = _expected_dims(config, spec)
            if not _dims_agree(expected, tensor.dims):
                shape = [d if d != -1 else "?" for d in tensor.dims]
                raise OnnxMismatch(
                    f"{shown}: {kind} {spec.name!r} has shape {shape} in the file; the config's dims {spec.dims} "
                    f"with max_batch_size {config.max_batch_size} make {expected}"
                )


def quantization_of(model: onnx.ModelProto) -> str:
    """ "dynamic" when scales are computed at run time, "static" for Q/DQ nodes with constant scales, else "none"."""
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    kind = "none"
    for node in model.graph.node:
        if node.op_type in DYNAMIC_QUANTIZATION_OPS:
            return "dynamic"
        if node.op_type == "QuantizeLinear":
            if len(node.input) < 2 or node.input[1] not in constants:
                return "dynamic"
            kind = "static"
    return kind


def check_quantization(model: onnx.ModelProto, quantization: str, shown: str) -> None:
    """OnnxMismatch when a version declared INT8 is not a static Q/DQ graph, or when its scales are dynamic."""
    found = quantization_of(model)
    if found == "dynamic":
        raise OnnxMismatch(
            f"{shown}: quantization scales computed at run time depend on the rows batched together; serve a static "
            "Q/DQ ONNX (python -m services.model.export --int8-calibration)"
        )
    if quantization == "int8" and found != "static":
        raise OnnxMismatch(
            f"{shown}: the config says quantization int8 but the file has no QuantizeLinear/DequantizeLinear nodes; "
            "make one with python -m services.model.export --int8-calibration"
        )
