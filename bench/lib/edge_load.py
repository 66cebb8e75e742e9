"""Sensitive and general fraud transactions for the two-tier benchmark, and a closed loop that records which tier
answered each request."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from bench.lib.fraud_load import MODEL_INFER, transaction
from services.protos import inference_pb2 as pb

IDENTIFIERS = ("user_id", "merchant_id", "device_id")  # pipelines/fraud.yaml's sensitive inputs


def general(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    """The request with every identifier empty (a zero-length BYTES element): a general request."""
    for i, tensor in enumerate(request.inputs):
        if tensor.name in IDENTIFIERS:
            request.raw_input_contents[i] = (0).to_bytes(4, "little")
    return request


def stream(pipeline: str, sensitive: bool, t0: int, start: int) -> Callable[[], bytes]:
    """Serialized one-row transactions to `pipeline` numbered from `start`, every one new (no cache answers it):
    identifiers present (`sensitive`) or empty (general)."""
    counter = iter(range(start, 1 << 62))

    def next_request() -> bytes:
        request = transaction(next(counter), t0)
        request.model_name = pipeline
        return (request if sensitive else general(request)).SerializeToString()

    return next_request


@dataclass
class LoopRun:
    """One closed-loop run: the counted latencies (s); every answer's tier (warm-up included: the bytes a gateway
    counted cover it too); errors by code."""

    latencies: list[float] = field(default_factory=list)
    tiers: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    degraded: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def p50_ms(self) -> float | None:
        ordered = sorted(self.latencies)
        return ordered[len(ordered) // 2] * 1e3 if ordered else None


async def closed_loop(
    address: str, concurrency: int, seconds: float, next_request: Callable[[], bytes], warm_s: float = 1.0
) -> LoopRun:
    """`concurrency` workers back to back on one plaintext channel: `warm_s` not timed, then `seconds` timed."""
    run = LoopRun()
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(MODEL_INFER)

        async def call(counted: bool) -> None:
            start = time.perf_counter()
            try:
                reply = pb.ModelInferResponse.FromString(await infer(next_request(), timeout=10))
            except grpc.aio.AioRpcError as exc:
                run.errors[exc.code().name] += 1
                await asyncio.sleep(0.05)
                return
            if counted:
                run.latencies.append(time.perf_counter() - start)
            run.tiers[reply.parameters["meshserve_tier"].string_param or "single"] += 1
            if reply.parameters["degraded"].string_param:
                run.degraded[reply.parameters["degraded"].string_param] += 1

        async def worker(until: float, counted: bool) -> None:
            while time.perf_counter() < until:
                await call(counted)

        warm_until = time.perf_counter() + warm_s
        await asyncio.gather(*(worker(warm_until, False) for _ in range(concurrency)))
        began = time.perf_counter()
        await asyncio.gather(*(worker(began + seconds, True) for _ in range(concurrency)))
        run.seconds = time.perf_counter() - began
    return run
