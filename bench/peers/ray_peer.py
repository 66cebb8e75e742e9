"""Runs inside Ray Serve's own virtualenv: the fraud pipeline's three stages as one Ray Serve 2.60 application.

The peer of meshserve's gateway in `python -m bench.peers.pipeline`. Its ingress deployment speaks the v2
`GRPCInferenceService` through Ray Serve's gRPC ingress (the repository's generated servicer functions) and does
per request what the gateway does: a cache lookup in Redis by a digest of the request, on a miss the feature
deployment then the model deployment, and the cache store off the critical path. The feature deployment runs
meshserve's own `FeatureHandler.compute` (fraud_v1's FeatureSet against the same Valkey) and the model
deployment the same TorchScript file, each behind `@serve.batch`: concurrent requests become one Compute and
one forward pass. Every deployment takes a fraction of a CPU, so that Ray's scheduler fits them on 2 cores.

    python -m bench.peers.ray_peer --grpc-port P --http-port H --redis-url URL --model-file FILE --temp-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import yaml
from ray import serve
from ray.serve.handle import DeploymentHandle
from redis.exceptions import RedisError

from services.cache.keys import request_digest, versioned_key
from services.common.redis import connect
from services.common.tensor_codec import decode_request_inputs
from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings
from services.protos import inference_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SERVICER = "services.protos.inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"
CPUS = 2  # the machine's cores: Ray's scheduler hands out no more
STAGE_CPUS = 0.5  # per deployment (ingress, features, model): 1.5 of the 2 (Ray's own actors reserve none)
MAX_BATCH = 32  # @serve.batch's cap: the most concurrent requests the benchmark sends
# A replica takes at most this many requests at once (Ray's default, 5, would cap a batch at 5).
MAX_ONGOING = 2 * MAX_BATCH
MODEL_VERSION = "1"  # the version both stacks serve (bench.peers.pipeline pins meshserve's model service to it)
CACHE_PREFIX = b"raypeer:cache:"  # its own keys in the shared Valkey, apart from the cache service's
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # the smallest Ray allows is 75 MiB; the pipeline passes only small arrays
LOGGING = {"log_level": "WARNING", "enable_access_log": False}  # Ray logs every request at INFO by default
log = logging.getLogger("bench.peers.ray_peer")


def pipeline_spec(path: Path) -> dict[str, Any]:
    """What the app reads from a pipeline YAML (pipelines/fraud.yaml): inputs, feature set, model, cache TTL."""
    spec = yaml.safe_load(path.read_text())
    return {
        "name": spec["name"],
        "fields": [i["name"] for i in spec["inputs"]],
        "feature_set": spec["features"]["feature_set"],
        "budget_ms": float(spec["features"].get("budget_ms", 0.0)),
        "model": spec["model"]["name"],
        "output": spec["outputs"][0],
        "ttl_s": int(spec["cache"]["ttl_s"]),
        "cache_timeout_s": float(spec["timeouts"]["cache_ms"]) / 1e3,  # past it, a cache lookup is a miss
    }


def feature_rows(inputs: Mapping[str, np.ndarray], fields: Sequence[str]) -> list[dict[str, Any]]:
    """One feature row per request row: each field's first element as a Python value (BYTES as UTF-8 text)."""
    columns = {}
    for name in fields:
        flat = inputs[name].reshape(inputs[name].shape[0], -1)[:, 0].tolist()
        columns[name] = [v.decode() if isinstance(v, bytes) else v for v in flat]
    rows = len(columns[fields[0]])
    return [{name: columns[name][r] for name in fields} for r in range(rows)]


@serve.deployment(ray_actor_options={"num_cpus": STAGE_CPUS}, max_ongoing_requests=MAX_ONGOING)
class Features:
    """fraud_v1's feature matrix of the rows of concurrent requests: one FeatureHandler.compute per batch."""

    def __init__(self, redis_url: str, feature_set: str, budget_ms: float, wait_s: float) -> None:
        self.redis_url = redis_url
        self.feature_set = feature_set
        self.budget_ms = budget_ms
        self.handler: FeatureHandler | None = None  # built on first use: its Redis client belongs to the loop
        self.compute.set_batch_wait_timeout_s(wait_s)

    @serve.batch(max_batch_size=MAX_BATCH)
    async def compute(self, requests: list[list[dict[str, Any]]]) -> list[tuple[np.ndarray, int]]:
        """Per request: (its rows of the FP32 matrix, how many of them were degraded)."""
        if self.handler is None:
            self.handler = FeatureHandler(FeatureSettings(), self.redis_url)
            await self.handler.store.prepare()
        rows = [row for request in requests for row in request]
        features = await self.handler.compute(self.feature_set, rows, self.budget_ms)
        out, start = [], 0
        for request in requests:
            end = start + len(request)
            out.append((features.matrix[start:end], int(features.degraded[start:end].sum())))
            start = end
        return out


@serve.deployment(ray_actor_options={"num_cpus": STAGE_CPUS}, max_ongoing_requests=MAX_ONGOING)
class Model:
    """The TorchScript model on CPU: one forward pass over the matrices of concurrent requests."""

    def __init__(self, model_file: str, wait_s: float) -> None:
        torch.set_num_threads(1)  # as meshserve's model service runs a model this small (one intra-op thread)
        self.module = torch.jit.load(model_file, map_location="cpu").eval()
        with torch.inference_mode():
            self.module(torch.zeros(MAX_BATCH, 64))
        self.infer.set_batch_wait_timeout_s(wait_s)

    @serve.batch(max_batch_size=MAX_BATCH)
    async def infer(self, matrices: list[np.ndarray]) -> list[np.ndarray]:
        """Per request: its rows' scores, FP32 [rows, 1]."""
        stacked = np.concatenate(matrices) if len(matrices) > 1 else matrices[0]
        with torch.inference_mode():
            scores = self.module(torch.from_numpy(np.ascontiguousarray(stacked, dtype=np.float32))).numpy()
        out, start = [], 0
        for matrix in matrices:
            out.append(scores[start : start + len(matrix)])
            start += len(matrix)
        return out


@serve.deployment(ray_actor_options={"num_cpus": STAGE_CPUS}, max_ongoing_requests=MAX_ONGOING)
class Ingress:
    """v2 ModelInfer for the pipeline (plus the readiness RPCs): cache lookup, features, model, cache store.

    Ray's gRPC proxy calls the method named as the RPC, with the request message decoded.
    """

    def __init__(self, features: DeploymentHandle, model: DeploymentHandle, redis_url: str, spec: dict) -> None:
        self.features = features
        self.model = model
        self.redis_url = redis_url
        self.spec = spec
        self.redis: Any = None  # built on first use, inside the replica's event loop
        self.stores: set[asyncio.Task] = set()

    def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=request.name == self.spec["name"])

    async def ModelInfer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        if self.redis is None:
            self.redis = connect(self.redis_url, max_connections=64, command_timeout_s=self.spec["cache_timeout_s"])
        spec = self.spec
        inputs = decode_request_inputs(request.inputs, request.raw_input_contents)
        digest = request_digest({name: inputs[name] for name in spec["fields"]})
        key = CACHE_PREFIX + versioned_key(spec["name"], spec["model"], MODEL_VERSION, digest)
        cached = await self._lookup(key)
        if cached is not None:
            return self._response(request, cached, len(cached) // 4, "hit")
        rows = feature_rows(inputs, spec["fields"])
        matrix, degraded = await self.features.compute.remote(rows)
        scores = await self.model.infer.remote(matrix)
        raw = np.ascontiguousarray(scores, dtype=np.float32).tobytes()
        if not degraded:  # as the gateway: an answer from default aggregates is not cached
            task = asyncio.ensure_future(self.redis.set(key, raw, ex=spec["ttl_s"]))
            self.stores.add(task)
            task.add_done_callback(self._stored)
        response = self._response(request, raw, len(rows), "miss")
        if degraded:
            response.parameters["degraded"].string_param = "features_degraded"
        return response

    async def _lookup(self, key: bytes) -> bytes | None:
        try:
            return await asyncio.wait_for(self.redis.get(key), self.spec["cache_timeout_s"])
        except (RedisError, OSError, TimeoutError) as exc:  # fail open: a dead or slow cache is a miss
            log.debug("cache lookup failed: %r", exc)
            return None

    def _stored(self, task: asyncio.Task) -> None:
        self.stores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("cache store failed: %r", task.exception())

    def _response(self, request: pb.ModelInferRequest, raw: bytes, rows: int, cache: str) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=MODEL_VERSION, id=request.id)
        response.outputs.add(name=self.spec["output"], datatype="FP32", shape=[rows, 1])
        response.raw_output_contents.append(raw)
        response.parameters["model_version"].string_param = MODEL_VERSION
        response.parameters["cache"].string_param = cache
        return response


def build(args: argparse.Namespace) -> serve.Application:
    spec = pipeline_spec(args.pipeline)
    wait_s = args.batch_wait_ms / 1e3
    features = Features.bind(args.redis_url, spec["feature_set"], spec["budget_ms"], wait_s)
    model = Model.bind(str(args.model_file), wait_s)
    return Ingress.bind(features, model, args.redis_url, spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.ray_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True, help="Ray Serve always starts its HTTP proxy too")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model-file", type=Path, required=True)
    parser.add_argument("--pipeline", type=Path, default=ROOT / "pipelines" / "fraud.yaml")
    parser.add_argument("--temp-dir", type=Path, required=True, help="Ray's session folder (sockets, logs)")
    parser.add_argument("--batch-wait-ms", type=float, default=0.0, help="@serve.batch's batch_wait_timeout_s, ms")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ray.init(
        num_cpus=CPUS,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=OBJECT_STORE_BYTES,
        _temp_dir=str(args.temp_dir),
    )
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": args.http_port},
            grpc_options={"port": args.grpc_port, "grpc_servicer_functions": [SERVICER]},
            logging_config=LOGGING,
        )
        serve.run(build(args), blocking=False, logging_config=LOGGING)
        print(f"ray serve: fraud pipeline on gRPC port {args.grpc_port}", flush=True)
        stop.wait()
        serve.shutdown()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    # Run as bench.peers.ray_peer, not __main__, so that Ray pickles the deployments by reference (importable on its
    # workers through PYTHONPATH) rather than by value.
    from bench.peers.ray_peer import main as run

    run()
