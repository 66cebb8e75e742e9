"""`make run` (until the gateway lands): serve the demo repository, send it requests with tritonclient, print.

Starts `python -m services.model` on 127.0.0.1:8001 (metrics on 9001), waits until it is healthy, sends
fraud_mlp (v1 FP32 and v2 INT8) and digits_cnn requests, prints the answers, then keeps serving until
Ctrl-C (`--once` stops right after the demo). The fraud_mlp features of held-out transactions of the
training stream are computed the way serving computes them: the feature service's handler, in this
process, on an embedded Valkey that has ingested the stream up to each transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton
from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models import transactions  # noqa: E402
from models.feature_replay import replay_settings  # noqa: E402
from models.fraud_mlp import FEATURE_SET, HELD_OUT, SEED  # noqa: E402
from services.common.embedded import EmbeddedValkey  # noqa: E402
from services.feature.handler import FeatureHandler  # noqa: E402
from tests.helpers.servers import health_status  # noqa: E402


def wait_healthy(process: subprocess.Popen[bytes], address: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"model service exited with {process.returncode}; see its output above")
        if health_status(address) == 1:
            return
        time.sleep(0.2)
    raise SystemExit(f"model service at {address} not healthy after {timeout}s")


async def served_features(rows: list[dict], picked: list[int]) -> np.ndarray:
    """Features of rows[i] for each picked i (ascending), after ingesting the stream up to it in time order."""
    valkey = EmbeddedValkey()
    await valkey.start()
    handler = FeatureHandler(replay_settings(), valkey.url)
    out = []
    try:
        ingested = 0
        for i in picked:
            for start in range(ingested, i, handler.settings.max_batch):
                await handler.ingest(FEATURE_SET, rows[start : min(start + handler.settings.max_batch, i)])
            ingested = i
            out.append((await handler.compute(FEATURE_SET, [rows[i]])).matrix[0])
    finally:
        await handler.close()
        await valkey.stop()
    return np.stack(out)


def fraud_examples() -> tuple[list[dict], np.ndarray, np.ndarray]:
    """4 fraudulent then 4 legitimate held-out transactions of the training stream, and their served features."""
    stream = transactions.generate(SEED)
    first = int(np.searchsorted(stream.times, stream.warmup_end))
    held_out = first + int((len(stream.rows) - first) * (1.0 - HELD_OUT))
    fraud = [i for i in range(held_out, len(stream.rows)) if stream.labels[i]][:4]
    legit = [i for i in range(held_out, len(stream.rows)) if not stream.labels[i]][:4]
    features = asyncio.run(served_features(stream.rows, sorted(fraud + legit)))
    order = [sorted(fraud + legit).index(i) for i in fraud + legit]
    return [stream.rows[i] for i in fraud + legit], features[order], stream.labels[fraud + legit]


def demo(address: str) -> None:
    client = triton.InferenceServerClient(address)
    print(f"\nserver: {client.get_server_metadata().name} {client.get_server_metadata().version} at {address}")
    for model in client.get_model_repository_index().models:
        print(f"  model {model.name:<12} version {model.version or '-':<3} {model.state} {model.reason}")

    rows, features, labels = fraud_examples()
    print("\nfraud_mlp: 4 fraudulent then 4 legitimate held-out transactions (64 FP32 features each, computed by")
    print("the feature handler on an embedded Valkey from the stream up to each one), v1 FP32 and v2 INT8")
    scores = {}
    for version in ("1", "2"):
        inp = triton.InferInput("features", list(features.shape), "FP32")
        inp.set_data_from_numpy(features.astype(np.float32))
        result = client.infer("fraud_mlp", [inp], model_version=version)
        scores[version] = result.as_numpy("score").reshape(-1)
    print(f"  {'label':<6} {'user':<6} {'amount':>9} {'country':<7} {'channel':<7} {'device':<8} {'v1':>6} {'v2':>6}")
    for row, label, v1, v2 in zip(rows, labels, scores["1"], scores["2"], strict=True):
        kind = "fraud" if label else "legit"
        print(
            f"  {kind:<6} {row['user_id']:<6} {row['amount']:>9.2f} {row['country']:<7} {row['channel']:<7} "
            f"{row['device_id']:<8} {v1:>6.3f} {v2:>6.3f}"
        )

    digits = load_digits()
    images = (digits.images[:6] / 16.0).astype(np.float32).reshape(6, 1, 8, 8)
    inp = triton.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    result = client.infer("digits_cnn", [inp])
    predicted = result.as_numpy("label").reshape(-1)
    confidence = result.as_numpy("probabilities").max(axis=1)
    print("\ndigits_cnn: 6 images of 8x8 pixels")
    for truth, label, p in zip(digits.target[:6], predicted, confidence, strict=True):
        print(f"  true {truth}  predicted {label}  (p={p:.3f})")
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--once", action="store_true", help="stop after the demo requests")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    address = f"127.0.0.1:{args.port}"
    env = {
        **os.environ,
        "MESHSERVE_MODEL_PORT": str(args.port),
        "MESHSERVE_MODEL_REPOSITORY": str(ROOT / "models"),
        "MESHSERVE_MODEL_HOST": "127.0.0.1",
    }
    process = subprocess.Popen([sys.executable, "-m", "services.model"], cwd=ROOT, env=env)
    try:
        wait_healthy(process, address)
        demo(address)
        if args.once:
            return 0
        print(f"\nserving on {address} (metrics on http://127.0.0.1:9001/metrics); Ctrl-C to stop")
        print("  load it with Triton's perf_analyzer: `make bench` (it sets up perf_analyzer's libraries)")
        process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
