"""Domain errors: one typed subclass per gRPC code the mesh acts on, and the one translation of a failed call."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import (
    MAX_MESSAGE_BYTES,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MeshserveError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    client_message,
    error_with_code,
    from_rpc_error,
    quoted,
    quoted_names,
)

TYPED = [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    (grpc.StatusCode.NOT_FOUND, NotFound),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
    (grpc.StatusCode.UNAVAILABLE, Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
    (grpc.StatusCode.INTERNAL, Internal),
]


@pytest.mark.parametrize(("code", "kind"), TYPED)
def test_error_with_code_is_the_typed_subclass(code: grpc.StatusCode, kind: type[MeshserveError]) -> None:
    error = error_with_code(code, "why")
    assert type(error) is kind and error.code == code and str(error) == "why"
    assert kind("x").code == code  # the class itself carries the code


def test_a_code_without_a_subclass_is_kept_on_the_instance_only() -> None:
    error = error_with_code(grpc.StatusCode.PERMISSION_DENIED, "admin only")
    assert type(error) is MeshserveError and error.code == grpc.StatusCode.PERMISSION_DENIED
    assert MeshserveError.code == grpc.StatusCode.INTERNAL and MeshserveError("x").code == grpc.StatusCode.INTERNAL
    assert error.trailers == ()


def rpc_error(code: grpc.StatusCode, details: str | None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(("code", "kind"), TYPED)
def test_from_rpc_error_keeps_the_code_and_names_the_service(code: grpc.StatusCode, kind: type) -> None:
    cause = rpc_error(code, "replica draining")
    error = from_rpc_error("model", cause)
    assert type(error) is kind and error.code == code
    assert str(error) == "model: replica draining"
    assert error.__cause__ is cause


def test_from_rpc_error_without_details_says_the_code() -> None:
    error = from_rpc_error("cache", rpc_error(grpc.StatusCode.UNAVAILABLE, None))
    assert str(error) == "cache: UNAVAILABLE"
    other = from_rpc_error("feature", rpc_error(grpc.StatusCode.UNAUTHENTICATED, ""))
    assert type(other) is MeshserveError and other.code == grpc.StatusCode.UNAUTHENTICATED
    assert str(other) == "feature: UNAUTHENTICATED"


def test_a_short_name_is_quoted_whole_and_a_long_one_as_a_prefix_and_its_length() -> None:
    assert quoted("fraud_mlp") == "'fraud_mlp'"
    assert quoted("x" * 64) == "'" + "x" * 64 + "'"
    long = quoted("x" * 200_000)
    assert long.startswith("'xxxx") and long.endswith("...' (200000 bytes)") and len(long.encode()) < 100
    wide = quoted("\u00e9" * 100)  # 2 bytes each: the cut never splits a character
    assert wide.endswith("...' (200 bytes)") and "\ufffd" not in wide
    assert quoted_names(["a", "b"]) == "'a', 'b'"
    assert quoted_names([str(i) for i in range(20)], most=3) == "'0', '1', '2' and 17 more"


@pytest.mark.parametrize("char", ["x", "\u00e9", "\U0001f600"])
def test_a_client_message_is_bounded(char: str) -> None:
    assert client_message("unknown model 'm'") == "unknown model 'm'"
    text = "unknown model '" + char * 200_000 + "'"
    message = client_message(text)
    assert len(message.encode()) <= MAX_MESSAGE_BYTES
    assert message.startswith("unknown model '" + char * 10)
    assert message.endswith(f"[cut: {len(text.encode())} bytes in all]")
    assert message.encode().decode() == message and "\ufffd" not in message


def test_a_client_message_names_no_absolute_server_path() -> None:
    leaky = "RuntimeError('/srv/app/models/fraud_mlp/1/model.pt not found'), see /tmp/x/trace.log: in /work/a.py:3"
    message = client_message(leaky)
    assert "/srv" not in message and "/tmp" not in message and "/work" not in message
    assert "model.pt not found" in message and "trace.log" in message and "a.py:3" in message
    for kept in ("redis://127.0.0.1:6379/0", "/inference.GRPCInferenceService/ModelInfer", "3/4 rows", "a/b", "/x"):
        assert client_message(kept) == kept
