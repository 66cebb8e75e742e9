"""Placement of a two-tier request: its class from the inputs and the client's header, the tier it goes to, and what
crosses to the cloud (never a sensitive input, in any form)."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from services.common.errors import InvalidArgument, MeshserveError
from services.common.tensor_codec import deserialize_bytes
from services.gateway import placement
from services.gateway.pipeline import PipelineSpec, load_pipelines
from services.gateway.placement import (
    Route,
    claimed_class,
    classify,
    crossing,
    decide,
    fill_withheld,
    refuse_at_cloud,
    rows_with_value,
    with_class_headers,
)

ROOT = Path(__file__).resolve().parents[3]
CANARY = b"canary-7f3a"


def spec(**placement_block: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "p",
            "inputs": [
                {"name": "user_id", "datatype": "BYTES", "data_class": "sensitive"},
                {"name": "device_id", "datatype": "BYTES", "data_class": "sensitive"},
                {"name": "branch", "datatype": "INT64", "data_class": "sensitive"},
                {"name": "amount", "datatype": "FP32"},
                {"name": "country", "datatype": "BYTES"},
            ],
            "features": {"feature_set": "f"},
            "model": {"name": "m"},
            "outputs": ["y"],
            "degradation": {"on_model_failure": [], "on_feature_failure": []},
            "placement": placement_block,
        }
    )


def text(*values: bytes) -> np.ndarray:
    return np.array([[v] for v in values], dtype=object)


def general_rows(rows: int = 3) -> dict[str, np.ndarray]:
    """Rows without any identifier (the INT64 sensitive input left out: the gateway fills it)."""
    return {
        "user_id": text(*[b""] * rows),
        "device_id": text(*[b""] * rows),
        "amount": np.arange(rows, dtype=np.float32).reshape(rows, 1),
        "country": text(*[b"DE"] * rows),
    }


def test_the_module_example_runs() -> None:
    failed, tried = doctest.testmod(placement, raise_on_error=False)
    assert tried and not failed


def test_rows_without_any_sensitive_value_are_general() -> None:
    inputs, withheld = fill_withheld(spec(), general_rows())
    assert withheld == ["branch"] and inputs["branch"].shape == (3, 1)
    assert classify(spec(), inputs, None, withheld) == "general"


@pytest.mark.parametrize("row", [0, 1, 2])
def test_one_value_in_one_row_of_one_field_makes_the_request_sensitive(row: int) -> None:
    inputs = general_rows()
    ids = [b"", b"", b""]
    ids[row] = CANARY
    inputs["device_id"] = text(*ids)
    assert classify(spec(), inputs, None) == "sensitive"
    assert classify(spec(), inputs, "general") == "sensitive"  # a client's general never lowers it


def test_a_sent_number_in_a_sensitive_field_is_a_value_a_left_out_one_is_not() -> None:
    inputs = general_rows()
    inputs["branch"] = np.zeros((3, 1), dtype=np.int64)
    assert classify(spec(), inputs, None) == "sensitive"
    filled, withheld = fill_withheld(spec(), general_rows())
    assert classify(spec(), filled, None, withheld) == "general"


def test_a_general_field_with_values_stays_general() -> None:
    inputs = general_rows()
    inputs["country"] = text(CANARY, CANARY, CANARY)
    assert classify(spec(), inputs, None) == "general"


def test_the_client_header_makes_it_stricter() -> None:
    assert claimed_class([("x-meshserve-data-class", "Sensitive ")]) == "sensitive"
    assert claimed_class([("x-meshserve-data-class", "general"), ("x-meshserve-data-class", "sensitive")]) == (
        "sensitive"
    )
    assert claimed_class([("x-meshserve-data-class", b"general")]) == "general"
    assert claimed_class([("x-other", "sensitive")]) is None
    assert classify(spec(), general_rows(), "sensitive") == "sensitive"
    with pytest.raises(InvalidArgument, match="must be sensitive or general"):
        claimed_class([("x-meshserve-data-class", "public")])


def test_rows_with_value_per_row_and_multi_element_inputs() -> None:
    grid = np.array([[b"", b""], [b"", b"x"], [b"y", b""]], dtype=object)
    assert rows_with_value(grid).tolist() == [False, True, True]
    assert rows_with_value(np.array([None, b""], dtype=object)).tolist() == [False, False]
    assert rows_with_value(np.zeros((2, 3), np.float32)).tolist() == [True, True]


def test_the_tier_by_class_and_policy() -> None:
    assert decide(spec(), "sensitive") == Route("sensitive", "edge")
    assert decide(spec(), "general") == Route("general", "cloud", "derived_features")
    assert decide(spec(leave_edge="request"), "general") == Route("general", "cloud", "request")
    assert decide(spec(general_to="edge"), "general") == Route("general", "edge")
    no_placement = spec().model_copy(update={"placement": None})
    assert decide(no_placement, "general") == Route("general", "edge")


def test_request_mode_sends_only_the_general_inputs() -> None:
    inputs = general_rows(2)
    inputs["branch"] = np.array([[4], [5]], dtype=np.int64)
    inputs["user_id"] = text(CANARY, b"")
    name, tensors = crossing(spec(leave_edge="request"), Route("general", "cloud", "request"), inputs, {})
    assert name == "p"
    assert sorted(tensors) == ["amount", "country"]
    assert all(CANARY not in raw for _, _, raw in tensors.values())
    datatype, shape, raw = tensors["country"]
    assert (datatype, shape) == ("BYTES", [2, 1]) and list(deserialize_bytes("country", raw, 2)) == [b"DE", b"DE"]


def test_derived_features_mode_sends_the_feature_matrix_to_the_model() -> None:
    features = ("FP32", [3, 4], np.ones((3, 4), np.float32).tobytes())
    wire = {"features": features, "user_id": ("BYTES", [3, 1], CANARY)}
    name, tensors = crossing(spec(), Route("general", "cloud", "derived_features"), general_rows(), wire)
    assert name == "m" and tensors == {"features": features}


def test_outgoing_headers_carry_this_gateways_class_not_the_clients() -> None:
    headers = [("traceparent", "00-a-b-01"), ("x-meshserve-data-class", "general"), ("x-meshserve-tier", "cloud")]
    assert with_class_headers(headers, "sensitive") == (
        ("traceparent", "00-a-b-01"),
        ("x-meshserve-data-class", "sensitive"),
        ("x-meshserve-tier", "edge"),
    )


def test_the_cloud_refuses_sensitive_requests_without_echoing_values() -> None:
    with pytest.raises(MeshserveError) as info:
        refuse_at_cloud(None, {}, "sensitive")
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    inputs = general_rows()
    inputs["user_id"] = text(b"", CANARY, b"")
    with pytest.raises(MeshserveError) as info:
        refuse_at_cloud(spec(), inputs, None)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "'user_id'" in str(info.value) and CANARY.decode() not in str(info.value)
    filled, withheld = fill_withheld(spec(), general_rows())
    refuse_at_cloud(spec(), filled, "general", withheld)  # a general request passes


def test_fraud_marks_its_identifiers_sensitive() -> None:
    fraud = load_pipelines(ROOT / "pipelines")["fraud"]
    assert fraud.sensitive_inputs() == ["user_id", "merchant_id", "device_id"]
    assert fraud.placement is not None and fraud.placement.leave_edge == "derived_features"
    assert "cloud" not in fraud.placement.tiers.sensitive
