"""Domain exceptions, each carrying the gRPC status the mesh should see, and the bounded text a client is shown.

The interceptor (services/common/interceptors.py) is the one place an error becomes a status; it sends every
message through `client_message`, so that no service can put an unbounded `grpc-message` on the wire (over
Envoy's header limit Envoy resets the stream, and the client sees a retryable UNAVAILABLE that the mesh
retries and counts toward ejecting a healthy replica) or show a caller where the server keeps its files.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import grpc

# The most a client is shown of one error, in UTF-8 bytes (grpc percent-encodes the rest of ASCII, so at most
# three times this travels in the header).
MAX_MESSAGE_BYTES = 1024
# The most of a request-supplied name an error message quotes.
MAX_QUOTED_BYTES = 64
# An absolute POSIX path of two or more parts, not inside a word, a URL or a dotted gRPC method name
# ("/pkg.Service/Method" keeps its dot in the first part): shown as its last part only.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[\w@+-]+(?:/[^\s/'\"`,;:()\[\]{}<>]+)*/([^\s/'\"`,;:()\[\]{}<>]+)")


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


def _cut(text: str, limit: int) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits `limit` bytes (never half a character)."""
    return text.encode()[:limit].decode(errors="ignore")


def quoted(name: str, limit: int = MAX_QUOTED_BYTES) -> str:
    """A request-supplied name for an error message: in quotes when short, else its first bytes and its length."""
    size = len(name.encode())
    if size <= limit:
        return f"'{name}'"
    return f"'{_cut(name, limit)}...' ({size} bytes)"


def quoted_names(names: Sequence[str], most: int = 5) -> str:
    """Request-supplied names for an error message: the first `most`, each quoted, and how many more there are."""
    shown = ", ".join(quoted(n) for n in names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def client_message(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """The text a client is shown for an error: absolute paths cut to their last part, at most `limit` bytes."""
    message = _ABSOLUTE_PATH.sub(r".../\1", message)
    size = len(message.encode())
    if size <= limit:
        return message
    marker = f"... [cut: {size} bytes in all]"
    return _cut(message, limit - len(marker)) + marker
