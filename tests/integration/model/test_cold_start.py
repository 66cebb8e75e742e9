"""`python -m services.model` measures its own cold start: one observation per served model on /metrics, each
after zero and before the test saw SERVING, and one log line per model that splits the time."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from services.model.cold_start import COLD_START_SECONDS
from tests.helpers.models import Mlp, mlp_config, write_model
from tests.helpers.servers import model_service

TICK_S = 0.01  # /proc/<pid>/stat counts the start in clock ticks (100 per second): the spawn may read this early


def _samples(text: str, name: str) -> dict[str, float]:
    """model label -> value of the `name` series in a Prometheus text exposition."""
    found = re.findall(rf'^{name}\{{model="([^"]+)"\}} (\S+)$', text, re.MULTILINE)
    return {model: float(value) for model, value in found}


def test_the_process_observes_each_served_model_once_between_spawn_and_serving(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "mlp", mlp_config("mlp"), {1: Mlp(1), 2: Mlp(2)})  # version_policy: latest
    write_model(repo, "other", mlp_config("other"), {1: Mlp(3)})
    write_model(repo, "broken", mlp_config("broken", backend="tensorflow"), {1: Mlp(4)})
    spawned = time.monotonic()
    with model_service(repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false") as service:
        wall_s = time.monotonic() - spawned  # the service said SERVING before this
        url = f"http://127.0.0.1:{service.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        log = service.log()
    name = COLD_START_SECONDS._name
    assert _samples(text, f"{name}_count") == {"mlp": 1.0, "other": 1.0}  # the broken model never served
    sums = _samples(text, f"{name}_sum")
    for model in ("mlp", "other"):
        assert 0 < sums[model] < wall_s + TICK_S, (model, sums[model], wall_s)
    lines = re.findall(
        r"cold start: (\w+) (\S+) serving ([\d.]+) s after spawn \(import ([\d.]+) s, load\+warm ([\d.]+) s\)", log
    )
    assert sorted((m, v) for m, v, *_ in lines) == [("mlp", "v2"), ("other", "v1")]  # the policy serves the latest, log
    for _model, _versions, serving, imports, load_warm in lines:
        assert 0 < float(imports) < float(serving) and float(imports) + float(load_warm) <= float(serving) + 0.01
    assert log.index("cold start: mlp") > log.index("model other version 1 ready")  # logged at SERVING, after loads
