"""A pipeline request's raw input tensors checked against the pipeline (names, dtypes, shapes, NaN) and turned
into feature-service rows; every problem is INVALID_ARGUMENT naming the input (and row). A request sent as raw
contents that is exactly what the pipeline takes is decoded, checked and digested in one pass (`check_wire`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from services.cache.api import Canonical, bytes_canonical, canonical_digest
from services.common.errors import InvalidArgument
from services.common.tensor_codec import NUMPY_DTYPES, datatype_of, parse_bytes
from services.feature.api import FieldValue
from services.gateway.pipeline import InputSpec, PipelineSpec


def _describe(spec: InputSpec) -> str:
    return f"{spec.name} {spec.datatype} [rows, {', '.join(map(str, spec.dims))}]"


def check_inputs(pipeline: PipelineSpec, inputs: Mapping[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
    """(rows, inputs reshaped to [rows, *dims]); [rows] is accepted for an input of dims [1]."""
    expected = {s.name: s for s in pipeline.inputs}
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        raise InvalidArgument(
            f"pipeline {pipeline.name!r}: unknown input {unknown[0]!r}; it takes "
            + ", ".join(_describe(s) for s in pipeline.inputs)
        )
    missing = [s for s in pipeline.inputs if s.name not in inputs]
    if missing:
        raise InvalidArgument(
            f"pipeline {pipeline.name!r}: input {missing[0].name!r} is missing (expected {_describe(missing[0])})"
        )
    rows: int | None = None
    out: dict[str, np.ndarray] = {}
    for spec in pipeline.inputs:
        array = inputs[spec.name]
        datatype = datatype_of(array)
        if datatype != spec.datatype:
            raise InvalidArgument(
                f"pipeline {pipeline.name!r}: input {spec.name!r} is {datatype}; send {spec.datatype}"
            )
        shape = array.shape
        if list(shape[1:]) == spec.dims or (spec.dims == [1] and array.ndim == 1):
            array = array.reshape(shape[0], *spec.dims)
        else:
            raise InvalidArgument(
                f"pipeline {pipeline.name!r}: input {spec.name!r} has shape {list(shape)}; "
                f"expected [rows, {', '.join(map(str, spec.dims))}]"
            )
        if rows is None:
            rows = shape[0]
            if rows == 0:
                raise InvalidArgument(
                    f"pipeline {pipeline.name!r}: no rows (input {spec.name!r} has shape {list(shape)})"
                )
        elif shape[0] != rows:
            raise InvalidArgument(
                f"pipeline {pipeline.name!r}: input {spec.name!r} has {shape[0]} rows, the others {rows}"
            )
        if array.dtype.kind == "f":
            bad = ~np.isfinite(array.reshape(rows, -1)).all(axis=1)
            if bad.any():
                row = int(np.argmax(bad))
                raise InvalidArgument(f"pipeline {pipeline.name!r}: input {spec.name!r} row {row} is NaN or infinite")
        out[spec.name] = array
    assert rows is not None
    if rows > pipeline.max_batch_size:
        raise InvalidArgument(
            f"pipeline {pipeline.name!r}: {rows} rows in one request; at most {pipeline.max_batch_size}"
        )
    return rows, out


def check_wire(
    pipeline: PipelineSpec, wire: Sequence[tuple[str, str, Sequence[int], bytes]], key_inputs: Sequence[str]
) -> tuple[int, dict[str, np.ndarray], bytes] | None:
    """(rows, inputs as `check_inputs` gives them, request_digest of the `key_inputs`) for raw inputs that are exactly
    what the pipeline takes, in one pass from the raw bytes; None when anything is off (a name, a datatype, a shape,
    a length, a NaN: the general path, `decode_raw_inputs` then `check_inputs`, then says what). Malformed BYTES
    raise here as they would there."""
    specs = pipeline.inputs
    if len(wire) != len(specs):
        return None
    given = {t[0]: t for t in wire}
    keyed = set(key_inputs)
    rows = 0
    out: dict[str, np.ndarray] = {}
    parts: list[Canonical] = []
    for spec in specs:
        tensor = given.get(spec.name)
        if tensor is None or tensor[1] != spec.datatype:
            return None
        _, datatype, shape, raw = tensor
        dims = spec.dims
        if not shape or not (list(shape[1:]) == dims or (dims == [1] and len(shape) == 1)):
            return None
        n = int(shape[0])
        if not out:
            if not 0 < n <= pipeline.max_batch_size:
                return None
            rows = n
        elif n != rows:
            return None
        count = n * _product(dims)
        full = (n, *dims)
        if datatype == "BYTES":
            items = parse_bytes(spec.name, raw, count)
            array = np.empty(count, dtype=np.object_)
            array[:] = items
            array = array.reshape(full)
            tag, canonical = b"BYTES", bytes_canonical(items) if spec.name in keyed else b""
        else:
            dtype = NUMPY_DTYPES[datatype]
            if len(raw) != count * dtype.itemsize:
                return None
            array = np.frombuffer(raw, dtype=dtype).reshape(full)
            if dtype.kind == "f" and not np.isfinite(array).all():
                return None
            tag, canonical = dtype.str.encode(), raw
        out[spec.name] = array
        if spec.name in keyed:
            parts.append((spec.name, tag, full, bytes(canonical)))
    return rows, out, canonical_digest(parts)


def _product(dims: Sequence[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def _column(spec_name: str, array: np.ndarray) -> list[FieldValue]:
    """The first element of every row as a Python value (BYTES as UTF-8 text)."""
    flat = array.reshape(array.shape[0], -1)[:, 0]
    if array.dtype.kind == "O":
        values: list[FieldValue] = []
        for row, item in enumerate(flat.tolist()):
            if isinstance(item, bytes):
                try:
                    item = item.decode()
                except UnicodeDecodeError as exc:
                    raise InvalidArgument(f"input {spec_name!r} row {row} is not UTF-8 text") from exc
            values.append(item)
        return values
    return flat.tolist()


def feature_rows(pipeline: PipelineSpec, inputs: Mapping[str, np.ndarray], rows: int) -> list[dict[str, FieldValue]]:
    """One feature-service row per request row; each input is one typed field (text, int, float or bool)."""
    columns = [(s.name, _column(s.name, inputs[s.name])) for s in pipeline.inputs]
    out: list[dict[str, FieldValue]] = [{} for _ in range(rows)]
    for name, values in columns:
        for row, value in zip(out, values, strict=True):
            row[name] = value
    return out
