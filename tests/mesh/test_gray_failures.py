"""A gray failure through the real Envoy and the shipped istio/: a model replica that accepts calls and never answers
them (health checks included) is routed around, by per-try timeouts retried on another replica and then by outlier
detection, without one call failing within the gateway's model budget."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest

from services.mesh import LocalMesh
from tests.mesh.aio_replicas import AioReplica, Freezable
from tests.mesh.conftest import MeshFactory
from tests.mesh.fakes import INFER

V1 = "outbound|grpc|v1|model"
MODEL_BUDGET_S = 0.5  # the pipelines' model budget: how long the gateway waits for a model call (pipelines/*.yaml)


@pytest.fixture()
def aio_replicas() -> Iterator[list[AioReplica]]:
    started: list[AioReplica] = []
    yield started
    for replica in started:
        replica.stop()


async def open_loop(mesh: LocalMesh, rate: float, seconds: float, freeze: Freezable, freeze_at: float) -> Counter[str]:
    """Calls at `rate` per second for `seconds`, each with the model budget as its deadline; `freeze` freezes at
    `freeze_at` s. The calls' status codes."""
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(mesh.address("model")) as channel:
        call = channel.unary_unary(INFER)

        async def one() -> None:
            try:
                await call(b"", timeout=MODEL_BUDGET_S)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as e:
                codes[e.code().name] += 1

        start = time.monotonic()
        calls = []
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
            if not freeze.frozen.is_set() and time.monotonic() - start >= freeze_at:
                freeze.freeze()
            calls.append(asyncio.create_task(one()))
        await asyncio.gather(*calls)
    return codes


def test_a_frozen_model_replica_is_routed_around_with_no_call_failed(
    make_mesh: MeshFactory, aio_replicas: list[AioReplica]
) -> None:
    freezes = [Freezable() for _ in range(3)]
    replicas = [AioReplica(f) for f in freezes]
    aio_replicas.extend(replicas)
    frozen = replicas[0]
    # no active health checks: the mesh's reaction to calls alone (a check would also find it, in seconds)
    mesh = make_mesh([(frozen.address, "v1"), (replicas[1].address, "v1"), (replicas[2].address, "v2")], None)
    codes = asyncio.run(open_loop(mesh, rate=100, seconds=3.0, freeze=freezes[0], freeze_at=1.0))
    assert codes == Counter({"OK": 300}), codes  # every call answered within the model budget
    stats = mesh.admin.stats("^" + re.escape(f"cluster.{V1}."))
    timed_out = stats[f"cluster.{V1}.upstream_rq_per_try_timeout"]
    assert timed_out >= 1  # calls it held were given up on after the per-try timeout ...
    assert stats[f"cluster.{V1}.upstream_rq_retry"] >= timed_out  # ... and each retried on another replica
    assert stats[f"cluster.{V1}.outlier_detection.ejections_active"] == 1  # then it left the rotation
    assert "failed_outlier_check" in mesh.admin.hosts(V1)[frozen.address]["health_flags"]
    held = frozen.received[INFER]
    assert replicas[1].received[INFER] > held  # after its ejection, its share went to the others ...
    answered_after = replicas[1].received[INFER]
    codes = asyncio.run(open_loop(mesh, rate=100, seconds=0.5, freeze=freezes[0], freeze_at=0))
    assert codes == Counter({"OK": 50}) and frozen.received[INFER] == held  # ... and stays away from it
    assert replicas[1].received[INFER] > answered_after
