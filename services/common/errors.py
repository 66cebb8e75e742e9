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
