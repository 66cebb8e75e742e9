"""Open Inference Protocol v2 tensors to and from numpy: typed contents, raw bytes, every v2 datatype."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from services.common.errors import InvalidArgument

# v2 datatype -> numpy dtype (little-endian, as raw contents are defined).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}
# v2 datatype -> the InferTensorContents field that carries it (FP16/BF16 travel only as raw bytes).
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_BY_NUMPY = {dt: name for name, dt in NUMPY_DTYPES.items() if name != "BYTES"}
_LEN = struct.Struct("<I")
# The most dimensions, and elements (zero dimensions counted as one), a tensor's shape may declare: far beyond
# any tensor a message can carry, and below numpy's limits, which it reports as ValueError even for an empty
# array whose other dimensions multiply past 2**63.
MAX_DIMS = 32
MAX_ELEMENTS = 2**48


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype name for a numpy array (object, str and bytes arrays are BYTES)."""
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    name = _BY_NUMPY.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
    if name is None:
        raise InvalidArgument(f"numpy dtype {array.dtype} has no v2 datatype")
    return name


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape as a tuple; INVALID_ARGUMENT for a negative dimension or one no tensor could have."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"input '{name}': shape has {len(shape)} dimensions, at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input '{name}': shape {list(shape)} has a negative dimension")
    if element_count([max(int(d), 1) for d in shape]) > MAX_ELEMENTS:
        raise InvalidArgument(f"input '{name}': shape {list(shape)} is too large (over {MAX_ELEMENTS} elements)")
    return tuple(int(d) for d in shape)


def deserialize_bytes(name: str, raw: bytes, count: int) -> np.ndarray:
    """Parse v2 raw BYTES: each element is a 4-byte little-endian length then that many bytes.

    The array is allocated after parsing, so a shape that claims billions of elements (cheap to send) costs no
    more than the bytes that came with it."""
    items = parse_bytes(name, raw, count)
    out = np.empty(count, dtype=np.object_)
    for i, item in enumerate(items):
        out[i] = item
    return out


def parse_bytes(name: str, raw: bytes, count: int) -> list[bytes]:
    """The `count` elements of v2 raw BYTES (see `deserialize_bytes`); INVALID_ARGUMENT naming the input when the
    bytes do not hold exactly that many."""
    items: list[bytes] = []
    view = memoryview(raw)
    offset = 0
    for i in range(count):  # ends within len(raw) / 4 rounds at most: each element takes 4 bytes of length
        if offset + 4 > len(view):
            raise InvalidArgument(f"input '{name}': raw BYTES end after {i} of {count} elements")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidArgument(f"input '{name}': raw BYTES element {i} claims {length} bytes past the end")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise InvalidArgument(f"input '{name}': {len(view) - offset} bytes left over after {count} BYTES elements")
    return items


def serialize_bytes(array: np.ndarray) -> bytes:
    """v2 raw BYTES encoding of an object/str/bytes array (row-major)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_tensor(name: str, datatype: str, shape: Sequence[int], contents: Any, raw: bytes | None) -> np.ndarray:
    """One v2 input tensor to numpy, from raw bytes or typed contents; every mismatch is INVALID_ARGUMENT."""
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"input '{name}': unknown datatype {datatype!r}")
    dims = check_shape(name, shape)
    count = element_count(dims)
    if raw is not None:
        if datatype == "BYTES":
            return deserialize_bytes(name, raw, count).reshape(dims)
        expected = count * dtype.itemsize
        if len(raw) != expected:
            raise InvalidArgument(
                f"input '{name}': raw contents hold {len(raw)} bytes, but shape {list(dims)} of {datatype} "
                f"needs {expected}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(dims)
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidArgument(f"input '{name}': {datatype} must be sent as raw_input_contents")
    values = getattr(contents, field) if contents is not None else ()
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}': {field} holds {len(values)} elements, but shape {list(dims)} needs {count}"
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=np.object_)
        out[:] = list(values)
        return out.reshape(dims)
    if dtype.kind in "iu" and dtype.itemsize < 8:  # int_contents/uint_contents are 32-bit: check the range
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if count and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidArgument(f"input '{name}': value out of range for {datatype} ({info.min}..{info.max})")
        return wide.astype(dtype).reshape(dims)
    return np.asarray(values, dtype=dtype).reshape(dims)


def decode_request_inputs(inputs: Sequence[Any], raw_contents: Sequence[bytes]) -> dict[str, np.ndarray]:
    """All inputs of a ModelInferRequest (protobuf InferInputTensor list plus raw_input_contents)."""
    if raw_contents and len(raw_contents) != len(inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw_contents)} entries for {len(inputs)} inputs; send one per input"
        )
    arrays: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(inputs):
        if tensor.name in arrays:
            raise InvalidArgument(f"input '{tensor.name}' appears twice")
        raw = raw_contents[i] if raw_contents else None
        if raw is not None and tensor.HasField("contents"):
            raise InvalidArgument(f"input '{tensor.name}': send raw_input_contents or contents, not both")
        arrays[tensor.name] = decode_tensor(
            tensor.name, tensor.datatype, tensor.shape, tensor.contents if raw is None else None, raw
        )
    return arrays


def decode_raw_inputs(tensors: Sequence[tuple[str, str, Sequence[int], bytes]]) -> dict[str, np.ndarray]:
    """Inputs that came as raw contents, each (name, datatype, shape, raw bytes), to numpy (as
    `decode_request_inputs` does for them)."""
    arrays: dict[str, np.ndarray] = {}
    for name, datatype, shape, raw in tensors:
        if name in arrays:
            raise InvalidArgument(f"input '{name}' appears twice")
        arrays[name] = decode_tensor(name, datatype, shape, None, raw)
    return arrays


def encode_raw(array: np.ndarray) -> tuple[str, list[int], bytes]:
    """(datatype, shape, raw bytes) of a numpy array for raw_output_contents / raw_input_contents."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        return datatype, list(array.shape), serialize_bytes(array)
    dtype = NUMPY_DTYPES[datatype]
    return datatype, list(array.shape), np.ascontiguousarray(array, dtype=dtype).tobytes()


def fill_contents(contents: Any, array: np.ndarray) -> str:
    """Put an array into typed InferTensorContents (for clients that do not use raw); returns the datatype."""
    datatype = datatype_of(array)
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidArgument(f"{datatype} has no typed contents field; use raw contents")
    flat = array.reshape(-1)
    if datatype == "BYTES":
        getattr(contents, field).extend(x.encode() if isinstance(x, str) else bytes(x) for x in flat)
    else:
        getattr(contents, field).extend(flat.tolist())
    return datatype
