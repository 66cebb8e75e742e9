"""v2 tensor codec: every datatype round-trips through raw and typed contents; bad tensors are refused."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from services.common.errors import InvalidArgument
from services.common.tensor_codec import (
    CONTENTS_FIELDS,
    NUMPY_DTYPES,
    datatype_of,
    decode_request_inputs,
    decode_tensor,
    encode_raw,
    fill_contents,
)
from services.protos import inference_pb2 as pb

NUMERIC = [d for d in NUMPY_DTYPES if d != "BYTES"]


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_round_trip_every_numeric_datatype(datatype: str) -> None:
    array = sample(datatype, (3, 4))
    name, shape, raw = encode_raw(array)
    assert name == datatype and shape == [3, 4]
    assert len(raw) == array.size * NUMPY_DTYPES[datatype].itemsize
    back = decode_tensor("t", name, shape, None, raw)
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("datatype", [d for d in NUMERIC if d in CONTENTS_FIELDS])
def test_typed_contents_round_trip(datatype: str) -> None:
    array = sample(datatype, (2, 5))
    contents = pb.InferTensorContents()
    assert fill_contents(contents, array) == datatype
    back = decode_tensor("t", datatype, [2, 5], contents, None)
    np.testing.assert_array_equal(back, array)


def test_bf16_and_fp16_are_raw_only() -> None:
    bf = np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16)
    assert datatype_of(bf) == "BF16"
    _, _, raw = encode_raw(bf)
    assert raw == np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16).view(np.uint16).tobytes()
    with pytest.raises(InvalidArgument, match="FP16 must be sent as raw_input_contents"):
        decode_tensor("h", "FP16", [2], pb.InferTensorContents(), None)


def test_bytes_raw_and_typed() -> None:
    array = np.array([[b"a", b""], [b"\x00\xff", "caf\u00e9".encode()]], dtype=object)
    datatype, shape, raw = encode_raw(array)
    assert datatype == "BYTES" and raw[:5] == b"\x01\x00\x00\x00a"
    back = decode_tensor("s", "BYTES", shape, None, raw)
    assert back.tolist() == array.tolist()
    contents = pb.InferTensorContents()
    fill_contents(contents, array)
    assert decode_tensor("s", "BYTES", shape, contents, None).tolist() == array.tolist()


@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=5), elements=st.floats(width=32)))
def test_fp32_raw_round_trip_property(array: np.ndarray) -> None:
    datatype, shape, raw = encode_raw(array)
    np.testing.assert_array_equal(decode_tensor("x", datatype, shape, None, raw), array)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("x", "FP32", [2, 2], None, b"\0" * 15), "raw contents hold 15 bytes, but shape [2, 2] of FP32 needs 16"),
        (("x", "FP32", [2, -2], None, b""), "negative dimension"),
        (("x", "FP77", [1], None, b"\0"), "unknown datatype"),
        (("s", "BYTES", [2], None, b"\x01\x00\x00\x00a"), "raw BYTES end after 1 of 2 elements"),
        (("s", "BYTES", [1], None, b"\x09\x00\x00\x00a"), "claims 9 bytes past the end"),
        (("s", "BYTES", [1], None, b"\x01\x00\x00\x00ab"), "1 bytes left over"),
    ],
)
def test_bad_tensors_name_the_problem(args, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_tensor(*args)
    assert fragment in str(err.value)
    assert f"'{args[0]}'" in str(err.value)


def test_request_level_checks() -> None:
    request = pb.ModelInferRequest()
    request.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    request.inputs.add(name="b", datatype="INT32", shape=[1])
    request.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(InvalidArgument, match="raw_input_contents has 1 entries for 2 inputs"):
        decode_request_inputs(request.inputs, request.raw_input_contents)
    dup = pb.ModelInferRequest()
    for _ in range(2):
        dup.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    with pytest.raises(InvalidArgument, match="appears twice"):
        decode_request_inputs(dup.inputs, dup.raw_input_contents)
    overflow = pb.InferTensorContents()
    overflow.int_contents.append(300)
    with pytest.raises(InvalidArgument, match="out of range for INT8"):
        decode_tensor("q", "INT8", [1], overflow, None)
