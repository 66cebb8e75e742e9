"""`make run` (until the gateway lands): serve the demo repository, send it requests with tritonclient, print.

Starts `python -m services.model` on 127.0.0.1:8001 (metrics on 9001), waits until it is healthy, sends
fraud_mlp (v1 FP32 and v2 INT8) and digits_cnn requests, prints the answers, then keeps serving until
Ctrl-C (`--once` stops right after the demo).
"""

from __future__ import annotations

import argparse
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

from models.fraud_mlp import make_dataset  # noqa: E402
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


def demo(address: str) -> None:
    client = triton.InferenceServerClient(address)
    print(f"\nserver: {client.get_server_metadata().name} {client.get_server_metadata().version} at {address}")
    for model in client.get_model_repository_index().models:
        print(f"  model {model.name:<12} version {model.version or '-':<3} {model.state} {model.reason}")

    pool, pool_labels = make_dataset(seed=7, n=2000)
    pick = np.concatenate([np.flatnonzero(pool_labels == 1)[:4], np.flatnonzero(pool_labels == 0)[:4]])
    features, labels = pool[pick], pool_labels[pick]
    print("\nfraud_mlp: 4 fraudulent then 4 legitimate transactions (64 FP32 features each), v1 FP32 and v2 INT8")
    for version in ("1", "2"):
        inp = triton.InferInput("features", list(features.shape), "FP32")
        inp.set_data_from_numpy(features.astype(np.float32))
        result = client.infer("fraud_mlp", [inp], model_version=version)
        scores = result.as_numpy("score").reshape(-1)
        shown = " ".join(f"{s:.3f}" for s in scores)
        print(f"  v{result.get_response().model_version} scores: {shown}   (labels: {' '.join(map(str, labels))})")

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
