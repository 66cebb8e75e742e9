"""services/model/api.py, the only thing other services import from the model service: its names are the client's
and the domain types', re-exported as they are."""

from __future__ import annotations

from services.model import api, client, domain


def test_the_api_re_exports_the_client_and_its_plain_types() -> None:
    assert set(api.__all__) == {"InferResult", "ModelClient", "ModelInfo", "RawTensor", "TensorInfo"}
    assert api.ModelClient is client.ModelClient
    for name in ("InferResult", "ModelInfo", "RawTensor", "TensorInfo"):
        assert getattr(api, name) is getattr(domain, name), name
