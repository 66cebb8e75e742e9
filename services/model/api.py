"""The model service's public surface: what another service may import from it (the gateway does).

`ModelClient`, a v2 inference client that raises the project's own errors, and the plain types its `infer` and
`describe` speak. Nothing here imports torch or the service's internals.
"""

from __future__ import annotations

from services.model.client import ModelClient
from services.model.domain import InferResult, ModelInfo, RawTensor, TensorInfo

__all__ = ["InferResult", "ModelClient", "ModelInfo", "RawTensor", "TensorInfo"]
