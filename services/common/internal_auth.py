"""The stack's internal credential: the bearer token its processes send one another on their inner endpoints
(/metrics, /recording/*, the trace store's OTLP receiver), read from `MESHSERVE_INTERNAL_*`, and the checks that
refuse a caller without it (HTTP 401, gRPC UNAUTHENTICATED). A process without one configured stays open."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import grpc
from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.common.operator_check import AUTHORIZATION, Metadata, bearer_credential, same_secret
from services.common.settings import EnvSettings

HOW_TO_SEND = (
    "send 'Authorization: Bearer <the stack's internal token>' (MESHSERVE_INTERNAL_TOKEN; `meshserve up` keeps it in "
    "secrets/internal-token of its log dir)"
)
UNAUTHORIZED_BODY = f"401 unauthorized: {HOW_TO_SEND}\n".encode()
HEALTH_SERVICE = "grpc.health.v1.Health"


class InternalAuthSettings(EnvSettings):
    """The internal credential of a process: every process of one stack gets the same one (like MESHSERVE_REDIS_URL).

    With neither field set the inner endpoints answer anyone who reaches them (a single service started alone, a
    test); in a cluster the mesh's mTLS and AuthorizationPolicy guard them instead.
    """

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_INTERNAL_", extra="ignore", frozen=True)

    token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token required on /metrics, /recording/* and the trace store's OTLP receiver, and sent "
        "to peers' /recording/*; empty: the endpoints are open and nothing is sent.",
    )
    token_file: Path | None = Field(
        None,
        description="A file holding the token (e.g. a mounted Secret, or `meshserve up`'s secrets/internal-token); "
        "read once at start, and used when `token` is empty.",
    )

    def value(self) -> str:
        """The token (from `token`, else `token_file`); empty when neither is set. An unreadable file is an error:
        a process told to require a credential never falls back to open."""
        token = self.token.get_secret_value().strip()
        if token or self.token_file is None:
            return token
        text = self.token_file.read_text().strip()
        if not text:
            raise ValueError(f"{self.token_file}: the internal token file is empty")
        return text


@functools.cache
def internal_token() -> str:
    """This process's internal token, read once from the environment ('' when none is configured)."""
    return InternalAuthSettings().value()


def authorization(token: str) -> str:
    """The `Authorization` header value that carries `token`."""
    return f"Bearer {token}"


def auth_headers(token: str | None) -> dict[str, str]:
    """HTTP headers carrying `token` (none for an empty or None token)."""
    return {"Authorization": authorization(token)} if token else {}


def admits(token: str, header: str | None) -> bool:
    """Whether a request whose `Authorization` header is `header` may reach an endpoint guarded by `token`."""
    if not token:
        return True
    credential = bearer_credential([(AUTHORIZATION, header)] if header is not None else [])
    return credential is not None and same_secret(credential, token)


def admits_metadata(token: str, metadata: Metadata | None) -> bool:
    """Whether a gRPC call with these headers may reach a server guarded by `token`."""
    if not token:
        return True
    credential = bearer_credential(metadata)
    return credential is not None and same_secret(credential, token)


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class InternalAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call without the internal token, except to the services in `open_services`
    (grpc.health.v1 by default: probes and the supervisor ask it, and it says only SERVING or not)."""

    def __init__(self, token: str, open_services: Iterable[str] = (HEALTH_SERVICE,)) -> None:
        self.token = token
        self.open_prefixes = tuple(f"/{name}/" for name in open_services)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        metadata = handler_call_details.invocation_metadata
        if method.startswith(self.open_prefixes) or admits_metadata(self.token, metadata):
            return await continuation(handler_call_details)
        return _refusal(await continuation(handler_call_details))


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts with UNAUTHENTICATED before reading anything."""
    message = f"this endpoint needs the stack's internal credential: {HOW_TO_SEND}"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover (a generator: the shape of a response stream)

    if handler is None:  # an unknown method: refused as unauthenticated too, so the refusal tells nothing
        return grpc.unary_unary_rpc_method_handler(unary)
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, deserialize, serialize)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, deserialize, serialize)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, deserialize, serialize)
    return grpc.unary_unary_rpc_method_handler(unary, deserialize, serialize)


def refuse_http(handler: BaseHTTPRequestHandler) -> None:
    """Answer 401 with the one line saying which header to send, and close the connection (its body, if any, is
    not read)."""
    handler.close_connection = True
    handler.send_response(HTTPStatus.UNAUTHORIZED)
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("WWW-Authenticate", 'Bearer realm="meshserve-internal"')
    handler.send_header("Content-Length", str(len(UNAUTHORIZED_BODY)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(UNAUTHORIZED_BODY)


def http_admitted(handler: BaseHTTPRequestHandler, token: str) -> bool:
    """Whether the request `handler` reads carries `token` (always, without one); if not, it has been answered 401."""
    if admits(token, handler.headers.get("Authorization")):
        return True
    refuse_http(handler)
    return False


def guarded_wsgi(app: WsgiApp, token: str) -> WsgiApp:
    """`app` behind the internal credential: a request without `token` gets 401 and the line saying what to send."""
    if not token:
        return app

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if admits(token, environ.get("HTTP_AUTHORIZATION")):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Bearer realm="meshserve-internal"'),
                ("Content-Length", str(len(UNAUTHORIZED_BODY))),
            ],
        )
        return [UNAUTHORIZED_BODY]

    return guarded
