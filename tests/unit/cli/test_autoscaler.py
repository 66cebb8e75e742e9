"""The local autoscaler against the real scaler service on loopback, in this process, with replicas that are names
in a list: a flip to active starts a replica without waiting for a poll, the metric scales the group up at once and
down after its window, a replica that fails to start is given up and retried at the next decision, StreamIsActive is
opened again when the scaler ends it, and every decision lands in autoscale.json and `meshserve status`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.cli.stack.autoscaler import AUTOSCALE_FILE, Autoscaler, read_autoscale
from services.cli.stack.layout import ModelReplica, StackLayout
from services.cli.stack.supervisor import StackError
from services.cli.stack.topology import StackTopology
from services.common.server import GrpcService
from services.scaler.__main__ import build
from services.scaler.handler import ScalerHandler
from tests.helpers.inprocess import serving_built
from tests.unit.scaler.conftest import Feed, scaler_settings, snapshot


class Replicas:
    """Replicas as names: `start` appends (or fails once for a name in `fail`), `stop` removes; what happened, in
    order, in `log`."""

    def __init__(self) -> None:
        self.running: list[str] = []
        self.log: list[str] = []
        self.fail: set[str] = set()

    async def start(self, replica: ModelReplica) -> None:
        await asyncio.sleep(0.01)
        if replica.name in self.fail:
            self.fail.discard(replica.name)
            self.log.append(f"failed {replica.name}")
            raise StackError(f"{replica.name} not SERVING after 1 s\nits log's last lines")
        self.running.append(replica.name)
        self.log.append(f"start {replica.name}")

    async def stop(self, replica: ModelReplica) -> None:
        self.running.remove(replica.name)
        self.log.append(f"stop {replica.name}")


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def layout_of(tmp_path: Path, group: str) -> StackLayout:
    path = tmp_path / "stack.yaml"
    path.write_text(f"stable: {{subset: v1, pinned_versions: {{fraud_mlp: [1]}}, {group}}}\n")
    return StackLayout.local(0, models_dir=tmp_path, mesh=True, topology=StackTopology.load(path), log_dir=tmp_path)


@pytest.fixture()
async def scaler() -> AsyncIterator[GrpcService]:
    async with serving_built(*build(scaler_settings(stale_after_s=30))) as service:
        yield service


@pytest.fixture()
async def feed(scaler: GrpcService) -> AsyncIterator[Feed]:
    handler: ScalerHandler = scaler.handler  # type: ignore[attr-defined]
    made = Feed(handler)
    yield made
    await made.end()


async def running(autoscaler: Autoscaler) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(autoscaler.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_activation_is_pushed_and_the_group_follows_its_demand(
    tmp_path: Path, scaler: GrpcService, feed: Feed
) -> None:
    layout = layout_of(
        tmp_path, "replicas: 0, min_replicas: 0, max_replicas: 3, target_per_replica: 2, scale_down_window_s: 2"
    )
    replicas, printed = Replicas(), list[str]()
    slow_poll = Autoscaler(layout, replicas, f"127.0.0.1:{scaler.port}", tmp_path, printed.append, poll_s=30)
    async for _ in running(slow_poll):
        await asyncio.sleep(0.3)  # StreamIsActive open, the first (idle) poll done
        await feed.send(snapshot("gw", fraud_mlp=(0, 1)))  # one request parked
        assert await until(lambda: replicas.running == ["model-v1-a"], 2.0) < 1.0  # pushed, not the 30 s poll
    (decision,) = slow_poll.decisions
    assert (decision.subset, decision.before, decision.after, decision.reason) == ("v1", 0, 1, "activated: demand 1")
    assert printed == ["autoscale v1: 0 -> 1 replicas (activated: demand 1)"]

    replicas = Replicas()
    autoscaler = Autoscaler(layout, replicas, f"127.0.0.1:{scaler.port}", tmp_path, printed.append, poll_s=0.05)
    async for _ in running(autoscaler):
        await until(lambda: replicas.running == ["model-v1-a"])
        await feed.send(snapshot("gw", fraud_mlp=(5, 0)))  # in flight, the mesh's pick (no subset)
        await until(lambda: len(replicas.running) == 3)
        up = autoscaler.decisions[-1]
        assert (up.before, up.after, up.reason) == (1, 3, "demand 5 > 1 x 2")
        assert replicas.running == ["model-v1-a", "model-v1-b", "model-v1-c"]
        await feed.send(snapshot("gw", fraud_mlp=(3, 0)))  # wants 2: only after a whole window of it
        held = time.monotonic()
        await until(lambda: len(replicas.running) == 2)
        assert time.monotonic() - held >= 1.5
        assert replicas.log[-1] == "stop model-v1-c"  # the highest slot goes first
        await feed.send(snapshot("gw"))
        await until(lambda: replicas.running == [], 5.0)
        assert autoscaler.decisions[-1].reason == "idle for 2 s"
    on_file = json.loads((tmp_path / AUTOSCALE_FILE).read_text())
    assert [(d["from"], d["to"]) for d in on_file["decisions"]] == [(0, 1), (1, 3), (3, 2), (2, 0)]
    assert on_file["groups"]["v1"]["replicas"] == 0 and on_file["groups"]["v1"]["model"] == "fraud_mlp"
    assert read_autoscale(tmp_path) == on_file


async def test_a_replica_that_does_not_start_is_given_up_and_tried_again(
    tmp_path: Path, scaler: GrpcService, feed: Feed
) -> None:
    layout = layout_of(tmp_path, "replicas: 0, min_replicas: 0, max_replicas: 2, scale_down_window_s: 2")
    replicas = Replicas()
    replicas.fail.add("model-v1-a")
    autoscaler = Autoscaler(layout, replicas, f"127.0.0.1:{scaler.port}", None, lambda _: None, poll_s=0.05)
    async for _ in running(autoscaler):
        await feed.send(snapshot("gw", fraud_mlp=(1, 0)))
        await until(lambda: replicas.running == ["model-v1-a"])
    assert replicas.log == ["failed model-v1-a", "start model-v1-a"]
    given_up, retried = autoscaler.decisions[1], autoscaler.decisions[2]
    assert (given_up.before, given_up.after) == (1, 0)
    assert given_up.reason == "gave up: model-v1-a not SERVING after 1 s; retrying at the next decision"
    assert (retried.before, retried.after, retried.reason) == (0, 1, "activated: demand 1")


async def test_stream_is_active_is_opened_again_when_the_scaler_ends_it(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, "replicas: 0, min_replicas: 0, max_replicas: 1, scale_down_window_s: 2")
    settings = scaler_settings(stale_after_s=30)
    replicas = Replicas()
    async with serving_built(*build(settings)) as first:
        port = first.port
        autoscaler = Autoscaler(layout, replicas, f"127.0.0.1:{port}", None, lambda _: None, poll_s=30)
        async for _ in running(autoscaler):
            await asyncio.sleep(0.3)  # StreamIsActive open on the first scaler
            first.handler.drain()  # type: ignore[attr-defined]  # ends every StreamIsActive stream, as on SIGTERM
            await first.server.stop(0)
            async with serving_built(*build(scaler_settings(stale_after_s=30, port=port))) as second:
                feed = Feed(second.handler)  # type: ignore[attr-defined]
                await feed.send(snapshot("gw", fraud_mlp=(0, 2)))
                # only StreamIsActive on the new scaler can say so: the next poll is 30 s away
                await until(lambda: replicas.running == ["model-v1-a"], 5.0)
                await feed.end()
