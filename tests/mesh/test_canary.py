"""Canary routing through the real Envoy: the 90/10 split, x-canary and x-model-version headers, live weights."""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.helpers.servers import ServiceProcess
from tests.mesh.conftest import MeshFactory, client_of, infer, subset_replicas


def test_split_follows_weights_and_header_pins_canary(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory
) -> None:
    mesh = make_mesh(subset_replicas(replicas))
    assert mesh.weights("model") == {"v1": 90, "v2": 10}
    with client_of(mesh.address("model")) as client:
        counts = Counter(infer(client) for _ in range(2000))
        canary = Counter(infer(client, {"x-canary": "true"}) for _ in range(100))
        pinned = {v: Counter(infer(client, {"x-model-version": v}) for _ in range(40)) for v in ("1", "2")}
    assert set(counts) <= {"1", "2"}
    share_v2 = 100 * counts["2"] / 2000
    assert abs(share_v2 - 10) <= 3, counts
    assert canary == Counter({"2": 100})
    assert pinned == {"1": Counter({"1": 40}), "2": Counter({"2": 40})}  # an explicit version reaches its subset


def test_weights_change_under_load_without_failures(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory
) -> None:
    mesh = make_mesh(subset_replicas(replicas))
    results: list[tuple[float, str]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        with client_of(mesh.address("model")) as client:
            while not stop.is_set():
                started = time.monotonic()  # classify by start: the route is chosen when a call starts
                try:
                    results.append((started, infer(client)))
                except Exception as exc:
                    errors.append(exc)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.5)
        assert mesh.set_weights("model", {"v1": 50, "v2": 50}) == {"v1": 50, "v2": 50}
        switched = time.monotonic()
        time.sleep(1.5)
        promoting = time.monotonic()
        mesh.promote("model")
        promoted = time.monotonic()
        time.sleep(0.7)
        rolling_back = time.monotonic()
        mesh.rollback("model")
        rolled_back = time.monotonic()
        time.sleep(0.7)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert not errors, errors[:3]
    half = Counter(v for t, v in results if switched + 0.1 < t < promoting)
    assert sum(half.values()) >= 200
    assert abs(100 * half["2"] / sum(half.values()) - 50) <= 10, half
    assert set(v for t, v in results if promoted + 0.1 < t < rolling_back) == {"2"}
    assert set(v for t, v in results if t > rolled_back + 0.1) == {"1"}
