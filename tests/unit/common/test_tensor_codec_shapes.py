"""Shapes no tensor can have are bad input, found by the RPC fuzzer (tests/fuzz): each case
below is one of its examples, which the codec answered with a numpy MemoryError or ValueError (INTERNAL), or with
a gigabyte allocation that stalled the gateway's event loop for seconds."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.tensor_codec import MAX_DIMS, decode_request_inputs, decode_tensor, encode_raw
from services.protos import inference_pb2 as pb

TWO_WORDS = encode_raw(np.array([[b"web"], [b"app"]], dtype=object))[2]


def request(name: str, datatype: str, shape: list[int], raw: bytes | None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="fraud")
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is None:
        tensor.contents.bytes_contents.append(b"5411")
    else:
        message.raw_input_contents.append(raw)
    return message


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ([4294967296, 1], "raw BYTES end after 2 of 4294967296 elements"),  # was MemoryError: 32 GiB
        ([2, 1, 3144511950], "raw BYTES end after 2 of 6289023900 elements"),  # was MemoryError: 46.9 GiB
        ([9223372036854775807, 1], "is too large"),  # was ValueError: array is too big
        ([2, 1, *[23938] * 64], f"has 66 dimensions, at most {MAX_DIMS}"),  # was ValueError: maximum dimension
    ],
)
def test_a_shape_beyond_what_was_sent_or_what_numpy_takes_is_invalid_argument(shape: list[int], fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        decode_request_inputs(request("channel", "BYTES", shape, TWO_WORDS).inputs, [TWO_WORDS])


def test_typed_contents_with_more_dimensions_than_numpy_takes_are_invalid_argument() -> None:
    """66 dimensions of 1: one element, as many as the contents hold, but numpy stops at 64."""
    message = request("mcc", "BYTES", [1] * 66, None)
    with pytest.raises(InvalidArgument, match="66 dimensions"):
        decode_request_inputs(message.inputs, [])


@pytest.mark.parametrize("shape", [[0, 2**62, 2**62], [0, 2**63 - 1], [2**31, 2**31, 0]])
def test_an_empty_tensor_whose_other_dimensions_overflow_is_invalid_argument(shape: list[int]) -> None:
    for datatype in ("FP32", "BYTES"):
        with pytest.raises(InvalidArgument, match="is too large"):
            decode_tensor("x", datatype, shape, None, b"")


def test_a_bytes_shape_that_fits_memory_allocates_only_what_was_sent() -> None:
    """2**27 elements claimed for two: the old codec filled a 1 GiB object array (seconds of a stalled loop)
    before it found the bytes short."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument, match="raw BYTES end after 2 of 134217728 elements"):
            decode_tensor("channel", "BYTES", [2**27, 1], None, TWO_WORDS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_well_formed_bytes_and_empty_tensors_still_decode() -> None:
    assert decode_tensor("c", "BYTES", [2, 1], None, TWO_WORDS).tolist() == [[b"web"], [b"app"]]
    assert decode_tensor("x", "FP32", [0, 64], None, b"").shape == (0, 64)
    assert decode_tensor("s", "BYTES", [0, 3], None, b"").shape == (0, 3)
