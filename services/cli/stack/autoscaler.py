"""The local stack's autoscaler: a client of the scaler service as KEDA is (StreamIsActive pushed, GetMetrics polled),
one loop per group that scales, starting replicas through the supervisor and changing Envoy's endpoints live."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from services.cli.stack.layout import ModelReplica, StackLayout
from services.cli.stack.scaling import Decision, Sample, ScalePolicy, Step, decide, trim
from services.cli.stack.supervisor import StackError
from services.cli.stack.topology import ModelGroup
from services.scaler.api import MODEL_KEY, TARGET_KEY, ExternalScalerClient

if TYPE_CHECKING:
    from services.cli.stack.up import StackRun
    from services.mesh import LocalMesh, MeshEndpoint

POLL_S = 0.5  # GetMetrics, as KEDA's pollingInterval (a flip to active is pushed, not polled)
AUTOSCALE_FILE = "autoscale.json"
KEPT_DECISIONS = 200
RECONNECT_S = (0.1, 2.0)  # StreamIsActive: first wait before reconnecting, and the longest
IN_ROTATION_S = 5.0  # a new endpoint's first health check by Envoy starts at once and takes milliseconds
# The channel to the scaler tries again within a second when the scaler restarts (grpc's own backoff grows to 120 s).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set or `timeout_s` passes. Not asyncio.wait_for: on Python 3.11 it drops a cancellation that
    arrives as the event is set, and the autoscaler, cancelled at that moment, then slept on for a whole poll."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


class ReplicaControl(Protocol):
    """What the autoscaler does to a replica: `StackReplicas` with processes and Envoy; a test's stand-in without."""

    async def start(self, replica: ModelReplica) -> None:
        """Until the replica serves and the mesh sends it calls; StackError when it gives the replica up."""

    async def stop(self, replica: ModelReplica) -> None:
        """Out of the mesh first (no new calls), then its process drains and exits."""


class GroupScaler:
    """One group's loop: StreamIsActive kept open (a flip to active wakes the loop at once), GetMetrics every
    `poll_s`, `decide` on the history, and each step applied through `control`.

    Args:
        group: the topology's group (its subset, bounds, target, window, the model it scales on).
        slots: its replica slots in order (started lowest first, stopped highest first).
        running: the names of its replicas serving now.
        client: the scaler's KEDA API.
        control: starts and stops replicas.
        record: called with every decision (and after every change of `running`, with None).
        notify: prints a line (a failure to reach the scaler or to change a replica, once until it changes).
        poll_s: the metric's poll interval.
    """

    def __init__(
        self,
        group: ModelGroup,
        slots: list[ModelReplica],
        running: list[str],
        client: ExternalScalerClient,
        control: ReplicaControl,
        record: Callable[[Decision | None], None],
        notify: Callable[[str], None] = print,
        poll_s: float = POLL_S,
    ) -> None:
        assert group.model is not None, "a group that scales names its model (topology validation)"
        self.group = group
        self.policy = ScalePolicy.of(group)
        self.slots = slots
        self.running = [s.name for s in slots if s.name in running]
        self.client = client
        self.control = control
        self.record = record
        self.notify = notify
        self.poll_s = poll_s
        self.trigger = {MODEL_KEY: group.model, TARGET_KEY: f"{group.target_per_replica:g}"}
        self.active = False
        self.wake = asyncio.Event()
        self.history: deque[Sample] = deque()
        self.metric: str | None = None
        self.problem = ""  # the last failure said (said once until it changes)
        self.acting: asyncio.Task[None] | None = None  # the step under way

    @property
    def subset(self) -> str:
        return self.group.subset

    @property
    def current(self) -> int:
        return len(self.running)

    async def run(self) -> None:
        """Until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.watch_activity())
            tasks.create_task(self.control_loop())

    async def watch_activity(self) -> None:
        """StreamIsActive, reconnected whenever it ends or fails (as KEDA does); each flip to active wakes the loop."""
        wait = RECONNECT_S[0]
        while True:
            try:
                async for active in self.client.stream_is_active(self.trigger):
                    wait = RECONNECT_S[0]
                    self.active = active
                    if active:
                        self.wake.set()
            except Exception as exc:  # the scaler restarting, unreachable, ...: reconnect after a backoff
                self.say(f"StreamIsActive: {exc}")
            await asyncio.sleep(wait)
            wait = min(wait * 2, RECONNECT_S[1])

    async def control_loop(self) -> None:
        """Sample, and decide when no step is under way; a step runs as its own task, so that the sampling goes on
        while replicas start (a gap in the history would make the window look idle)."""
        try:
            while True:
                await wait_event(self.wake, self.poll_s)
                self.wake.clear()
                sample = await self.observe()
                if sample is None:
                    continue
                self.history.append(sample)
                trim(self.history, self.policy.window_s)
                if self.busy:
                    continue
                step = decide(self.current, self.history, self.policy)
                if step is not None:
                    self.acting = asyncio.create_task(self.act(step))
        finally:
            if self.acting is not None:
                self.acting.cancel()
                await asyncio.gather(self.acting, return_exceptions=True)

    @property
    def busy(self) -> bool:
        """Whether a step is under way (replicas starting, or leaving and draining)."""
        return self.acting is not None and not self.acting.done()

    async def act(self, step: Step) -> None:
        """Apply a step, then wake the loop for the next decision at once."""
        try:
            await self.apply(step)
        except Exception as exc:  # Envoy slow to take endpoints, ...: said, and the next decision retries
            self.say(f"{type(exc).__name__}: {exc}")
        finally:
            self.wake.set()
            self.record(None)  # saved, and waiters told that the step is over

    async def observe(self) -> Sample | None:
        """The demand now from GetMetrics (the metric's name from GetMetricSpec, asked once per connection); when
        the scaler cannot answer, only what StreamIsActive said (None when it said inactive: no decision)."""
        now = time.monotonic()
        try:
            if self.metric is None:
                (spec,) = await self.client.metric_spec(self.trigger)
                self.metric = spec.name
            (value,) = await self.client.metrics(self.trigger, self.metric)
        except Exception as exc:
            self.metric = None
            self.say(f"GetMetrics: {exc}")
            return Sample(now, 0.0, True) if self.active else None
        self.problem = ""
        return Sample(now, value.value, self.active or value.value > 0)

    async def apply(self, step: Step) -> None:
        """Record the decision, then start the lowest free slots together, or stop the highest running ones."""
        before = self.current
        self.record(Decision(time.time(), self.subset, before, step.to, step.reason))
        if step.to > before:
            free = [s for s in self.slots if s.name not in self.running][: step.to - before]
            outcomes = await asyncio.gather(*(self.start(s) for s in free))
            lost = [why for why in outcomes if why]
            if lost:
                reason = f"gave up: {'; '.join(lost)}; retrying at the next decision"
                self.record(Decision(time.time(), self.subset, step.to, self.current, reason))
        else:
            running = [s for s in self.slots if s.name in self.running]
            await asyncio.gather(*(self.stop(s) for s in running[step.to - before :]))

    async def start(self, replica: ModelReplica) -> str:
        """Start one replica; "" once it serves, else why it was given up."""
        try:
            await self.control.start(replica)
        except StackError as exc:
            return str(exc).splitlines()[0]
        self.running.append(replica.name)
        self.running.sort(key=[s.name for s in self.slots].index)
        self.record(None)
        return ""

    async def stop(self, replica: ModelReplica) -> None:
        self.running.remove(replica.name)
        self.record(None)
        await self.control.stop(replica)

    def say(self, problem: str) -> None:
        """A failure, printed once until another one comes."""
        if problem != self.problem:
            self.problem = problem
            self.notify(f"autoscale {self.subset}: {problem}")

    def status(self) -> dict[str, Any]:
        g = self.group
        return {
            "model": g.model,
            "replicas": self.current,
            "min": g.min_replicas,
            "max": g.max_replicas,
            "target_per_replica": g.target_per_replica,
            "scale_down_window_s": g.scale_down_window_s,
            "running": list(self.running),
            "active": self.active,
            "demand": self.history[-1].demand if self.history else None,
            "idle_s": round(self.idle_s(), 1),
            "problem": self.problem,
        }

    def idle_s(self) -> float:
        """Seconds since the group last saw demand (or since it started observing, if it never did)."""
        if not self.history:
            return 0.0
        busy = [s.at for s in self.history if s.demand > 0 or s.active]
        return self.history[-1].at - (busy[-1] if busy else self.history[0].at)


class Autoscaler:
    """Every group of the stack that scales, on one scaler client; the decisions as `<log_dir>/autoscale.json` and
    as lines through `notify`.

    Example:
        autoscaler = Autoscaler(layout, StackReplicas(run, mesh), "127.0.0.1:8005", log_dir, print)
        task = asyncio.create_task(autoscaler.run())
        await autoscaler.wait_for("v2", lambda n: n == 0, timeout_s=60)

    Args:
        layout: the stack's layout (its groups that scale, their slots and the replicas running at start).
        control: starts and stops replicas.
        scaler: the scaler service's host:port.
        log_dir: where autoscale.json goes (None: nowhere).
        notify: prints a line.
        poll_s: GetMetrics' interval.
    """

    def __init__(
        self,
        layout: StackLayout,
        control: ReplicaControl,
        scaler: str,
        log_dir: Path | None,
        notify: Callable[[str], None],
        poll_s: float = POLL_S,
    ) -> None:
        self.client = ExternalScalerClient(scaler, channel=grpc.aio.insecure_channel(scaler, options=CHANNEL_OPTIONS))
        self.path = log_dir / AUTOSCALE_FILE if log_dir is not None else None
        self.notify = notify
        self.decisions: deque[Decision] = deque(maxlen=KEPT_DECISIONS)
        self.changed = asyncio.Event()
        initial = [r.name for r in layout.initial_replicas]
        self.groups = {
            g.subset: GroupScaler(g, layout.slots(g.subset), initial, self.client, control, self.record, notify, poll_s)
            for g in layout.autoscaled
        }
        self.save()

    async def run(self) -> None:
        """Every group's loop, until cancelled."""
        try:
            async with asyncio.TaskGroup() as tasks:
                for group in self.groups.values():
                    tasks.create_task(group.run())
        finally:
            await self.client.close()

    def record(self, decision: Decision | None) -> None:
        """Keep, print and save a decision (None: only a replica count changed)."""
        if decision is not None:
            self.decisions.append(decision)
            self.notify(f"autoscale {decision.describe()}")
        self.save()
        self.changed.set()

    def current(self, subset: str) -> int:
        return self.groups[subset].current

    async def wait_for(self, subset: str, done: Callable[[int], bool], timeout_s: float) -> bool:
        """Until `done(replica count of subset)` with no step under way (a replica that leaves has exited);
        False after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        group = self.groups[subset]
        while not done(group.current) or group.busy:
            self.changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                return False
            await wait_event(self.changed, left)
        return True

    def snapshot(self) -> dict[str, Any]:
        return {
            "groups": {subset: group.status() for subset, group in self.groups.items()},
            "decisions": [d.to_dict() for d in self.decisions],
        }

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot(), indent=2))
        tmp.replace(self.path)


def read_autoscale(log_dir: Path) -> dict[str, Any] | None:
    """The running stack's autoscale.json, or None when there is none (no group scales, or it is half written)."""
    try:
        data = json.loads((log_dir / AUTOSCALE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class StackReplicas:
    """The model replicas of a running `meshserve up`: processes under its supervisor (listed in stack.json) and
    endpoints of the mesh's dynamic `model` service (Envoy's file-based EDS).

    Start: spawn, wait for gRPC health SERVING (a crash meanwhile is restarted by the supervisor) up to
    `start_timeout_s`, then into the endpoints, then until Envoy's health check counts it. Stop: out of the endpoints
    first (Envoy sends it no new call; calls in flight finish), then SIGTERM, which the model service answers by
    draining what it still runs.
    """

    def __init__(self, run: StackRun, mesh: LocalMesh, start_timeout_s: float = 60.0) -> None:
        self.run = run
        self.mesh = mesh
        self.start_timeout_s = start_timeout_s
        self.serving = {r.name: r for r in run.layout.initial_replicas}
        self._lock = asyncio.Lock()

    async def start(self, replica: ModelReplica) -> None:
        from services.cli.stack.mesh import out_of_rotation

        run = self.run
        assert run.supervisor is not None
        spec = run.replica_spec(replica)
        run.specs.append(spec)
        try:
            managed = await run.supervisor.add(spec)
            await run.supervisor.wait_healthy(managed, self.start_timeout_s)
        except (StackError, ValueError) as exc:
            await self._forget(replica)
            if "not SERVING after" in str(exc):
                log = run.log_dir / f"{replica.name}.log"
                exc = StackError(f"{replica.name} not SERVING after {self.start_timeout_s:g} s (see {log})")
            raise StackError(str(exc).splitlines()[0]) from None
        self.serving[replica.name] = replica
        await self._publish()
        address = {"model": {run.layout.replica_address(replica)}}
        deadline = time.monotonic() + IN_ROTATION_S
        for _ in range(int(IN_ROTATION_S / 0.05)):  # Envoy's first health check of it: polled, nothing to wait on
            if not await asyncio.to_thread(out_of_rotation, run.layout.admin, address) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)

    async def stop(self, replica: ModelReplica) -> None:
        self.serving.pop(replica.name, None)
        await self._publish()
        await self._forget(replica)

    async def _forget(self, replica: ModelReplica) -> None:
        """Retire its process (draining it) and drop it from stack.json and the tracing peers."""
        run = self.run
        assert run.supervisor is not None
        run.specs[:] = [s for s in run.specs if s.name != replica.name]
        run.save_state()
        await run.supervisor.retire(replica.name)
        run.save_state()

    async def _publish(self) -> None:
        """The model service's endpoints: every serving replica, labelled with its subset (one writer at a time)."""
        from services.mesh import MeshEndpoint

        layout = self.run.layout
        endpoints: list[MeshEndpoint] = [
            MeshEndpoint(address=layout.replica_address(r), labels={"version": r.subset})
            for r in layout.replicas
            if r.name in self.serving
        ]
        async with self._lock:
            await asyncio.to_thread(self.mesh.set_endpoints, "model", endpoints, wait=True, timeout=5.0)
