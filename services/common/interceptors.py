"""The server interceptor every service runs: domain errors to gRPC status, per-RPC metrics and a SERVER span.

Every status message it sends is bounded and path-free (errors.client_message), and a request body that does not
parse is answered INVALID_ARGUMENT with one rate-limited log line (services/common/malformed.py), for every
service alike.

It covers all four RPC kinds. A streaming handler written as an async generator is driven here with
`context.write`, so that the stream's whole life (including a client's cancellation, which arrives as a
CancelledError or a failed write in this coroutine) is one frame that maps errors, observes metrics and ends
its span.

Why not opentelemetry-instrumentation-grpc (0.66b2, `aio_server_interceptor()` / `GrpcAioInstrumentorServer`):
it maps no errors and counts nothing, so this interceptor would still run beside it, and then
* it breaks streams: its aio stream wrapper iterates the handler with `async for`, so any stream written with
  `context.write` fails with UNKNOWN (TypeError), grpc's own aio health Watch included unless filtered out, and
  so does every stream once this interceptor has adapted it; placed inside this one instead, streams work but
  the span ends before the status is set (a failed RPC's span keeps status code 0, OK) and the latency
  histograms lose their trace exemplars;
* it costs more: it re-wraps the handler and proxies the context on every call and has no unsampled fast path,
  so every call, sampled or not, spends more CPU (`python -m bench.experiments.interceptor_overhead`; the
  figures are in bench/README.md, "Server interceptor").
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceState

from services.common.errors import InvalidArgument, MeshserveError, client_message
from services.common.malformed import Malformed, RateLimitedLog, tolerant
from services.common.metrics import RpcMetrics
from services.common.recording import PARENT_HEADER, RecordedSpan, RecordingTracer, enter, leave, parse_traceparent

log = logging.getLogger(__name__)

# A handler as grpc.aio calls it: (request or request iterator, context) -> response, or None for a stream that
# wrote its responses with context.write.
Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext], AsyncGenerator[Any, None]]
UNTRACED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
_HANDLER_FACTORIES = {
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


def _behavior(handler: grpc.RpcMethodHandler) -> tuple[Behavior | None, bool]:
    """The handler's behavior as a coroutine function and whether its responses stream; None for a synchronous
    behavior, which grpc runs in its executor and this interceptor leaves alone."""
    streaming = bool(handler.response_streaming)
    _, field = _HANDLER_FACTORIES[(bool(handler.request_streaming), streaming)]
    behavior = getattr(handler, field)
    if streaming and inspect.isasyncgenfunction(behavior):
        return _stream(_written(behavior)), True
    if streaming and inspect.iscoroutinefunction(behavior):
        return _stream(behavior), True
    if not streaming and inspect.iscoroutinefunction(behavior):
        return behavior, False
    return None, streaming


def _stream(behavior: Behavior) -> Behavior:
    """A response stream as one coroutine (a handler that writes with context.write, or `_written`'s)."""

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            await behavior(request, context)
        except grpc.aio.InternalError as exc:
            # A write failed in grpc's core: the client cancelled or its connection dropped mid-stream. Ending as
            # the cancellation it is lets grpc close the RPC quietly (it logs a failed write as an error).
            raise asyncio.CancelledError("the client went away mid-stream") from exc

    return stream


def _written(behavior: StreamBehavior) -> Behavior:
    """An async-generator stream as a coroutine that writes each response and closes the generator in this task:
    its `finally` runs now, even when the stream is cancelled while suspended at a `yield`, not whenever the
    generator is garbage-collected (in another task, outside the RPC's span and metrics)."""

    async def write_all(request: Any, context: grpc.aio.ServicerContext) -> None:
        responses = behavior(request, context)
        try:
            async for response in responses:
                await context.write(response)
        finally:
            await responses.aclose()

    return write_all


def _with_behavior(handler: grpc.RpcMethodHandler, behavior: Behavior) -> grpc.RpcMethodHandler:
    """The handler with `behavior`; its deserializer hands a body that does not parse on as a Malformed value
    (to `_map_errors`), where grpc would answer UNKNOWN and log a traceback."""
    factory, _ = _HANDLER_FACTORIES[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return factory(
        behavior,
        request_deserializer=tolerant(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


async def _parsed(requests: AsyncIterator[Any], refuse: Callable[[Malformed], MeshserveError]) -> AsyncIterator[Any]:
    """A request stream that raises `refuse(...)` at the first element that did not parse. (A handler reading
    with context.read() instead of iterating would see the Malformed value itself; none here does.)"""
    async for request in requests:
        if type(request) is Malformed:
            raise refuse(request)
        yield request


def _unsampled(traceparent: str | None) -> bool:
    """A well-formed W3C traceparent (version 00) whose sampled flag is off."""
    if traceparent is None or len(traceparent) != 55 or not traceparent.startswith("00-"):
        return False
    try:
        return not int(traceparent[53:55], 16) & 1
    except ValueError:  # malformed: let the propagator judge it
        return False


class _MetadataGetter(Getter[Mapping[str, str]]):
    """Reads W3C trace context (traceparent/tracestate) from gRPC invocation metadata."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _MetadataGetter()


class ErrorAndMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Maps MeshserveError to its gRPC status (unexpected exceptions to INTERNAL), counts every RPC by code and
    times it, and with a tracer provider starts a SERVER span per RPC as the child of the caller's W3C context.

    This is the single place where exceptions become status codes, so that Envoy's retry and
    outlier-detection policies see UNAVAILABLE / RESOURCE_EXHAUSTED / INVALID_ARGUMENT consistently.
    Tracing is the outer layer: the span is current while errors are mapped and latency is observed, so latency
    histograms carry the trace id as an exemplar. Health and reflection are counted but never traced; a caller
    whose traceparent says "not sampled" gets no span and no context extraction (nothing would be exported).
    Each method's wrapper is built once and reused on every call. With a Recorder as the tracer provider, every RPC
    but health and reflection is recorded (services/common/recording/), sampled or not, at a fraction of an SDK
    span's cost: the caller's traceparent is parsed here, and its `x-meshserve-parent` kept for the collector.
    """

    def __init__(self, service: str, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.metrics = RpcMetrics(service)
        self.tracer = tracer_provider.get_tracer("meshserve.grpc") if tracer_provider is not None else None
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self.malformed_log = RateLimitedLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        behavior, streaming = _behavior(handler)
        wrapped = handler
        if behavior is not None:
            mapped = self._wrap(method, behavior, bool(handler.request_streaming), streaming)
            wrapped = _with_behavior(handler, mapped)
        self._cache[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, behavior: Behavior, request_streaming: bool, streaming: bool) -> Behavior:
        mapped = self._map_errors(method, behavior, request_streaming, streaming)
        if self.tracer is None or method.startswith(UNTRACED_PREFIXES):
            return mapped
        if isinstance(self.tracer, RecordingTracer):
            return self._recorded(method, mapped, self.tracer)
        return self._traced(method, mapped, self.tracer)

    def _refuse(self, method: str, request: Malformed) -> MeshserveError:
        """The error for a body that did not parse, logged once per method and interval."""
        self.malformed_log.warning(
            method,
            "%s: a %d-byte request body did not parse as %s (%s); answered INVALID_ARGUMENT",
            method,
            request.size,
            request.message_type,
            request.error[:200],
        )
        return InvalidArgument(request.description)

    def _map_errors(self, method: str, behavior: Behavior, request_streaming: bool, streaming: bool) -> Behavior:
        short = method.rsplit("/", 1)[-1]
        observe = self.metrics.observe_stream if streaming else self.metrics.observe

        def refuse(request: Malformed) -> MeshserveError:
            return self._refuse(method, request)

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if request_streaming:
                    request = _parsed(request, refuse)
                elif type(request) is Malformed:
                    raise refuse(request)
                return await behavior(request, context)
            except MeshserveError as exc:
                code = exc.code
                if exc.trailers:
                    context.set_trailing_metadata(exc.trailers)
                await context.abort(exc.code, client_message(str(exc)))
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", method)
                await context.abort(grpc.StatusCode.INTERNAL, client_message(f"internal error in {short}: {exc!r}"))
            finally:
                observe(short, code, time.perf_counter() - start)

        return wrapped

    @staticmethod
    def _traced(method: str, behavior: Behavior, tracer: trace.Tracer) -> Behavior:
        name = method.lstrip("/")
        service, _, rpc = name.partition("/")
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc,
            "rpc.grpc.status_code": 0,
        }

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            if _unsampled(metadata.get("traceparent")):
                # The caller decided not to sample: no span, no context to attach; the gateway passes the header
                # on as it came, so the whole request stays unsampled.
                return await behavior(request, context)
            token = otel_context.attach(propagate.extract(metadata, getter=_GETTER))
            try:
                with tracer.start_as_current_span(
                    name,
                    kind=SpanKind.SERVER,
                    attributes=attributes,
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    try:
                        return await behavior(request, context)
                    except grpc.aio.AbortError:  # the error mapping (inside this layer) set the status
                        code = context.code() or grpc.StatusCode.UNKNOWN
                        span.set_attribute("rpc.grpc.status_code", code.value[0])
                        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))
                        raise
                    except asyncio.CancelledError:  # the client went away: not a fault of this server
                        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
                        raise
                    except Exception as exc:
                        span.set_status(Status(StatusCode.ERROR, repr(exc)))
                        raise
            finally:
                otel_context.detach(token)

        return traced

    @staticmethod
    def _recorded(method: str, behavior: Behavior, tracer: RecordingTracer) -> Behavior:
        name = method.lstrip("/")
        service, _, rpc = name.partition("/")
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc,
            "rpc.grpc.status_code": 0,
        }
        recorder, scope = tracer.recorder, tracer.scope

        async def recorded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            traceparent = tracestate = via = None
            for key, value in context.invocation_metadata() or ():
                if key == "traceparent":
                    traceparent = value
                elif key == "tracestate":
                    tracestate = value
                elif key == PARENT_HEADER:
                    via = value
            caller = parse_traceparent(traceparent) if isinstance(traceparent, str) else None
            start = time.time_ns()
            if caller is None:
                span = recorder.root(scope, name, SpanKind.SERVER, start, attributes)
            else:
                state = TraceState.from_header([tracestate]) if isinstance(tracestate, str) and tracestate else None
                span = RecordedSpan(
                    recorder,
                    scope,
                    name,
                    caller[0],
                    caller[1],
                    caller[2],
                    state,
                    SpanKind.SERVER,
                    start,
                    attributes,
                    None,
                    True,
                    _span_id(via),
                )
            token = enter(span)
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:  # the error mapping (inside this layer) set the status
                code = context.code() or grpc.StatusCode.UNKNOWN
                span.attributes["rpc.grpc.status_code"] = code.value[0]
                span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))
                raise
            except asyncio.CancelledError:  # the client went away: not a fault of this server
                span.attributes["rpc.grpc.status_code"] = grpc.StatusCode.CANCELLED.value[0]
                raise
            except Exception as exc:
                span.set_status(Status(StatusCode.ERROR, repr(exc)))
                raise
            finally:
                leave(token)
                span.end()

        return recorded


def _span_id(value: object) -> int:
    """A 16-hex-digit span id from a header, 0 when absent or malformed."""
    if not isinstance(value, str) or len(value) != 16:
        return 0
    try:
        return int(value, 16)
    except ValueError:
        return 0
