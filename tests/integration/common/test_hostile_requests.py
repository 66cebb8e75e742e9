"""What the shared runtime does for every service, as real processes over sockets: a request body that does not
parse is INVALID_ARGUMENT with at most one log line for many such calls, and the model service, asked directly,
answers an oversized model name and a request without rows as bad input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import grpc
import numpy as np
import pytest

from services.common.tensor_codec import encode_raw
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.servers import (
    ROOT,
    ServiceProcess,
    cache_service,
    feature_service,
    gateway_service,
    model_service,
)

# A varint that never ends, field number 0, a length-delimited field cut short: none parses as any message.
GARBAGE = [b"\xff" * 16, b"\x00", b"\x0a\x05ab"]
CALLS = 20  # of each body, so 60 per service
METHODS = {
    "model": "/inference.GRPCInferenceService/ModelInfer",
    "feature": "/meshserve.feature.FeatureService/Compute",
    "cache": "/meshserve.cache.CacheService/Lookup",
    "gateway": "/inference.GRPCInferenceService/ModelInfer",
}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServiceProcess]]:
    """The four services as their own processes (the demo model repository, embedded Valkeys)."""
    logs = tmp_path_factory.mktemp("logs")
    with ExitStack() as stack:
        model = stack.enter_context(model_service(ROOT / "models", logs, MESHSERVE_MODEL_WATCH="false"))
        feature = stack.enter_context(feature_service(logs))
        cache = stack.enter_context(cache_service(logs))
        gateway = stack.enter_context(gateway_service(logs, model.address, feature.address, cache.address))
        yield {"model": model, "feature": feature, "cache": cache, "gateway": gateway}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_body_that_does_not_parse_is_invalid_argument_with_one_log_line(
    services: dict[str, ServiceProcess], name: str
) -> None:
    service = services[name]
    with grpc.insecure_channel(service.address) as channel:
        call = channel.unary_unary(METHODS[name])  # no serializer: the bytes go out as they are
        for _ in range(CALLS):
            for body in GARBAGE:
                with pytest.raises(grpc.RpcError) as err:
                    call(body, timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
                assert (err.value.details() or "").startswith("the request body is not a valid ")
    log = service.log()
    assert "Traceback" not in log and "DecodeError'>" not in log
    lines = [line for line in log.splitlines() if "did not parse" in line]
    assert len(lines) == 1, lines
    assert METHODS[name] in lines[0]


def raw_request(model: str, x: np.ndarray, input_name: str = "features") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    datatype, shape, raw = encode_raw(x)
    request.inputs.add(name=input_name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


def test_the_model_service_answers_bad_names_and_empty_requests_as_bad_input(
    services: dict[str, ServiceProcess],
) -> None:
    """Straight to the model service, past the gateway: a 200 kB model name (echoed, it made Envoy reset the
    stream) and a request of zero rows to fraud_mlp are INVALID_ARGUMENT, with short messages and no paths."""
    with grpc.insecure_channel(services["model"].address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        cases = [
            (raw_request("m" * 200_000, np.zeros((1, 64), np.float32)), "model name of 200000 bytes"),
            (raw_request("fraud_mlp", np.zeros((0, 64), np.float32)), "input 'features' has 0 rows"),
        ]
        for request, fragment in cases:
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert fragment in (err.value.details() or "") and len(err.value.details() or "") < 200
        with pytest.raises(grpc.RpcError) as err:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="absent"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert str(ROOT) not in (err.value.details() or "")
        x = np.zeros((2, 64), np.float32)
        assert stub.ModelInfer(raw_request("fraud_mlp", x), timeout=10).outputs[0].shape == [2, 1]
