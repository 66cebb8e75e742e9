"""The ways into the scaler service: `DemandReporter`, a gateway's fire-and-forget stream of its demand, and
`ExternalScalerClient`, KEDA's external-scaler calls in domain types (for an autoscaler of our own)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence

import grpc

from services.common.errors import from_rpc_error
from services.protos import demand_pb2_grpc as demand_grpc
from services.protos import externalscaler_pb2 as keda_pb
from services.protos import externalscaler_pb2_grpc as keda_grpc
from services.scaler import converters
from services.scaler.domain import Demand, DemandKey, DemandSnapshot, MetricSpec, MetricValue

log = logging.getLogger(__name__)

SERVICE = "scaler service"  # how the errors the clients raise name the service
Headers = Sequence[tuple[str, str]]
# A reporter's channel tries to reconnect within a second of the scaler coming back (grpc's own backoff grows to
# 120 s, which would keep a restarted scaler blind to this gateway for minutes).
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class DemandReporter:
    """Streams one gateway's demand to the scaler until cancelled: the whole snapshot at once, again at most every
    `min_interval_s` after `changed` is set (changes in between are coalesced into one message), and every
    `heartbeat_s` without a change (so the scaler can tell a silent gateway from an idle one). A stream that fails
    or ends is opened again after a backoff (`backoff_s`, doubling up to `max_backoff_s` while streams fail or end
    within `heartbeat_s`). Nothing it does can fail
    or slow the caller: it runs as its own task, and a scaler that cannot be reached is logged once (WARNING), then
    again only when it is back (INFO).

    Example:
        changed = asyncio.Event()
        counts = {("fraud_mlp", ""): Demand(in_flight=3)}
        reporter = DemandReporter("meshserve-scaler:8005", "gateway-7f9c:1", lambda: counts, changed)
        task = asyncio.create_task(reporter.run())
        ...; changed.set()  # after each change of `counts`
        task.cancel()

    Args:
        target: the scaler's host:port.
        gateway: this gateway's id, unique per process (a reconnect under the same id replaces the old stream).
        snapshot: returns the current demand per (model, subset); keys with none may be left out.
        changed: set by the caller on every change; the reporter clears it when it takes a snapshot.
        heartbeat_s: the longest time between two messages.
        min_interval_s: the shortest time between two messages.
        backoff_s, max_backoff_s: the wait before reconnecting, doubled after each failure up to the maximum.
        metadata: headers sent on the stream (e.g. an unsampled traceparent, so the mesh does not trace it).
        options: channel arguments (keepalive, message limits) added to RECONNECT_OPTIONS.
    """

    def __init__(
        self,
        target: str,
        gateway: str,
        snapshot: Callable[[], Mapping[DemandKey, Demand]],
        changed: asyncio.Event,
        *,
        heartbeat_s: float = 1.0,
        min_interval_s: float = 0.02,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        metadata: Headers = (),
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.target = target
        self.gateway = gateway
        self.snapshot = snapshot
        self.changed = changed
        self.heartbeat_s = heartbeat_s
        self.min_interval_s = min_interval_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.metadata = tuple(metadata)
        self.options = tuple(options)
        self.sent = 0  # messages written, over every stream
        self.connected = False  # whether the current stream has carried a message

    async def run(self) -> None:
        """Report until cancelled; never raises otherwise."""
        channel = grpc.aio.insecure_channel(self.target, options=[*RECONNECT_OPTIONS, *self.options])
        stub = demand_grpc.DemandServiceStub(channel)
        loop = asyncio.get_running_loop()
        backoff = self.backoff_s
        quiet = False  # whether the scaler's being unreachable has been logged (and not cleared since)
        try:
            while True:
                started = loop.time()
                try:
                    await self._stream(stub)
                    why = "the scaler ended it"
                except grpc.aio.AioRpcError as exc:
                    why = f"{exc.code().name}: {exc.details()}"
                except Exception as exc:  # never let the reporter die (a write on a call that just ended, ...)
                    why = f"{type(exc).__name__}: {exc}"
                if self.connected:
                    quiet = False
                    if loop.time() - started >= self.heartbeat_s:  # a stream that worked: reconnect at once
                        backoff = self.backoff_s
                    log.info("demand stream to the scaler at %s ended (%s); reconnecting", self.target, why)
                elif not quiet:
                    log.warning("cannot report demand to the scaler at %s (%s); retrying quietly", self.target, why)
                    quiet = True
                else:
                    log.debug("scaler at %s still unreachable (%s)", self.target, why)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            await channel.close()

    async def _stream(self, stub: demand_grpc.DemandServiceStub) -> None:
        """One stream: a snapshot now, then on change (coalesced) or heartbeat, until the call ends; an error of
        the call raises."""
        call = stub.Report(metadata=self.metadata)
        call.add_done_callback(lambda _: self.changed.set())  # wakes the wait below when the scaler ends it
        loop = asyncio.get_running_loop()
        try:
            while not call.done():
                self.changed.clear()
                message = converters.snapshot_to_pb(DemandSnapshot(self.gateway, dict(self.snapshot())))
                await call.write(message)
                self.sent += 1
                if not self.connected:
                    self.connected = True
                    log.info("reporting demand to the scaler at %s", self.target)
                sent_at = loop.time()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.heartbeat_s):
                        await self.changed.wait()
                rest = self.min_interval_s - (loop.time() - sent_at)
                if rest > 0 and not call.done():
                    await asyncio.sleep(rest)
            await call  # the scaler's answer, or its error
        finally:
            call.cancel()


class ExternalScalerClient:
    """KEDA's external-scaler API over one grpc.aio channel, in domain types; each call raises the MeshserveError of
    the status it got (a metadata without `model`: InvalidArgument). `metadata` is a ScaledObject trigger's
    metadata block (`model`, optional `subset` and `targetPerReplica`).

    Example:
        client = ExternalScalerClient("127.0.0.1:8005")
        trigger = {"model": "fraud_mlp", "subset": "v2"}
        (spec,) = await client.metric_spec(trigger)
        (value,) = await client.metrics(trigger, spec.name)
        replicas = math.ceil(value.value / spec.target)
        async for active in client.stream_is_active(trigger): ...

    Args:
        target: the scaler's host:port.
        timeout_s: the deadline of each unary call.
        channel: a channel of the caller's (then `target` is not used).
    """

    def __init__(self, target: str, timeout_s: float = 5.0, channel: grpc.aio.Channel | None = None) -> None:
        self.channel = channel or grpc.aio.insecure_channel(target)
        self._stub = keda_grpc.ExternalScalerStub(self.channel)
        self.timeout_s = timeout_s

    async def metric_spec(self, metadata: Mapping[str, str]) -> list[MetricSpec]:
        try:
            response = await self._stub.GetMetricSpec(converters.ref_to_pb(metadata), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return converters.specs_from_pb(response)

    async def metrics(self, metadata: Mapping[str, str], metric_name: str) -> list[MetricValue]:
        request = keda_pb.GetMetricsRequest(scaledObjectRef=converters.ref_to_pb(metadata), metricName=metric_name)
        try:
            response = await self._stub.GetMetrics(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return converters.values_from_pb(response)

    async def is_active(self, metadata: Mapping[str, str]) -> bool:
        try:
            response = await self._stub.IsActive(converters.ref_to_pb(metadata), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return bool(response.result)

    async def stream_is_active(self, metadata: Mapping[str, str]) -> AsyncGenerator[bool, None]:
        """Whether the target is active now, then each change as it happens; ends when the scaler drains (the
        caller reconnects, as KEDA does). Leaving the iteration ends the stream."""
        call = self._stub.StreamIsActive(converters.ref_to_pb(metadata))
        try:
            while True:
                try:
                    response = await call.read()
                except grpc.aio.AioRpcError as exc:
                    raise from_rpc_error(SERVICE, exc) from exc
                if response is grpc.aio.EOF:
                    return
                yield bool(response.result)
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.channel.close()
