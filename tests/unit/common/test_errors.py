"""Domain errors: one typed subclass per gRPC code the mesh acts on, and the one translation of a failed call."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MeshserveError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_with_code,
    from_rpc_error,
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
