"""Open-loop load for the chaos run: distinct fraud transactions sent on a fixed schedule over one grpc.aio channel,
whatever the answers, each with a deadline, each answer classified (bench.chaos.outcomes) as it comes back.

It shares the machine's cores with the stack it measures, so it stays lean: requests are serialized templates with
the transaction's ids patched in as bytes, the call is a raw-bytes unary call, and one response parse reads the
`degraded` and `model_version` parameters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc

from bench.chaos.outcomes import LOST, Outcome, answered, errored, has_pushback
from bench.chaos.phases import Sample
from bench.lib.fraud_load import MODEL_INFER, transaction
from services.cli.traffic import FIELDS
from services.protos import inference_pb2 as pb

TEMPLATES = 64  # distinct merchants, amounts, countries ... cycled under the per-request ids
ID_WIDTH = 12
PLACEHOLDER = b"#" * ID_WIDTH  # stands for the request's number in user_id and device_id
ID_FIELDS = ("user_id", "device_id")


def request_templates(n: int, t0: int) -> list[bytes]:
    """`n` serialized one-row fraud requests (no debug timings), each holding PLACEHOLDER in its ids."""
    out = []
    for j in range(n):
        request = transaction(j, t0)
        del request.parameters["debug"]
        for name in ID_FIELDS:
            prefix = name.removesuffix("_id").encode() + b"-"
            value = prefix + PLACEHOLDER
            request.raw_input_contents[FIELDS.index(name)] = len(value).to_bytes(4, "little") + value
        out.append(request.SerializeToString())
    return out


def request_bytes(templates: Sequence[bytes], i: int) -> bytes:
    """Request number `i`: a template with `i` as its ids (equal length, so the protobuf stays valid); no two
    numbers share a cache key."""
    return templates[i % len(templates)].replace(PLACEHOLDER, str(i).zfill(ID_WIDTH).encode())


def read_answer(reply: bytes) -> tuple[Outcome, str]:
    """An OK reply's outcome and the model version that answered."""
    params = pb.ModelInferResponse.FromString(reply).parameters
    degraded = params["degraded"].string_param if "degraded" in params else ""
    version = params["model_version"].string_param if "model_version" in params else ""
    return answered(degraded), version


class OpenLoop:
    """Sends request after request at `rate` per second (catching up at once when the loop was late), each as its
    own task, never waiting for answers; every answer lands in `samples`."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        templates: Sequence[bytes],
        deadline_s: float,
        origin: float,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._call = channel.unary_unary(MODEL_INFER)  # bytes in, bytes out
        self.templates = templates
        self.deadline_s = deadline_s
        self.origin = origin  # time.perf_counter() at the run's start: samples' times are relative to it
        self.metadata = tuple(metadata) or None
        self.samples: list[Sample] = []
        self.sent = 0
        self._rate = 0.0
        self._changed = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate: float) -> None:
        """From now on send `rate` requests a second (0: pause)."""
        self._rate = max(0.0, rate)
        self._changed.set()

    def now_s(self) -> float:
        return time.perf_counter() - self.origin

    async def run(self, stop: asyncio.Event) -> None:
        """The schedule: until `stop`, one request every 1/rate seconds."""
        due = time.perf_counter()
        while not stop.is_set():
            if self._rate <= 0:
                self._changed.clear()
                waits = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
                due = time.perf_counter()
                continue
            now = time.perf_counter()
            while due <= now and self._rate > 0:
                self._spawn(now - due)
                due += 1.0 / self._rate
            if self._changed.is_set():  # a new rate runs from now, not from the old schedule
                self._changed.clear()
                due = min(due, time.perf_counter() + 1.0 / max(self._rate, 1e-9))
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    def _spawn(self, late_s: float) -> None:
        i = self.sent
        self.sent += 1
        task = asyncio.create_task(self._send(request_bytes(self.templates, i), late_s))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _send(self, payload: bytes, late_s: float) -> None:
        t = time.perf_counter()
        version = ""
        try:
            reply = await self._call(payload, timeout=self.deadline_s, metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            elapsed = time.perf_counter() - t
            pushback = has_pushback(e.trailing_metadata())
            outcome = errored(e.code().name, pushback, elapsed, self.deadline_s, e.details() or "")
        else:
            elapsed = time.perf_counter() - t
            outcome, version = read_answer(reply)
        if outcome.kind == LOST:
            elapsed = self.deadline_s
        self.samples.append(Sample(t - self.origin, elapsed, outcome.kind, outcome.reason, version, late_s))

    async def drain(self) -> None:
        """Until every request sent has its answer (each has a deadline, so this ends)."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
