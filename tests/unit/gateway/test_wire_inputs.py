"""The one-pass check of raw inputs (`check_wire`) against the general path (`decode_raw_inputs`, then
`check_inputs`, then `request_digest`) on the shipped fraud pipeline: for any request both accept, the same rows,
arrays and digest; for any request the one-pass check declines, the general path's own answer (an error naming the
input, or arrays it accepts in another form); for malformed BYTES, the same error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.cache.api import request_digest
from services.common.errors import InvalidArgument
from services.common.tensor_codec import decode_raw_inputs, serialize_bytes
from services.gateway.inputs import check_inputs, check_wire
from services.gateway.pipeline import load_pipeline
from tests.helpers.servers import ROOT

FRAUD = load_pipeline(ROOT / "pipelines" / "fraud.yaml")
KEYS = [i.name for i in FRAUD.inputs]
Wire = list[tuple[str, str, tuple[int, ...], bytes]]


def text(rows: int) -> st.SearchStrategy[list[str]]:
    return st.lists(st.text(max_size=12), min_size=rows, max_size=rows)


@st.composite
def fraud_requests(draw: st.DrawFn) -> Wire:
    """A raw fraud request: 1 to 5 rows, each input [rows, 1] or [rows], in any order, any values (NaN included)."""
    rows = draw(st.integers(1, 5))
    wire: Wire = []
    for spec in FRAUD.inputs:
        shape = (rows,) if draw(st.booleans()) else (rows, 1)
        if spec.datatype == "BYTES":
            raw = serialize_bytes(np.array([s.encode() for s in draw(text(rows))], dtype=object))
        elif spec.datatype == "INT64":
            raw = np.array(draw(st.lists(st.integers(-(2**62), 2**62), min_size=rows, max_size=rows)), "<i8").tobytes()
        elif spec.datatype == "BOOL":
            raw = np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), np.bool_).tobytes()
        else:
            values = draw(st.lists(st.floats(width=32, allow_nan=True), min_size=rows, max_size=rows))
            raw = np.array(values, "<f4").tobytes()
        wire.append((spec.name, spec.datatype, shape, raw))
    return draw(st.permutations(wire))


def general(wire: Wire) -> tuple[int, dict[str, np.ndarray], bytes] | InvalidArgument:
    try:
        rows, inputs = check_inputs(FRAUD, decode_raw_inputs(wire))
    except InvalidArgument as exc:
        return exc
    return rows, inputs, request_digest({name: inputs[name] for name in KEYS})


def same(one_pass: tuple[int, dict[str, np.ndarray], bytes], full: tuple[int, dict[str, np.ndarray], bytes]) -> None:
    assert one_pass[0] == full[0]
    assert one_pass[2] == full[2]  # the cache key's digest: the same entry either way
    assert one_pass[1].keys() == full[1].keys()
    for name, array in full[1].items():
        got = one_pass[1][name]
        assert got.dtype == array.dtype and got.shape == array.shape, name
        assert got.tolist() == array.tolist() or np.array_equal(got, array, equal_nan=True), name


@settings(max_examples=300, deadline=None)
@given(fraud_requests())
def test_the_one_pass_check_gives_what_the_general_path_gives(wire: Wire) -> None:
    full = general(wire)
    one_pass = check_wire(FRAUD, wire, KEYS)
    if one_pass is None:
        assert isinstance(full, InvalidArgument)  # declined only what the general path refuses (a NaN here)
        assert "NaN" in str(full)
    else:
        assert not isinstance(full, InvalidArgument)
        same(one_pass, full)


@settings(max_examples=200, deadline=None)
@given(fraud_requests(), st.integers(0, 9), st.sampled_from(["datatype", "shape", "bytes", "name", "rows", "drop"]))
def test_whatever_is_off_the_one_pass_check_declines_and_the_general_path_explains(
    wire: Wire, at: int, change: str
) -> None:
    name, datatype, shape, raw = wire[at]
    if change == "datatype":
        wire[at] = (name, "FP64" if datatype != "FP64" else "FP32", shape, raw)
    elif change == "shape":
        wire[at] = (name, datatype, (*shape, 2), raw)
    elif change == "bytes":
        wire[at] = (name, datatype, shape, raw + b"\x00")
    elif change == "name":
        wire[at] = (name + "_x", datatype, shape, raw)
    elif change == "rows":
        wire[at] = (name, datatype, (shape[0] + 1, *shape[1:]), raw)
    else:
        del wire[at]
    full = general(wire)
    assert isinstance(full, InvalidArgument)
    try:
        one_pass = check_wire(FRAUD, wire, KEYS)
    except InvalidArgument as exc:  # malformed BYTES: the same error the general path raises
        assert str(exc) == str(full)
        return
    assert one_pass is None


def test_a_request_past_max_batch_size_or_without_rows_is_declined() -> None:
    for rows in (0, FRAUD.max_batch_size + 1):
        wire = [
            (s.name, s.datatype, (rows, 1), serialize_bytes(np.array([b"x"] * rows, dtype=object)))
            if s.datatype == "BYTES"
            else (s.name, s.datatype, (rows, 1), np.zeros(rows, _dtype(s.datatype)).tobytes())
            for s in FRAUD.inputs
        ]
        assert check_wire(FRAUD, wire, KEYS) is None
        with pytest.raises(InvalidArgument):
            check_inputs(FRAUD, decode_raw_inputs(wire))


def _dtype(datatype: str) -> str:
    return {"INT64": "<i8", "FP32": "<f4", "BOOL": "|b1"}[datatype]


def test_a_key_of_some_inputs_digests_only_those() -> None:
    wire = [
        (s.name, s.datatype, (1, 1), serialize_bytes(np.array([b"v"], dtype=object)))
        if s.datatype == "BYTES"
        else (s.name, s.datatype, (1, 1), np.ones(1, _dtype(s.datatype)).tobytes())
        for s in FRAUD.inputs
    ]
    checked = check_wire(FRAUD, wire, ["user_id", "amount"])
    assert checked is not None
    _, inputs = check_inputs(FRAUD, decode_raw_inputs(wire))
    assert checked[2] == request_digest({"user_id": inputs["user_id"], "amount": inputs["amount"]})
