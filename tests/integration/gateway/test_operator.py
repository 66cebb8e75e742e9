"""The gateway and the model service as real processes, each with its own operator credential: through the gateway,
loading and unloading pass for its admin token or an operator JWT (verified against MESHSERVE_GATEWAY_JWKS, a file)
and reach the model service with the model's admin token; a JWT of another subject is PERMISSION_DENIED, one that
does not verify UNAUTHENTICATED; the model service itself refuses the gateway's token."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from services.common import tokens
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.models import Mlp, mlp_config, write_model
from tests.helpers.servers import ServiceProcess, free_port, gateway_service, model_service

GATEWAY_TOKEN = "gateway-operator-token-for-tests"
MODEL_TOKEN = "model-operator-token-for-tests"
KEY = tokens.new_signing_key()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    root = tmp_path_factory.mktemp("operator")
    write_model(root / "repo", "mlp", mlp_config("mlp"), {1: Mlp(1)})
    jwks = root / "jwks.json"
    jwks.write_text(tokens.jwks(KEY))
    logs = root / "logs"
    with model_service(
        root / "repo", logs, MESHSERVE_MODEL_WATCH="false", MESHSERVE_MODEL_ADMIN_TOKEN=MODEL_TOKEN
    ) as model:
        nowhere = f"127.0.0.1:{free_port()}"  # feature and cache are not needed to load and unload
        with gateway_service(
            logs,
            model.address,
            nowhere,
            nowhere,
            MESHSERVE_GATEWAY_ADMIN_TOKEN=GATEWAY_TOKEN,
            MESHSERVE_GATEWAY_MODEL_ADMIN_TOKEN=MODEL_TOKEN,
            MESHSERVE_GATEWAY_JWKS=str(jwks),
        ) as gateway:
            yield model, gateway


def stub_of(service: ServiceProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(service.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture()
def model(services: tuple[ServiceProcess, ServiceProcess]) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    yield from stub_of(services[0])


@pytest.fixture()
def gateway(services: tuple[ServiceProcess, ServiceProcess]) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    yield from stub_of(services[1])


def bearer(credential: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"),)


def ready(model: pb_grpc.GRPCInferenceServiceStub) -> bool:
    return model.ModelReady(pb.ModelReadyRequest(name="mlp"), timeout=5).ready


def unload(stub: pb_grpc.GRPCInferenceServiceStub, metadata: tuple[tuple[str, str], ...]) -> None:
    stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"), timeout=30, metadata=metadata)


def load(stub: pb_grpc.GRPCInferenceServiceStub, metadata: tuple[tuple[str, str], ...]) -> None:
    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="mlp"), timeout=60, metadata=metadata)


def refusal(call: Callable[..., None], *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args)
    return info.value


def test_the_admin_token_and_an_operator_jwt_load_and_unload_through_the_gateway(
    model: pb_grpc.GRPCInferenceServiceStub, gateway: pb_grpc.GRPCInferenceServiceStub
) -> None:
    assert ready(model)
    unload(gateway, bearer(GATEWAY_TOKEN))
    assert not ready(model)
    load(gateway, bearer(tokens.mint(KEY, tokens.OPERATOR_SUBJECT)))
    assert ready(model)
    unload(gateway, bearer(tokens.mint(KEY, tokens.OPERATOR_SUBJECT)))
    assert not ready(model)
    load(gateway, bearer(GATEWAY_TOKEN))
    assert ready(model)


@pytest.mark.parametrize(
    ("credential", "code"),
    [
        (None, grpc.StatusCode.PERMISSION_DENIED),
        ("a-guess", grpc.StatusCode.PERMISSION_DENIED),
        (MODEL_TOKEN, grpc.StatusCode.PERMISSION_DENIED),  # the model service's token is not the gateway's
        (tokens.mint(KEY, "alice"), grpc.StatusCode.PERMISSION_DENIED),
        (tokens.mint(KEY, tokens.OPERATOR_SUBJECT, ttl_s=-60), grpc.StatusCode.UNAUTHENTICATED),
        (tokens.mint(tokens.new_signing_key(), tokens.OPERATOR_SUBJECT), grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_any_other_caller_is_refused_at_the_gateway(
    model: pb_grpc.GRPCInferenceServiceStub,
    gateway: pb_grpc.GRPCInferenceServiceStub,
    credential: str | None,
    code: grpc.StatusCode,
) -> None:
    metadata = () if credential is None else bearer(credential)
    for call in (unload, load):
        error = refusal(call, gateway, metadata)
        assert error.code() == code, error.details()
        assert credential is None or credential not in (error.details() or "")
    assert ready(model)


def test_the_model_service_refuses_the_gateway_token_and_takes_its_own(
    model: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    for metadata in ((), bearer(GATEWAY_TOKEN), bearer(tokens.mint(KEY, tokens.OPERATOR_SUBJECT))):
        error = refusal(unload, model, metadata)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "MESHSERVE_MODEL_ADMIN_TOKEN" in (error.details() or "")
    assert ready(model)
    unload(model, bearer(MODEL_TOKEN))
    assert not ready(model)
    load(model, bearer(MODEL_TOKEN))
    assert ready(model)
