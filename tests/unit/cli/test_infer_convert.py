"""JSON rows to v2 request tensors (typed from ModelMetadata) and responses back to JSON."""

from __future__ import annotations

import numpy as np
import pytest

from services.cli.infer import (
    InputError,
    TensorSpec,
    build_request,
    input_specs,
    parse_rows,
    response_json,
    rows_to_arrays,
)
from services.common.tensor_codec import decode_request_inputs, encode_raw
from services.protos import inference_pb2

FRAUD = [
    TensorSpec("event_time", "INT64", (-1, 1)),
    TensorSpec("user_id", "BYTES", (-1, 1)),
    TensorSpec("amount", "FP32", (-1, 1)),
    TensorSpec("card_present", "BOOL", (-1, 1)),
]
ROW = {"event_time": 1_717_400_000, "user_id": "u1", "amount": 12.5, "card_present": True}


def test_parse_rows_object_list_and_file(tmp_path) -> None:
    assert parse_rows('{"a": 1}') == [{"a": 1}]
    assert parse_rows('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]
    path = tmp_path / "rows.json"
    path.write_text('{"a": 3}')
    assert parse_rows(f"@{path}") == [{"a": 3}]
    for bad in ("{", "[]", "[1, 2]", '"x"'):
        with pytest.raises(InputError):
            parse_rows(bad)


def test_rows_become_batched_typed_columns() -> None:
    arrays = rows_to_arrays([ROW, {**ROW, "user_id": "u2", "amount": 3, "card_present": False}], FRAUD)
    assert arrays["event_time"].dtype == np.int64 and arrays["event_time"].shape == (2, 1)
    assert arrays["amount"].dtype == np.float32 and arrays["amount"][1, 0] == 3.0
    assert arrays["card_present"].dtype == np.bool_ and arrays["card_present"].tolist() == [[True], [False]]
    assert arrays["user_id"].tolist() == [[b"u1"], [b"u2"]]


def test_image_rows_reshape_to_the_row_shape() -> None:
    spec = [TensorSpec("image", "FP32", (-1, 1, 8, 8))]
    flat = rows_to_arrays([{"image": list(range(64))}], spec)["image"]
    nested = rows_to_arrays([{"image": [[list(range(8 * i, 8 * i + 8)) for i in range(8)]]}], spec)["image"]
    assert flat.shape == nested.shape == (1, 1, 8, 8)
    np.testing.assert_array_equal(flat, nested)
    with pytest.raises(InputError, match="expected 64 per row"):
        rows_to_arrays([{"image": list(range(60))}], spec)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({k: v for k, v in ROW.items() if k != "amount"}, "missing field"),
        ({**ROW, "colour": "red"}, "unknown field"),
        ({**ROW, "event_time": 1.5}, "expected integers"),
        ({**ROW, "amount": "lots"}, "expected numbers"),
        ({**ROW, "card_present": 0.5}, "BOOL"),
    ],
)
def test_clear_errors(row: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        rows_to_arrays([row], FRAUD)


def test_unbatched_input_takes_one_row() -> None:
    spec = [TensorSpec("x", "INT32", (2,))]
    assert rows_to_arrays([{"x": [1, 2]}], spec)["x"].tolist() == [1, 2]
    with pytest.raises(InputError, match="one row"):
        rows_to_arrays([{"x": [1, 2]}, {"x": [3, 4]}], spec)
    with pytest.raises(InputError, match="out of range"):
        rows_to_arrays([{"x": [1, 2**40]}], spec)


def test_request_round_trips_through_the_codec_and_carries_parameters() -> None:
    arrays = rows_to_arrays([ROW], FRAUD)
    request = build_request("fraud", arrays, parameters={"debug": True})
    assert request.parameters["debug"].bool_param is True
    decoded = decode_request_inputs(request.inputs, request.raw_input_contents)
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)


def test_input_specs_from_metadata() -> None:
    metadata = inference_pb2.ModelMetadataResponse(name="fraud")
    metadata.inputs.add(name="amount", datatype="FP32", shape=[-1, 1])
    assert input_specs(metadata) == [TensorSpec("amount", "FP32", (-1, 1))]


def test_response_json_outputs_and_parameters() -> None:
    response = inference_pb2.ModelInferResponse(model_name="fraud", model_version="1")
    for name, array in {"score": np.array([[0.25]], np.float32), "tag": np.array([[b"ok"]], object)}.items():
        datatype, shape, raw = encode_raw(array)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    response.parameters["cache"].string_param = "hit"
    response.parameters["stage_model_ms"].double_param = 1.5
    out = response_json(response)
    assert out["outputs"] == {"score": [[0.25]], "tag": [["ok"]]}
    assert out["parameters"] == {"cache": "hit", "stage_model_ms": 1.5}
    assert out["model_version"] == "1"
