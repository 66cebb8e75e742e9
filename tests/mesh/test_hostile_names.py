"""A client cannot make the mesh eject healthy replicas: an unknown model name of 200 kB used to come back whole in
`grpc-message`, past Envoy's header limit, so Envoy reset the stream, the caller saw a retryable UNAVAILABLE, the
mesh retried it three times and outlier detection ejected healthy replicas. The answer is now a bounded
INVALID_ARGUMENT (no model can have such a name) that passes through Envoy like any other, is never retried, and
ejects no replica."""

from __future__ import annotations

import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.helpers.servers import ServiceProcess
from tests.mesh.conftest import MeshFactory, X, client_of, infer

V1 = "outbound|grpc|v1|model"
V2 = "outbound|grpc|v2|model"


def test_huge_model_names_are_a_bounded_caller_error_and_eject_nobody(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory
) -> None:
    mesh = make_mesh([*((r.address, "v1") for r in replicas["v1"]), (replicas["v2"][0].address, "v2")])
    name = "m" * 200_000
    inp = triton.InferInput("x", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    with client_of(mesh.address("model")) as client:
        for _ in range(40):  # the hole: about 30 such calls ejected two healthy replicas
            with pytest.raises(InferenceServerException) as info:
                client.infer(name, [inp], client_timeout=10)
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert len(info.value.message()) <= 1024
        assert infer(client) in {"1", "2"}  # and the model is served as before
    for cluster in (V1, V2):
        assert mesh.admin.stat(f"cluster.{cluster}.outlier_detection.ejections_active") == 0
        assert mesh.admin.stat(f"cluster.{cluster}.upstream_rq_retry") == 0  # nothing worth retrying
