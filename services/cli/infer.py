"""`meshserve infer`: JSON rows to v2 tensors (typed from ModelMetadata), one ModelInfer, outputs back to JSON."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from services.cli.connect import Endpoint
from services.common.errors import InvalidArgument
from services.common.tensor_codec import NUMPY_DTYPES, decode_tensor, encode_raw
from services.protos import inference_pb2, inference_pb2_grpc


class InputError(ValueError):
    """The JSON does not fit the pipeline's inputs; the message says which field and why."""


@dataclass(frozen=True)
class TensorSpec:
    """One input of a model or pipeline as ModelMetadata describes it (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def batched(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == -1

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.batched else self.shape


def input_specs(metadata: inference_pb2.ModelMetadataResponse) -> list[TensorSpec]:
    return [TensorSpec(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in metadata.inputs]


def parse_rows(text: str) -> list[dict[str, Any]]:
    """A JSON object (one row) or a list of objects; `@path` reads the JSON from a file."""
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e}") from e
    rows = [data] if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise InputError("expected a JSON object (one row) or a non-empty list of objects")
    return rows


def _column(spec: TensorSpec, values: list[Any]) -> np.ndarray:
    dtype = NUMPY_DTYPES.get(spec.datatype)
    if dtype is None:
        raise InputError(f"input '{spec.name}': unsupported datatype {spec.datatype}")
    if spec.datatype == "BYTES":
        flat = np.asarray(values, dtype=object).reshape(-1)
        if not all(isinstance(v, str | int | float | bool) for v in flat):
            raise InputError(f"input '{spec.name}' (BYTES): expected strings")
        out = np.empty(flat.shape, dtype=object)
        out[:] = [str(v).encode() if not isinstance(v, str) else v.encode() for v in flat]
        return out.reshape(np.shape(np.asarray(values, dtype=object)))
    try:
        probe = np.asarray(values)
    except ValueError as e:
        raise InputError(f"input '{spec.name}': ragged values ({e})") from e
    if probe.dtype.kind not in "biuf":
        raise InputError(f"input '{spec.name}' ({spec.datatype}): expected numbers, got {probe.dtype.kind!r} values")
    if spec.datatype == "BOOL" and probe.dtype.kind not in "bi":
        raise InputError(f"input '{spec.name}' (BOOL): expected true/false")
    if dtype.kind in "iu" and probe.dtype.kind == "f":
        if not np.all(np.isfinite(probe)) or not np.all(probe == np.round(probe)):
            raise InputError(f"input '{spec.name}' ({spec.datatype}): expected integers")
    if dtype.kind in "iu" and probe.size:
        info = np.iinfo(dtype)
        if probe.min() < info.min or probe.max() > info.max:
            raise InputError(f"input '{spec.name}': value out of range for {spec.datatype}")
    return probe.astype(dtype)


def _reshape(spec: TensorSpec, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    known = math.prod(d for d in shape if d != -1)
    wildcards = sum(1 for d in shape if d == -1)
    if (wildcards == 0 and array.size != known) or wildcards > 1 or (wildcards == 1 and array.size % max(known, 1)):
        per_row = f" per row (shape {list(spec.row_shape)})" if spec.batched else f" (shape {list(spec.shape)})"
        raise InputError(f"input '{spec.name}': got {array.size} values; expected {known}{per_row}")
    return array.reshape(shape)


def rows_to_arrays(rows: Sequence[Mapping[str, Any]], specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """One array per input: rows stacked along the batch dimension, dtypes and shapes from the specs."""
    names = {s.name for s in specs}
    expected = ", ".join(f"{s.name} ({s.datatype})" for s in specs)
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - names)
        missing = sorted(names - set(row))
        where = f"row {i}: " if len(rows) > 1 else ""
        if unknown:
            raise InputError(f"{where}unknown field(s) {unknown}; inputs are {expected}")
        if missing:
            raise InputError(f"{where}missing field(s) {missing}; inputs are {expected}")
    arrays = {}
    for spec in specs:
        column = _column(spec, [row[spec.name] for row in rows])
        if spec.batched:
            arrays[spec.name] = _reshape(spec, column, (len(rows), *spec.row_shape))
        else:
            if len(rows) != 1:
                raise InputError(f"input '{spec.name}' has no batch dimension: send one row")
            arrays[spec.name] = _reshape(spec, column, spec.shape)
    return arrays


def set_parameter(target: Any, key: str, value: bool | int | float | str) -> None:
    """Set one InferParameter of a protobuf map field."""
    p = target[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def parameter_value(p: inference_pb2.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def build_request(
    model: str,
    arrays: Mapping[str, np.ndarray],
    version: str = "",
    parameters: Mapping[str, bool | int | float | str] | None = None,
) -> inference_pb2.ModelInferRequest:
    """A ModelInferRequest carrying every input as raw_input_contents."""
    request = inference_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in arrays.items():
        datatype, shape, raw = encode_raw(array)
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for key, value in (parameters or {}).items():
        set_parameter(request.parameters, key, value)
    return request


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype == object:
        return np.vectorize(lambda b: b.decode(errors="replace") if isinstance(b, bytes) else b, otypes=[object])(
            array
        ).tolist()
    if array.dtype in (np.float32, np.float16):  # shortest text that reads back as the same float32
        return np.vectorize(lambda v: float(f"{v:.8g}"), otypes=[object])(array).tolist()
    return array.tolist()


def decode_outputs(response: inference_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output tensors of a response as numpy (raw_output_contents or typed contents)."""
    raw = list(response.raw_output_contents)
    out = {}
    for i, tensor in enumerate(response.outputs):
        try:
            out[tensor.name] = decode_tensor(
                tensor.name,
                tensor.datatype,
                tensor.shape,
                tensor.contents if not raw else None,
                raw[i] if raw else None,
            )
        except InvalidArgument as e:
            raise ValueError(f"cannot decode output '{tensor.name}': {e}") from e
    return out


def response_json(response: inference_pb2.ModelInferResponse) -> dict[str, Any]:
    """{"model": ..., "outputs": {name: nested lists}, "parameters": {...}} of a response."""
    return {
        "model": response.model_name,
        "model_version": response.model_version,
        "outputs": {name: _jsonable(a) for name, a in decode_outputs(response).items()},
        "parameters": {k: parameter_value(v) for k, v in sorted(response.parameters.items())},
    }


def dumps(result: dict[str, Any]) -> str:
    """Indented JSON whose innermost lists stay on one line (tensors stay readable)."""
    text = json.dumps(result, indent=2)
    return re.sub(r"\[\n\s*([^\[\]{}]*?)\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)


def rpc_error_message(error: grpc.RpcError, address: str) -> str:
    """'CODE: details', with a hint when nothing listens at the address or the ingress wants TLS or a token."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    message = f"{code.name if code else 'ERROR'}: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and "connect" in (details or "").lower():
        message += (
            f" (is the stack running at {address}? start it with `meshserve up`; a secure ingress needs TLS: "
            "run in the stack's folder, or pass --log-dir, or --ca)"
        )
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        message += " (the ingress wants a token: `meshserve token NAME` prints one; pass it with --token)"
    return message


def infer(
    endpoint: Endpoint | str,
    pipeline: str,
    text: str,
    debug: bool = False,
    version: str = "",
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """ModelMetadata for the input types, then one ModelInfer; the response as JSON-ready data."""
    endpoint = Endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    rows = parse_rows(text)
    metadata = endpoint.metadata()
    with endpoint.channel() as channel:
        stub = inference_pb2_grpc.GRPCInferenceServiceStub(channel)
        model = stub.ModelMetadata(
            inference_pb2.ModelMetadataRequest(name=pipeline, version=version), timeout=timeout_s, metadata=metadata
        )
        arrays = rows_to_arrays(rows, input_specs(model))
        request = build_request(pipeline, arrays, version, {"debug": True} if debug else None)
        response = stub.ModelInfer(request, timeout=timeout_s, metadata=metadata)
    return response_json(response)
