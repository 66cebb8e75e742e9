"""Domain exceptions, each carrying the gRPC status the mesh should see (one place, see interceptors)."""

from __future__ import annotations

import grpc


class MeshserveError(Exception):
    """Base of every error a client may see; `code` is its gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    # Trailing metadata sent with the status, e.g. a retry hint (("grpc-retry-pushback-ms", "50"),).
    trailers: tuple[tuple[str, str], ...] = ()


def error_with_code(code: grpc.StatusCode, message: str) -> MeshserveError:
    """An error carrying a status another service returned (the gateway passes it on unchanged)."""
    kind = _BY_CODE.get(code)
    if kind is not None:
        return kind(message)
    error = MeshserveError(message)
    error.code = code
    return error


class InvalidArgument(MeshserveError):
    """Bad input: never retried."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MeshserveError):
    """Unknown model, version or pipeline."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(MeshserveError):
    """Shed under overload; retryable on another replica."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(MeshserveError):
    """Not ready or draining; retryable."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MeshserveError):
    """The caller's deadline passed before the work could be done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(MeshserveError):
    """A fault of ours (e.g. a model that raised during forward)."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[MeshserveError]] = {
    kind.code: kind for kind in (InvalidArgument, NotFound, ResourceExhausted, Unavailable, DeadlineExceeded, Internal)
}


def from_rpc_error(service: str, exc: grpc.aio.AioRpcError) -> MeshserveError:
    """A failed call to another service as the project's own error, its status code kept (so the mesh's retry
    and ejection semantics hold when it is passed on). The one place where an `AioRpcError` is translated."""
    error = error_with_code(exc.code(), f"{service}: {exc.details() or exc.code().name}")
    error.__cause__ = exc
    return error
