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


def bytes_canonical(items: Sequence[bytes]) -> bytes:
    """The canonical bytes of BYTES elements: every element's length (little-endian uint32), then the elements."""
    return np.fromiter(map(len, items), dtype="<u4", count=len(items)).tobytes() + b"".join(items)


def _tensor_bytes(array: np.ndarray) -> tuple[bytes, bytes]:
    """(dtype tag, canonical bytes): little-endian, C order; BYTES as every element's length, then the elements."""
    if array.dtype.kind in "OSU":
        items = [item.encode() if isinstance(item, str) else bytes(item) for item in array.reshape(-1).tolist()]
        return b"BYTES", bytes_canonical(items)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    canonical = np.ascontiguousarray(array, dtype=dtype)
    return dtype.str.encode(), canonical.tobytes()


Canonical = tuple[str, bytes, tuple[int, ...], bytes]  # an input's name, dtype tag, shape and canonical bytes


def canonical_digest(parts: Sequence[Canonical]) -> bytes:
    """request_digest of inputs already in canonical form (`_tensor_bytes`'s tag and bytes, the shape as a tuple):
    a caller that has the canonical bytes at hand (the gateway reading raw contents) need not build arrays first."""
    chunks = [struct.pack("<Q", len(parts))]
    for name, tag, shape, data in sorted(parts, key=lambda part: part[0]):
        for field in (name.encode(), tag, struct.pack(f"<{len(shape)}q", *shape), data):
            chunks.append(struct.pack("<Q", len(field)))  # length-prefixed, as `_field` writes them
            chunks.append(field)
    return hashlib.blake2b(b"".join(chunks), digest_size=KEY_BYTES).digest()


def request_digest(inputs: Mapping[str, np.ndarray]) -> bytes:
    """A digest of the canonical request alone (names, dtypes, shapes, values): the costly part of a key,
    computed once per request and shared by its keys for every serving version (and by coalescing)."""
    parts = []
    for name, value in inputs.items():
        array = np.asarray(value)
        tag, data = _tensor_bytes(array)
        parts.append((name, tag, tuple(int(d) for d in array.shape), data))
    return canonical_digest(parts)


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
