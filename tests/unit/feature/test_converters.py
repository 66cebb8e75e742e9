"""Protobuf <-> domain conversions of the FeatureService, in process."""

from __future__ import annotations

import numpy as np

from services.feature import converters
from services.feature.api import to_row
from services.feature.domain import Features
from services.feature.featureset import load_feature_sets
from services.feature.settings import ROOT
from services.protos import feature_pb2 as pb
from tests.helpers.fixtures import fraud_row


def test_values_keep_their_kind() -> None:
    """A client's row (services.feature.api.to_row) reads back as the same typed values."""
    fields = to_row({"b": True, "i": 7, "f": 2.5, "s": "x"}).fields
    assert fields["b"].WhichOneof("kind") == "bool_value"  # a bool is not an int64
    assert fields["i"].int64_value == 7
    assert fields["f"].double_value == 2.5
    assert fields["s"].string_value == "x"
    row = fraud_row()
    [back] = converters.rows_from_pb([to_row(row)])
    assert back == row and {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in row.items()}


def test_an_unset_value_reads_as_none() -> None:
    message = pb.Row(fields={"amount": pb.Value(), "user_id": pb.Value(string_value="u")})
    assert converters.rows_from_pb([message, pb.Row()]) == [{"amount": None, "user_id": "u"}, {}]


def test_compute_response() -> None:
    fs = load_feature_sets(ROOT / "features")["fraud_v1"]
    matrix = np.arange(2 * 64, dtype=np.float32).reshape(2, 64) / 3
    result = Features(matrix, np.array([True, False]), np.array([False, True]))
    reply = converters.compute_response_to_pb(fs, result)
    assert (reply.feature_set, reply.rows, reply.columns) == ("fraud_v1", 2, 64)
    assert list(reply.feature_names) == fs.names
    assert np.array_equal(np.frombuffer(reply.features, dtype="<f4").reshape(2, 64), matrix)
    assert [(f.defaulted, f.degraded) for f in reply.flags] == [(True, False), (False, True)]


def test_feature_set_response() -> None:
    fs = load_feature_sets(ROOT / "features")["fraud_v1"]
    info = converters.feature_set_to_pb(fs)
    assert (info.feature_set, info.name, info.version, info.timestamp_field) == ("fraud_v1", "fraud", 1, "event_time")
    assert {i.name: i.type for i in info.inputs} == dict(fs.spec.inputs)
    assert [(f.name, f.dtype, f.group) for f in info.features] == [
        (n, "FP32", g) for n, g in zip(fs.names, fs.groups, strict=True)
    ]
    assert converters.ingest_response_to_pb(3).ingested == 3
