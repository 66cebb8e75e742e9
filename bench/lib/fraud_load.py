"""Fraud transactions as requests, and closed-loop load with them on the gateway, its pipelines and its metrics."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.serving import ROOT
from services.cli.traffic import FIELDS
from services.common.internal_auth import auth_headers
from services.protos import inference_pb2 as pb

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def transaction_values(i: int, t0: int) -> dict[str, np.ndarray | str]:
    """The fields of one fraud transaction; equal `i` gives equal values."""
    rng = np.random.default_rng(i)
    values = {
        "event_time": np.array([[t0 + i % 3600]], np.int64),
        "user_id": f"user-{i}",
        "merchant_id": f"merchant-{rng.integers(500)}",
        "device_id": f"device-{i}",
        "amount": np.array([[rng.gamma(2.0, 35.0)]], np.float32),
        "country": ["US", "GB", "DE", "FR", "BR"][int(rng.integers(5))],
        "channel": ["web", "app", "pos", "moto"][int(rng.integers(4))],
        "mcc": ["5411", "5812", "5999", "4111"][int(rng.integers(4))],
        "card_present": np.array([[bool(rng.integers(2))]]),
        "account_age_days": np.array([[rng.uniform(1, 3000)]], np.float32),
    }
    return values


def transaction(i: int, t0: int) -> pb.ModelInferRequest:
    """A one-row fraud request; equal `i` gives byte-identical requests."""
    values = transaction_values(i, t0)
    request = pb.ModelInferRequest(model_name="fraud")
    request.parameters["debug"].bool_param = True
    for name in FIELDS:
        value = values[name]
        if isinstance(value, str):
            data = value.encode()
            request.inputs.add(name=name, datatype="BYTES", shape=[1, 1])
            request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
        else:
            datatype = {"i": "INT64", "f": "FP32", "b": "BOOL"}[value.dtype.kind]
            request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
            request.raw_input_contents.append(value.tobytes())
    return request


def miss_stream(t0: int, start: int) -> Callable[[], bytes]:
    """Serialized transactions numbered from `start` on: every request new, so no cache answers one."""
    counter = iter(range(start, 1 << 62))
    return lambda: transaction(next(counter), t0).SerializeToString()


@dataclass
class Run:
    """One closed-loop run: latencies (s), the debug stage timings (ms), cache outcomes and errors by code."""

    latencies: list[float] = field(default_factory=list)
    batches: dict[str, float] = field(default_factory=dict)  # stage -> mean requests per downstream call
    stages: dict[str, list[float]] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else float("nan")

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def add_answer(self, response: pb.ModelInferResponse, elapsed: float) -> None:
        """Count one answer: its latency, its cache outcome and each stage's time (and what lies outside them)."""
        self.latencies.append(elapsed)
        params = response.parameters
        cache = params["cache"].string_param
        self.cache[cache] = self.cache.get(cache, 0) + 1
        stages = {k[6:-3]: v.double_param for k, v in params.items() if k.startswith("stage_")}
        stages["client_minus_stages"] = elapsed * 1e3 - sum(
            v for k, v in stages.items() if k not in ("total", "gateway")
        )
        for name, ms in stages.items():
            self.stages.setdefault(name, []).append(ms)


async def load(
    address: str,
    concurrency: int,
    seconds: float,
    next_request: Callable[[], bytes],
    warm_s: float = 1.0,
    on_start: Callable[[], object] | None = None,
) -> Run:
    """Closed loop: `concurrency` workers send back to back for `seconds` over one channel, after `warm_s`
    of the same stream that is not counted (steady state: connections up, caches holding the hot keys).
    `on_start` is called as the counted part begins (to read counters over exactly that part).

    Requests come serialized (the Zipf pool once, up front), so the client spends its CPU on the calls,
    not on protobuf encoding: on a 2-core machine the client shares the cores with the servers.
    """
    run = Run()
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(MODEL_INFER)  # bytes in, bytes out
        warm_until = time.perf_counter() + warm_s
        while time.perf_counter() < warm_until:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await infer(next_request(), timeout=10)
        if on_start is not None:
            on_start()
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                request = next_request()
                start = time.perf_counter()
                try:
                    response = pb.ModelInferResponse.FromString(await infer(request, timeout=10))
                except grpc.aio.AioRpcError as exc:
                    run.errors[exc.code().name] = run.errors.get(exc.code().name, 0) + 1
                    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # shed: honour the retry hint
                        pushback = dict(exc.trailing_metadata() or ()).get("grpc-retry-pushback-ms", "50")
                        await asyncio.sleep(int(pushback) / 1e3)
                    continue
                run.add_answer(response, time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - began
    return run


def changed_pipelines(folder: Path, **sections: dict) -> Path:
    """A copy of the pipelines folder with sections of fraud.yaml changed (e.g. cache={"enabled": False})."""
    shutil.copytree(ROOT / "pipelines", folder)
    spec = yaml.safe_load((folder / "fraud.yaml").read_text())
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    (folder / "fraud.yaml").write_text(yaml.safe_dump(spec))
    return folder


def gateway_metric_samples(metrics_port: int, token: str = "") -> list:
    """Every sample the gateway's /metrics shows now (with the stack's internal `token`, which its /metrics needs)."""
    request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/metrics", headers=auth_headers(token))
    with urllib.request.urlopen(request, timeout=5) as reply:
        text = reply.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
