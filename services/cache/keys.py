"""The cache key: a 128-bit BLAKE2b digest of (pipeline, model name, model version, canonical request)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np

KEY_BYTES = 16
_SCHEMA = b"meshserve-cache-key/2"


def _field(h: hashlib.blake2b, data: bytes) -> None:
    """Length-prefixed, so that no two different field sequences hash the same bytes."""
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _tensor_bytes(array: np.ndarray) -> tuple[bytes, bytes]:
    """(dtype tag, canonical bytes): little-endian, C order; BYTES as every element's length, then the elements."""
    if array.dtype.kind in "OSU":
        items = [item.encode() if isinstance(item, str) else bytes(item) for item in array.reshape(-1).tolist()]
        lengths = np.fromiter(map(len, items), dtype="<u4", count=len(items))
        return b"BYTES", lengths.tobytes() + b"".join(items)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    canonical = np.ascontiguousarray(array, dtype=dtype)
    return dtype.str.encode(), canonical.tobytes()


def request_digest(inputs: Mapping[str, np.ndarray]) -> bytes:
    """A digest of the canonical request alone (names, dtypes, shapes, values): the costly part of a key,
    computed once per request and shared by its keys for every serving version (and by coalescing)."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(struct.pack("<Q", len(inputs)))
    for name in sorted(inputs):
        array = np.asarray(inputs[name])
        tag, data = _tensor_bytes(array)
        _field(h, name.encode())
        _field(h, tag)
        _field(h, struct.pack(f"<{array.ndim}q", *array.shape))
        _field(h, data)
    return h.digest()


def wire_digest(tensors: Sequence[tuple[str, str, Sequence[int], bytes]]) -> bytes:
    """A digest of a request as it came on the wire: each input's (name, datatype, shape, raw bytes), in the order
    sent. Equal only for byte-identical requests (the names, types, shapes and lengths are hashed as one `repr`,
    then the raw bytes, whose lengths it holds); it needs no decoding, and is not a cache key (two requests that
    decode to the same arrays may differ here)."""
    head = repr([(name, datatype, tuple(shape), len(raw)) for name, datatype, shape, raw in tensors])
    h = hashlib.blake2b(head.encode(), digest_size=KEY_BYTES)
    for _, _, _, raw in tensors:
        h.update(raw)
    return h.digest()


def versioned_key(pipeline: str, model_name: str, model_version: str, digest: bytes) -> bytes:
    """The cache key of a request (by its request_digest) for one pipeline, model and model version."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    _field(h, _SCHEMA)
    _field(h, pipeline.encode())
    _field(h, model_name.encode())
    _field(h, model_version.encode())
    _field(h, digest)
    return h.digest()


def request_key(pipeline: str, model_name: str, model_version: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    """The cache key of one request: equal requests give equal keys; any other version or input byte does not."""
    return versioned_key(pipeline, model_name, model_version, request_digest(inputs))
