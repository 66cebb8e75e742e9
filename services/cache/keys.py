"""The cache key: a 128-bit BLAKE2b digest of (pipeline, model name, model version, canonical request)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import numpy as np

KEY_BYTES = 16
_SCHEMA = b"meshserve-cache-key/1"


def _field(h: hashlib.blake2b, data: bytes) -> None:
    """Length-prefixed, so that no two different field sequences hash the same bytes."""
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _tensor_bytes(array: np.ndarray) -> tuple[bytes, bytes]:
    """(dtype tag, canonical bytes): little-endian, C order; BYTES elements length-prefixed."""
    if array.dtype.kind in "OSU":
        parts = []
        for item in array.reshape(-1).tolist():
            raw = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"BYTES", b"".join(parts)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    canonical = np.ascontiguousarray(array, dtype=dtype)
    return dtype.str.encode(), canonical.tobytes()


def request_key(pipeline: str, model_name: str, model_version: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """The cache key of one request: equal requests give equal keys; any other version or input byte does not."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    _field(h, _SCHEMA)
    _field(h, pipeline.encode())
    _field(h, model_name.encode())
    _field(h, model_version.encode())
    h.update(struct.pack("<Q", len(inputs)))
    for name in sorted(inputs):
        array = np.asarray(inputs[name])
        tag, data = _tensor_bytes(array)
        _field(h, name.encode())
        _field(h, tag)
        _field(h, struct.pack(f"<{array.ndim}q", *array.shape))
        _field(h, data)
    return h.digest()
