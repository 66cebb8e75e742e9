"""The ingress's adaptive concurrency limit and its timeouts through the real Envoy: shipped off, it passes every call;
on (istio/variants/ingress-adaptive-on.yaml, or its runtime key set live through the admin interface), past what a
slow gateway serves it refuses at once as RESOURCE_EXHAUSTED with a pushback, and admits again once the overload is
over; the route timeout reaches the client as DEADLINE_EXCEEDED."""

from __future__ import annotations

import asyncio
import copy
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from services.mesh import LocalMesh
from tests.mesh.aio_replicas import HEALTH_CHECK, SERVING, AioReplica, Capacity
from tests.mesh.conftest import ISTIO, MeshFactory
from tests.mesh.fakes import INFER

CONTROLLER = "http.ingress.adaptive_concurrency.gradient_controller."
ON = ISTIO / "variants" / "ingress-adaptive-on.yaml"
FLAG = "meshserve.ingress.adaptive_concurrency_enabled"
PUSHBACK_MS = "50"
REFUSAL = (
    "meshserve ingress: more requests in flight than the gateways serve at their healthy latency "
    "(adaptive concurrency limit); retry after 50 ms"
)


@pytest.fixture()
def aio_replicas() -> Iterator[list[AioReplica]]:
    started: list[AioReplica] = []
    yield started
    for replica in started:
        replica.stop()


def ingress(mesh: LocalMesh) -> str:
    assert mesh.ingress_address is not None
    return mesh.ingress_address


def controller(mesh: LocalMesh, name: str) -> int:
    return mesh.admin.stat(CONTROLLER + name)


def wait_for(what: str, condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


Outcome = tuple[grpc.StatusCode, dict[str, str], str]


async def closed_loop(address: str, workers: int, seconds: float) -> list[Outcome]:
    """`workers` callers each calling again as soon as answered (after the pushback when refused), for `seconds`."""
    outcomes: list[Outcome] = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(INFER)
        end = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < end:
                try:
                    await call(b"", timeout=20)
                    outcomes.append((grpc.StatusCode.OK, {}, ""))
                except grpc.aio.AioRpcError as e:
                    trailers = {k: str(v) for k, v in e.trailing_metadata() or ()}
                    outcomes.append((e.code(), trailers, e.details() or ""))
                    await asyncio.sleep(int(trailers.get("grpc-retry-pushback-ms", "50")) / 1000)

        await asyncio.gather(*(worker() for _ in range(workers)))
    return outcomes


def test_past_what_the_gateways_serve_the_ingress_refuses_with_pushback_and_admits_again_after(
    make_mesh: MeshFactory, aio_replicas: list[AioReplica]
) -> None:
    slow = AioReplica(Capacity(slots=2, service_s=0.05))  # 40 calls/s at best; queues past 2 in flight
    aio_replicas.append(slow)
    mesh = make_mesh([], istio=[ISTIO, ON], gateway=slow.address, authenticate=False)
    address = ingress(mesh)
    # the controller's first minRTT: 50 calls at light load
    assert all(code == grpc.StatusCode.OK for code, _, _ in asyncio.run(closed_loop(address, 2, 1.5)))
    wait_for("the minRTT measured", lambda: controller(mesh, "min_rtt_calculation_active") == 0)
    assert controller(mesh, "min_rtt_msecs") >= 50
    admitted_before = slow.received[INFER]

    overload = asyncio.run(closed_loop(address, 48, 2.0))
    codes = Counter(code for code, _, _ in overload)
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes  # refused, nothing failed
    refused = [(trailers, details) for code, trailers, details in overload if code != grpc.StatusCode.OK]
    assert all(t.get("grpc-retry-pushback-ms") == PUSHBACK_MS and d == REFUSAL for t, d in refused), refused[:3]
    assert slow.received[INFER] - admitted_before == codes[grpc.StatusCode.OK]  # a refusal never reached it
    assert controller(mesh, "rq_blocked") == len(refused)
    assert controller(mesh, "concurrency_limit") < 48  # the limit came down to what the gateway serves

    # light load again: healthy latency grows the limit back, and a burst past the overload's limit is admitted
    deadline = time.monotonic() + 10
    while controller(mesh, "concurrency_limit") < 24:
        assert time.monotonic() < deadline, mesh.admin.stats("adaptive_concurrency")
        assert all(code == grpc.StatusCode.OK for code, _, _ in asyncio.run(closed_loop(address, 2, 0.3)))
    burst = asyncio.run(closed_loop(address, 16, 0.5))
    assert Counter(code for code, _, _ in burst) == Counter({grpc.StatusCode.OK: len(burst)})


def codes_of(outcomes: list[Outcome]) -> Counter[grpc.StatusCode]:
    return Counter(code for code, _, _ in outcomes)


def test_shipped_off_the_filter_passes_every_call_until_its_runtime_key_turns_it_on_live(
    make_mesh: MeshFactory, aio_replicas: list[AioReplica]
) -> None:
    slow = AioReplica(Capacity(slots=2, service_s=0.05))
    aio_replicas.append(slow)
    mesh = make_mesh([], gateway=slow.address, authenticate=False)  # istio/ as shipped
    address = ingress(mesh)
    # off: 48 callers queue at the gateway (latency ~1.2 s, ~24x the light one) and nothing is refused or measured
    assert set(codes_of(asyncio.run(closed_loop(address, 48, 1.5)))) == {grpc.StatusCode.OK}
    assert controller(mesh, "rq_blocked") == 0 and controller(mesh, "min_rtt_calculation_active") == 1

    mesh.admin.set_runtime({FLAG: "true"})  # on, live: it measures the minRTT over the next calls, then limits
    assert set(codes_of(asyncio.run(closed_loop(address, 2, 1.5)))) == {grpc.StatusCode.OK}
    wait_for("the minRTT measured", lambda: controller(mesh, "min_rtt_calculation_active") == 0)
    overload = asyncio.run(closed_loop(address, 48, 2.0))
    assert set(codes_of(overload)) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes_of(overload)
    assert all(d == REFUSAL for code, _, d in overload if code != grpc.StatusCode.OK)  # the same mapped refusal
    blocked = controller(mesh, "rq_blocked")
    assert blocked == codes_of(overload)[grpc.StatusCode.RESOURCE_EXHAUSTED]

    mesh.admin.set_runtime({FLAG: "false"})  # off again: the same overload passes
    assert set(codes_of(asyncio.run(closed_loop(address, 48, 1.5)))) == {grpc.StatusCode.OK}
    assert controller(mesh, "rq_blocked") == blocked


async def hold(method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Health checks answered at once, every other call held for a minute."""
    if method != HEALTH_CHECK:
        await asyncio.sleep(60)
    return SERVING


PER_TRY = "x-test-per-try"


def short_ingress_routes(tmp_path: Path) -> Path:
    """The ingress VirtualService of istio/ with a 300 ms route timeout; calls with the header PER_TRY take a route
    of two 200 ms attempts within a 5 s timeout instead."""
    docs = list(yaml.safe_load_all((ISTIO / "virtualservices.yaml").read_text()))
    (service,) = [d for d in docs if d["metadata"]["name"] == "ingress"]
    (route,) = service["spec"]["http"]
    route["timeout"] = "300ms"
    per_try = copy.deepcopy(route)
    per_try.update(name="per-try", match=[{"headers": {PER_TRY: {"exact": "1"}}}], timeout="5s")
    per_try["retries"].update(attempts=1, perTryTimeout="200ms")
    service["spec"]["http"] = [per_try, route]
    path = tmp_path / "ingress-routes.yaml"
    path.write_text(yaml.safe_dump(service))
    return path


INGRESS_ANSWER = (
    "meshserve ingress: the gateway did not answer within the call's time (the route's timeout or the call's deadline)"
)


def test_the_route_timeout_reaches_the_client_as_deadline_exceeded(
    make_mesh: MeshFactory, aio_replicas: list[AioReplica], tmp_path: Path
) -> None:
    stuck = AioReplica(hold)
    aio_replicas.append(stuck)
    mesh = make_mesh([], istio=[ISTIO, short_ingress_routes(tmp_path)], gateway=stuck.address, authenticate=False)
    errors: dict[str, Any] = {}
    with grpc.insecure_channel(ingress(mesh)) as channel:
        call = channel.unary_unary(INFER)
        for name, metadata, timeout in (
            ("attempts timed out", [(PER_TRY, "1")], None),  # Envoy's 504: its last attempt's time is up
            ("route timeout", [], None),  # no deadline: the route's timeout bounds the call
            ("deadline capped", [], 10.0),  # a deadline far off: the route's timeout caps it
        ):
            with pytest.raises(grpc.RpcError) as failed:
                call(b"", metadata=metadata, timeout=timeout)
            errors[name] = failed.value
    assert {name: e.code() for name, e in errors.items()} == dict.fromkeys(errors, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert errors["attempts timed out"].details() == INGRESS_ANSWER  # not the UNAVAILABLE of the 504
    assert mesh.admin.stat("cluster.outbound|grpc||gateway.upstream_rq_per_try_timeout") >= 2
    # the stream's bound: Envoy's answer, or the gateway's own where the deadline Envoy passes on ends it first
    for name in ("route timeout", "deadline capped"):
        assert errors[name].details() in (INGRESS_ANSWER, "Deadline Exceeded"), name
    assert stuck.received[INFER] >= 4  # every call reached the gateway, which never answered
