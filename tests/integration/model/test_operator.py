"""`python -m services.model` with and without an admin token: loading and unloading need the operator's bearer
token when one is set (PERMISSION_DENIED naming the credential, never echoing what was sent), every other RPC stays
open; without one they are open and the log says so at start."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.models import Mlp, mlp_config, write_model
from tests.helpers.servers import model_service

TOKEN = "model-operator-token-for-tests"
SENT = "a-guess-the-caller-made"


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_model(root, "mlp", mlp_config("mlp"), {1: Mlp(1)})
    return root


def ready(stub: pb_grpc.GRPCInferenceServiceStub) -> bool:
    return stub.ModelReady(pb.ModelReadyRequest(name="mlp"), timeout=5).ready


def test_with_an_admin_token_only_the_operator_loads_and_unloads(repo: Path, tmp_path: Path) -> None:
    with model_service(
        repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false", MESHSERVE_MODEL_ADMIN_TOKEN=TOKEN
    ) as svc:
        with grpc.insecure_channel(svc.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            refused: list[tuple[tuple[str, str], ...]] = [
                (),
                (("authorization", f"Bearer {SENT}"),),
                (("authorization", TOKEN),),  # no scheme
                (("authorization", f"Basic {TOKEN}"),),
                (("x-admin-token", TOKEN),),
            ]
            calls = [
                (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="mlp")),
                (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="mlp")),
            ]
            for metadata in refused:
                for rpc, request in calls:
                    with pytest.raises(grpc.RpcError) as info:
                        rpc(request, timeout=5, metadata=metadata)
                    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, metadata
                    details = info.value.details() or ""
                    assert "only the operator" in details and "MESHSERVE_MODEL_ADMIN_TOKEN" in details
                    assert SENT not in details and TOKEN not in details
            assert ready(stub), "a refused unload changed nothing"
            # Everything else needs no token.
            assert [m.name for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5).models] == ["mlp"]
            operator = (("authorization", f"Bearer {TOKEN}"),)
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"), timeout=30, metadata=operator)
            assert not ready(stub)
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="mlp"), timeout=60, metadata=operator)
            assert ready(stub)
        log = svc.log()
    assert "RepositoryModelLoad, RepositoryModelUnload need the operator's token (MESHSERVE_MODEL_ADMIN_TOKEN)" in log
    assert "open to any caller that reaches this port" not in log
    assert TOKEN not in log and SENT not in log


def test_without_an_admin_token_loading_is_open_and_the_log_warns(repo: Path, tmp_path: Path) -> None:
    with model_service(repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false", MESHSERVE_MODEL_ADMIN_TOKEN="") as svc:
        with grpc.insecure_channel(svc.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"), timeout=30)
            assert not ready(stub)
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="mlp"), timeout=60)
            assert ready(stub)
        warnings = [line for line in svc.log().splitlines() if "open to any caller that reaches this port" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert "RepositoryModelLoad, RepositoryModelUnload" in warnings[0]
    assert "MESHSERVE_MODEL_ADMIN_TOKEN" in warnings[0]
