"""The chaos run's check of the feature store's state, not only of answers: Ingest load while Valkey is SIGKILLed
(every acknowledged event still in the aggregates, which equal those read before the crash), and a FLUSHALL on
purpose (every row of the wiped entities marked `features_store_reset`).

The probe talks to the feature service itself (its Unix socket, or its port, from stack.json), with the operator's
token for Ingest, and to Valkey with the stack's password for the FLUSHALL. Each event is its own entity
(`chaos-<tag>-<i>`), so an entity's count says whether its one event is there: 1 when applied, 0 when not, never
more (an Ingest whose answer was lost in the crash may have been applied: at least once, so not counted as lost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.chaos.faults import FaultError, read_state
from bench.chaos.phases import Check

SET = "fraud_v1"
COUNT = "user_count_24h"  # log1p of the events of the entity in the last 24 h
SUM = "user_sum_amount_24h"
RESET = "features_store_reset"
WRITERS = 4
BEFORE_KILL = 200  # acknowledged events before Valkey is killed
MOST_EVENTS = 600  # the writers stop here, or at the step's end
FLUSH_EVENTS = 40
BACK_WITHIN_S = 15.0  # the store answers again within this after a restart


@dataclass
class StoreVerdict:
    """What the store held after a fault, against what was acknowledged before it."""

    acknowledged: int = 0
    acknowledged_before: int = 0  # acknowledged before the fault (the entities snapshotted then)
    unanswered: int = 0  # Ingests that failed (their events may or may not be in: at least once)
    lost: list[int] = field(default_factory=list)  # acknowledged events not in the aggregates after the fault
    changed: int = 0  # entities snapshotted before the fault whose aggregates differ after it
    rows: int = 0  # rows read after a wipe
    marked: int = 0  # of them, marked features_store_reset
    error: str = ""  # the check could not be made (the store never came back, no feature service)

    def checks(self, wiped: bool) -> list[Check]:
        """The targets on the store's state: nothing acknowledged lost and the aggregates as before (a crash), or
        every affected row marked (a wipe on purpose)."""
        if self.error:
            return [Check("feature store checked", False, self.error)]
        if wiped:
            return [Check("every wiped row marked", self.rows > 0 and self.marked == self.rows, marked(self))]
        return [
            Check("0 acknowledged lost", not self.lost, f"{len(self.lost)} of {self.acknowledged}"),
            Check("aggregates as before", self.changed == 0, f"{self.changed} of {self.acknowledged_before} changed"),
        ]

    def describe(self, wiped: bool) -> str:
        if self.error:
            return f"store not checked: {self.error}"
        if wiped:
            return f"{marked(self)} rows marked {RESET}"
        return (
            f"{self.acknowledged} Ingests acknowledged ({self.acknowledged_before} before the kill), "
            f"{self.unanswered} unanswered; {len(self.lost)} acknowledged lost; "
            f"{self.changed} of {self.acknowledged_before} entities changed"
        )


def marked(v: StoreVerdict) -> str:
    return f"{v.marked} of {v.rows}"


# -- the counting (pure) -------------------------------------------------------------------------------------------


def lost_events(acknowledged: Iterable[int], counts: Mapping[int, float]) -> list[int]:
    """The acknowledged events whose entity's count (events, not log1p) does not hold them."""
    return sorted(i for i in acknowledged if counts.get(i, 0.0) < 0.5)


def changed_rows(before: np.ndarray, after: np.ndarray, rel: float = 1e-6) -> int:
    """Rows of two (rows, features) aggregate matrices that differ (beyond float noise)."""
    if before.shape != after.shape:
        return max(len(before), len(after))
    close = np.isclose(before, after, rtol=rel, atol=1e-6, equal_nan=True)
    return int((~close.all(axis=1)).sum())


def marked_rows(reasons: Sequence[str]) -> int:
    return sum(r == RESET for r in reasons)


# -- the probe -----------------------------------------------------------------------------------------------------


def feature_target(state: Mapping[str, Any]) -> str:
    """Where the feature service listens: its Unix socket in the stack's socket folder, else its row's address."""
    if state.get("sockets"):
        return f"unix:{state['sockets']}/feature.sock"
    for s in state.get("services", []):
        if s.get("name") == "feature" and s.get("address"):
            return str(s["address"])
    raise FaultError("stack.json names no feature service")


def row(entity: str, t: int, amount: float = 0.0) -> dict[str, Any]:
    return {
        "event_time": t,
        "user_id": entity,
        "merchant_id": "chaos-merchant",
        "device_id": entity,
        "amount": amount,
        "country": "us",
        "channel": "web",
        "mcc": "5411",
        "card_present": False,
        "account_age_days": 100.0,
    }


class FeatureProbe:
    """Ingest and Compute on the running stack's feature service; FLUSHALL on its Valkey."""

    def __init__(self, log_dir: Path, tag: str) -> None:
        from services.cli.stack.credentials import StackSecrets

        self.state = read_state(log_dir)
        secrets = StackSecrets(Path(str(self.state["secrets_dir"])))
        self.operator = (("authorization", f"Bearer {secrets.operator_token()}"),)
        self.password = secrets.valkey_password()
        self.target = feature_target(self.state)
        self.tag = tag
        # Events 3 h back, read as of now: their hour bucket lies wholly before the reading's (a window is the whole
        # buckets before the one holding the row's time), inside every window from 24 h up.
        self.t = int(time.time()) - 3 * 3600
        self.read_at = self.t + 3 * 3600

    def entity(self, i: int) -> str:
        return f"chaos-{self.tag}-{i}"

    async def ingest(self, stub: Any, i: int) -> bool:
        from services.feature.api import to_row
        from services.protos import feature_pb2 as pb

        request = pb.IngestRequest(feature_set=SET, events=[to_row(row(self.entity(i), self.t, float(i % 97)))])
        try:
            return bool((await stub.Ingest(request, timeout=5, metadata=self.operator)).ingested == 1)
        except grpc.aio.AioRpcError:
            return False

    async def aggregates(self, stub: Any, ids: Sequence[int]) -> tuple[np.ndarray, list[str], bool]:
        """(count and sum of each entity, each row's degraded reason, whether any row took defaults: store down)."""
        from services.feature.api import to_row
        from services.protos import feature_pb2 as pb

        rows = [to_row(row(self.entity(i), self.read_at)) for i in ids]
        reply = await stub.Compute(pb.ComputeRequest(feature_set=SET, rows=rows, budget_ms=5000), timeout=20)
        matrix = np.frombuffer(reply.features, dtype="<f4").reshape(reply.rows, reply.columns)
        names = list(reply.feature_names)
        values = np.expm1(matrix[:, [names.index(COUNT), names.index(SUM)]].astype(np.float64))
        down = any(f.degraded and not f.reason for f in reply.flags)
        return values, [f.reason for f in reply.flags], down

    async def settled(self, stub: Any, ids: Sequence[int]) -> tuple[np.ndarray, list[str]]:
        """The aggregates once the store answers (its rows not taking defaults); FaultError past BACK_WITHIN_S."""
        deadline = time.monotonic() + BACK_WITHIN_S
        while True:
            try:
                values, reasons, down = await self.aggregates(stub, ids)
                if not down:
                    return values, reasons
            except grpc.aio.AioRpcError as e:
                if time.monotonic() > deadline:
                    raise FaultError(f"Compute: {e.code().name}") from None
            if time.monotonic() > deadline:
                raise FaultError(f"the feature store did not answer within {BACK_WITHIN_S:.0f} s")
            await asyncio.sleep(0.25)

    def flushall(self) -> None:
        import redis

        host, port = str(self.state["valkey"]).rsplit(":", 1)
        client = redis.Redis(host=host, port=int(port), password=self.password or None)
        try:
            client.flushall()
        finally:
            client.close()


@dataclass
class IngestRun:
    """Writers ingesting one event per call, acknowledgements counted, until stopped or MOST_EVENTS."""

    probe: FeatureProbe
    stub: Any
    acked: set[int] = field(default_factory=set)
    unanswered: set[int] = field(default_factory=set)
    next_id: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._writer()) for _ in range(WRITERS)]

    async def _writer(self) -> None:
        while not self.stop.is_set() and self.next_id < MOST_EVENTS:
            i, self.next_id = self.next_id, self.next_id + 1
            if await self.probe.ingest(self.stub, i):
                self.acked.add(i)
            else:
                self.unanswered.add(i)
                await asyncio.sleep(0.1)  # while the store is down

    async def until_acknowledged(self, n: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < n:
            if time.monotonic() > deadline or all(t.done() for t in self.tasks):
                raise FaultError(f"only {len(self.acked)} of {n} Ingests acknowledged")
            await asyncio.sleep(0.01)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


class StoreCheck:
    """The two store checks as chaos steps: `kill_under_ingest` / `after_kill`, and `flush` / `after_flush`."""

    def __init__(self, log_dir: Path, tag: str) -> None:
        self.probe = FeatureProbe(log_dir, tag)
        self.channel = grpc.aio.insecure_channel(self.probe.target)
        from services.protos import feature_pb2_grpc as pb_grpc

        self.stub = pb_grpc.FeatureServiceStub(self.channel)
        self.run = IngestRun(self.probe, self.stub)
        self.before_ids: list[int] = []
        self.before = np.zeros((0, 2))
        self.verdict = StoreVerdict()

    async def kill_under_ingest(self, kill: Any) -> str:
        """Writers start; after BEFORE_KILL acknowledged events the aggregates of those are read, then `kill()`."""
        self.run.start()
        await self.run.until_acknowledged(BEFORE_KILL)
        self.before_ids = sorted(self.run.acked)
        self.before, _ = await self.probe.settled(self.stub, self.before_ids)
        return await kill()

    async def after_kill(self) -> StoreVerdict:
        """Writers stop; once the store answers again, every acknowledged event is looked for."""
        await self.run.finish()
        v = self.verdict
        v.acknowledged, v.acknowledged_before = len(self.run.acked), len(self.before_ids)
        v.unanswered = len(self.run.unanswered)
        try:
            ids = sorted(self.run.acked | self.run.unanswered)
            values, _ = await self.probe.settled(self.stub, ids)
        except FaultError as e:
            v.error = str(e)
            return v
        counts = dict(zip(ids, values[:, 0].tolist(), strict=True))
        seen_before = dict(zip(self.before_ids, self.before[:, 0].tolist(), strict=True))
        # lost after the crash, or (a fault of the store itself) not there even before it
        v.lost = sorted({*lost_events(self.run.acked, counts), *lost_events(self.before_ids, seen_before)})
        at = {i: k for k, i in enumerate(ids)}
        v.changed = changed_rows(self.before, values[[at[i] for i in self.before_ids]])
        return v

    async def flush(self) -> str:
        """FLUSH_EVENTS events ingested and acknowledged, then FLUSHALL on the stack's Valkey."""
        for i in range(FLUSH_EVENTS):
            if await self.probe.ingest(self.stub, i):
                self.run.acked.add(i)
        await asyncio.to_thread(self.probe.flushall)
        return f"FLUSHALL valkey after {len(self.run.acked)} acknowledged Ingests"

    async def after_flush(self) -> StoreVerdict:
        v = self.verdict
        v.acknowledged = len(self.run.acked)
        try:
            _, reasons = await self.probe.settled(self.stub, list(range(FLUSH_EVENTS)))
        except FaultError as e:
            v.error = str(e)
            return v
        v.rows, v.marked = len(reasons), marked_rows(reasons)
        return v

    async def close(self) -> None:
        await self.channel.close()
