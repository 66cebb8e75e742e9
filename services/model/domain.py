"""The model service's domain types: what its handler takes and returns, and what its client (`ModelClient`) gives
other services in plain types. Light on purpose: other services import this, so it needs neither torch nor protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from services.model.version import ModelVersion


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """Who answers: the server's name, version and the protocol extensions it supports."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """One version whose tensors to describe, and every ready version of its model (ascending)."""

    version: ModelVersion
    ready_versions: list[int]


@dataclass(slots=True)
class InferenceRequest:
    model_name: str
    model_version: str
    inputs: dict[str, np.ndarray]
    id: str = ""
    requested_outputs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str = ""


@dataclass(frozen=True, slots=True)
class RawTensor:
    """One v2 tensor as it travels: name, datatype, full shape and little-endian raw contents."""

    name: str
    datatype: str
    shape: list[int]
    raw: bytes


@dataclass(frozen=True, slots=True)
class InferResult:
    """A model's answer: which version answered, and its output tensors in the order the model sent them."""

    model_name: str
    model_version: str
    outputs: list[RawTensor]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """An input or output of a model: name, datatype and shape (-1 for the batch dimension)."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ModelMetadata says about a model: the versions serving and its tensors."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
