"""Fixtures for in-process feature tests: settings, rows, and handlers on a Redis URL that refuses connections
(no Valkey here: tests on a real one are in tests/integration/services/feature)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings
from tests.helpers.servers import free_port

T0 = 1_700_000_000  # a Tuesday, 22:13:20 UTC


def feature_settings(**overrides: Any) -> FeatureSettings:
    """Test settings: loopback, no metrics port, a budget generous enough for a loaded 2-core machine."""
    base: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "lookup_budget_ms": 2000.0}
    return FeatureSettings(**{**base, **overrides})


def fraud_row(**overrides: Any) -> dict[str, Any]:
    """A complete fraud_v1 row."""
    row = {
        "event_time": T0,
        "user_id": "u1",
        "merchant_id": "m1",
        "device_id": "d1",
        "amount": 120.5,
        "country": "us",
        "channel": "web",
        "mcc": "5411",
        "card_present": True,
        "account_age_days": 400.0,
    }
    return {**row, **overrides}


@pytest.fixture()
def refused_url() -> str:
    """A Redis URL nothing listens on (a free loopback port): every store call fails at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture()
async def make_offline_handler(refused_url: str) -> AsyncIterator[Callable[..., FeatureHandler]]:
    """Build FeatureHandlers whose online store refuses connections; all are closed at the end."""
    made: list[FeatureHandler] = []

    def make(features_dir: Path | None = None, **overrides: Any) -> FeatureHandler:
        if features_dir is not None:
            overrides["features_dir"] = features_dir
        handler = FeatureHandler(feature_settings(**overrides), refused_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()
