"""Fixtures for the compat tests: real model-service processes on loopback, an unmodified tritonclient as the client.

This pytest process (tests/compat and tests/mesh) holds tritonclient; tests/integration and tests/fuzz run in
another, because services.protos's protobuf package `inference` cannot sit beside tritonclient's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers.models import Mlp, MultiIO, mlp_config, write_model
from tests.helpers.servers import ServiceProcess, model_service

if TYPE_CHECKING:
    import tritonclient.grpc as triton


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository exercising version policies, batching and several dtypes."""
    root = tmp_path_factory.mktemp("repo")
    write_model(
        root,
        "mlp",
        mlp_config("mlp", version_policy={"latest": {"num_versions": 2}}),
        {1: Mlp(1), 2: Mlp(2), 3: Mlp(3)},
    )
    write_model(
        root,
        "pinned",
        mlp_config("pinned", version_policy={"specific": {"versions": [1, 3]}}),
        {1: Mlp(1), 2: Mlp(2), 3: Mlp(3)},
    )
    write_model(
        root,
        "batched",
        mlp_config(
            "batched",
            max_batch_size=16,
            dynamic_batching={"max_queue_delay_us": 0, "allowed_batch_sizes": [4, 16]},
        ),
        {1: Mlp(7)},
    )
    write_model(
        root,
        "multi",
        {
            "name": "multi",
            "max_batch_size": 0,
            "inputs": [
                {"name": "a", "datatype": "FP32", "dims": [2, 3]},
                {"name": "b", "datatype": "INT64", "dims": [2]},
            ],
            "outputs": [
                {"name": "a2", "datatype": "FP32", "dims": [2, 3]},
                {"name": "b1", "datatype": "INT64", "dims": [2]},
            ],
        },
        {1: MultiIO()},
    )
    write_model(
        root,
        "nan_ok",
        {**mlp_config("nan_ok"), "inputs": [{"name": "x", "datatype": "FP32", "dims": [8], "allow_nan": True}]},
        {1: Mlp(5)},
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    with model_service(repo, tmp_path_factory.mktemp("logs"), MESHSERVE_MODEL_MAX_MESSAGE_BYTES="1048576") as s:
        yield s


@pytest.fixture()
def client(server: ServiceProcess) -> Iterator[triton.InferenceServerClient]:
    import tritonclient.grpc as triton

    c = triton.InferenceServerClient(server.address)
    yield c
    c.close()
