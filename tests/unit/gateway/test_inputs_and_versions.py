"""Request checks against a pipeline, feature rows, deadlines per hop and the serving-versions tracker."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import DeadlineExceeded, InvalidArgument
from services.feature.api import to_row
from services.gateway.inputs import check_inputs, feature_rows
from services.gateway.pipeline import load_pipelines
from services.gateway.upstream import Deadline, outgoing_headers
from services.gateway.versions import ServingVersions

ROOT = Path(__file__).resolve().parents[3]
FRAUD = load_pipelines(ROOT / "pipelines")["fraud"]


def transaction(rows: int = 2) -> dict[str, np.ndarray]:
    def text(v: str) -> np.ndarray:
        return np.array([v.encode()] * rows, dtype=object)

    return {
        "event_time": np.full(rows, 1_760_000_000, np.int64),
        "user_id": text("u"),
        "merchant_id": text("m"),
        "device_id": text("d"),
        "amount": np.full(rows, 12.5, np.float32),
        "country": text("US"),
        "channel": text("web"),
        "mcc": text("5411"),
        "card_present": np.ones(rows, bool),
        "account_age_days": np.full(rows, 30.0, np.float32),
    }


def test_rows_of_shape_n_or_n_by_1_are_accepted_and_become_feature_rows() -> None:
    rows, inputs = check_inputs(FRAUD, transaction(3))
    assert rows == 3 and inputs["amount"].shape == (3, 1)
    out = feature_rows(FRAUD, inputs, rows)
    assert out[2]["user_id"] == "u"
    assert out[0]["amount"] == 12.5 and type(out[0]["amount"]) is float
    assert out[1]["card_present"] is True
    assert out[0]["event_time"] == 1_760_000_000 and type(out[0]["event_time"]) is int
    # ... and the feature client sends each as the protobuf field of its type
    row = to_row(out[0])
    assert row.fields["user_id"].string_value == "u"
    assert row.fields["amount"].double_value == 12.5
    assert to_row(out[1]).fields["card_present"].bool_value is True
    assert row.fields["event_time"].int64_value == 1_760_000_000


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: r.pop("user_id"), "'user_id' is missing"),
        (lambda r: r.__setitem__("amount", r["amount"].astype(np.int64)), "'amount' is INT64; send FP32"),
        (lambda r: r.__setitem__("amount", np.array([1.0, np.inf], np.float32)), "'amount' row 1 is NaN"),
        (lambda r: r.__setitem__("amount", np.ones(3, np.float32)), "'amount' has 3 rows, the others 2"),
        (lambda r: r.__setitem__("amount", np.ones((2, 2), np.float32)), "expected [rows, 1]"),
    ],
)
def test_bad_requests_name_the_input(change, words: str) -> None:
    request = transaction()
    change(request)
    with pytest.raises(InvalidArgument) as info:
        check_inputs(FRAUD, request)
    assert words in str(info.value)


def test_too_many_rows_and_non_utf8_ids() -> None:
    with pytest.raises(InvalidArgument, match="65 rows in one request; at most 64"):
        check_inputs(FRAUD, transaction(65))
    request = transaction(1)
    request["user_id"] = np.array([b"\xff"], dtype=object)
    rows, inputs = check_inputs(FRAUD, request)
    with pytest.raises(InvalidArgument, match="'user_id' row 0 is not UTF-8"):
        feature_rows(FRAUD, inputs, rows)


def test_each_hop_gets_the_smaller_of_its_limit_and_what_is_left() -> None:
    deadline = Deadline(total_s=1.0, caller_remaining_s=0.05)
    assert 0.0 < deadline.for_hop(500, "model") <= 0.05
    assert deadline.for_hop(10, "cache") == pytest.approx(0.01)
    late = Deadline(total_s=1.0, caller_remaining_s=0.0)
    time.sleep(0.001)
    with pytest.raises(DeadlineExceeded, match="before calling"):
        late.for_hop(100, "calling the model")


def test_only_canary_trace_and_request_headers_are_passed_on() -> None:
    incoming = [
        ("x-canary", "true"),
        ("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"),
        ("authorization", "secret"),
        ("user-agent", "x"),
    ]
    assert dict(outgoing_headers(incoming)) == {"x-canary": "true", "traceparent": incoming[1][1]}


def test_serving_versions_newest_first_and_forgotten_after_ttl() -> None:
    versions = ServingVersions(ttl_s=5)
    versions.saw("m", "1", now=100.0)
    versions.saw("m", "10", now=101.0)
    versions.saw("m", "2", now=102.0)
    versions.saw("m", "", now=102.0)  # an empty version is ignored
    assert versions.current("m", now=103.0) == ["10", "2", "1"]
    assert versions.current("m", now=105.5) == ["10", "2"]
    assert versions.current("other", now=105.5) == []
