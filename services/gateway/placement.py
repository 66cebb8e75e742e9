"""Where a pipeline request of a two-tier deployment is answered: its data class, its tier, and what crosses to the
cloud (pure functions over decoded inputs and the pipeline's placement; no I/O).

A request is `sensitive` when any input the pipeline marks sensitive carries a value in any row (non-empty bytes,
any number or bool; an input the client left out carries none), or when the client's `x-meshserve-data-class`
header says sensitive; a client's `general` never lowers what the inputs say. Sensitive requests are answered at
the edge; general ones where `placement.general_to` says, carrying across only the general inputs (`request`) or
the features computed at the edge (`derived_features`).

Example (fraud: a row with a user id is sensitive; rows without any identifier are general)::

    >>> import numpy as np
    >>> from services.gateway.pipeline import PipelineSpec
    >>> spec = PipelineSpec.model_validate({
    ...     "name": "p", "model": {"name": "m"}, "outputs": ["y"], "features": {"feature_set": "f"},
    ...     "degradation": {"on_model_failure": [], "on_feature_failure": []},
    ...     "inputs": [{"name": "user_id", "datatype": "BYTES", "data_class": "sensitive"},
    ...                {"name": "amount", "datatype": "FP32"}],
    ...     "placement": {}})
    >>> general = {"user_id": np.array([[b""], [b""]], dtype=object), "amount": np.ones((2, 1), np.float32)}
    >>> classify(spec, general, None)
    'general'
    >>> decide(spec, "general")
    Route(data_class='general', tier='cloud', leave_edge='derived_features')
    >>> classify(spec, general, "sensitive")  # the client may make it stricter
    'sensitive'
    >>> mixed = dict(general, user_id=np.array([[b""], [b"u-17"]], dtype=object))
    >>> classify(spec, mixed, "general")  # ... never looser
    'sensitive'
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import grpc
import numpy as np

from services.common.errors import InvalidArgument, MeshserveError, error_with_code
from services.common.tensor_codec import NUMPY_DTYPES, encode_raw
from services.gateway.pipeline import DataClass, PipelineSpec, Tier

DATA_CLASS_HEADER = "x-meshserve-data-class"
TIER_HEADER = "x-meshserve-tier"
SENSITIVE: DataClass = "sensitive"
GENERAL: DataClass = "general"
_STRICTNESS: dict[str, int] = {GENERAL: 0, SENSITIVE: 1}
Wire = tuple[str, list[int], bytes]  # a tensor's datatype, shape and raw contents (as services/gateway/joins.py)


@dataclass(frozen=True)
class Route:
    """Where one request is answered: its data class, the tier, and (tier cloud) what crosses."""

    data_class: DataClass
    tier: Tier
    leave_edge: str | None = None


def claimed_class(headers: Iterable[tuple[str, str | bytes]] | None) -> DataClass | None:
    """The class the client's `x-meshserve-data-class` header claims (None: no header); any other value than
    sensitive or general is INVALID_ARGUMENT, so a typo never passes as a weaker class."""
    claimed: DataClass | None = None
    for key, value in headers or ():
        if key != DATA_CLASS_HEADER:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        word = text.strip().lower()
        if word not in _STRICTNESS:
            raise InvalidArgument(f"header {DATA_CLASS_HEADER} must be sensitive or general")
        if claimed is None or _STRICTNESS[word] > _STRICTNESS[claimed]:
            claimed = SENSITIVE if word == SENSITIVE else GENERAL
    return claimed


def rows_with_value(array: np.ndarray) -> np.ndarray:
    """Per row: whether the input carries a value there (bytes: any non-empty element; numbers and bools: always)."""
    if array.ndim == 0:
        array = array.reshape(1)
    flat = array.reshape(array.shape[0], -1)
    if array.dtype.kind not in ("O", "S", "U"):
        return np.ones(flat.shape[0], dtype=bool)
    items = flat.reshape(-1)
    lengths = np.fromiter((0 if item is None else len(item) for item in items), dtype=np.int64, count=items.size)
    return np.asarray(lengths.reshape(flat.shape).any(axis=1), dtype=bool)


def sensitive_values(spec: PipelineSpec, inputs: Mapping[str, np.ndarray], withheld: Collection[str] = ()) -> list[str]:
    """The sensitive inputs that carry a value in some row (those in `withheld`, filled in by the gateway, carry
    none)."""
    return [
        name
        for name in spec.sensitive_inputs()
        if name in inputs and name not in withheld and bool(rows_with_value(inputs[name]).any())
    ]


def classify(
    spec: PipelineSpec,
    inputs: Mapping[str, np.ndarray],
    claimed: DataClass | None,
    withheld: Collection[str] = (),
) -> DataClass:
    """The request's class: the strictest of what its inputs carry and what the client claims."""
    if claimed == SENSITIVE or sensitive_values(spec, inputs, withheld):
        return SENSITIVE
    return GENERAL


def decide(spec: PipelineSpec, data_class: DataClass) -> Route:
    """The tier that answers a request of `data_class` at an edge gateway: sensitive, or a pipeline without
    placement, at the edge; general where the placement sends it."""
    placement = spec.placement
    if placement is None or data_class == SENSITIVE or placement.general_to == "edge":
        return Route(data_class, "edge")
    return Route(data_class, "cloud", placement.leave_edge)


def class_headers(data_class: DataClass, tier: Tier = "edge") -> tuple[tuple[str, str], ...]:
    """The headers every outgoing call of a classified request carries (the mesh routes and refuses on them)."""
    return ((DATA_CLASS_HEADER, data_class), (TIER_HEADER, tier))


def with_class_headers(headers: Iterable[tuple[str, str]], data_class: DataClass) -> tuple[tuple[str, str], ...]:
    """`headers` without any data-class or tier header a client sent, plus this gateway's own."""
    kept = tuple((k, v) for k, v in headers if k not in (DATA_CLASS_HEADER, TIER_HEADER))
    return (*kept, *class_headers(data_class))


def fill_withheld(spec: PipelineSpec, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
    """(inputs with every absent sensitive input filled with empty values, the names filled): a general request
    may leave its sensitive inputs out, and the cloud tier never gets them."""
    out = dict(inputs)
    rows = next((int(a.shape[0]) for a in inputs.values() if a.ndim > 0), None)
    filled: list[str] = []
    if rows is None:
        return out, filled
    for spec_input in spec.inputs:
        if spec_input.data_class != SENSITIVE or spec_input.name in inputs:
            continue
        shape = (rows, *spec_input.dims)
        if spec_input.datatype == "BYTES":
            out[spec_input.name] = np.full(shape, b"", dtype=object)
        else:
            out[spec_input.name] = np.zeros(shape, dtype=NUMPY_DTYPES[spec_input.datatype])
        filled.append(spec_input.name)
    return out, filled


def general_inputs(spec: PipelineSpec, inputs: Mapping[str, np.ndarray]) -> dict[str, Wire]:
    """What crosses with `leave_edge: request`: the general inputs only, by name, in wire form."""
    sensitive = set(spec.sensitive_inputs())
    return {i.name: encode_raw(inputs[i.name]) for i in spec.inputs if i.name not in sensitive}


def derived_features(spec: PipelineSpec, tensors: Mapping[str, Wire]) -> dict[str, Wire]:
    """What crosses with `leave_edge: derived_features`: the model's inputs (the feature matrix) by model input
    name; refused (a bug, never sent) if one of them were a sensitive input."""
    sensitive = set(spec.sensitive_inputs())
    out: dict[str, Wire] = {}
    for model_input, tensor in spec.model_inputs().items():
        if tensor in sensitive:
            raise AssertionError(f"model input {model_input!r} is the sensitive input {tensor!r}")
        out[model_input] = tensors[tensor]
    return out


def crossing(
    spec: PipelineSpec, route: Route, inputs: Mapping[str, np.ndarray], tensors: Mapping[str, Wire]
) -> tuple[str, dict[str, Wire]]:
    """(the name the cloud tier is asked for, the tensors that cross) of a request routed to the cloud: the pipeline
    with its general inputs, or the pipeline's model with the features."""
    if route.leave_edge == "request":
        return spec.name, general_inputs(spec, inputs)
    return spec.model.name, derived_features(spec, tensors)


def refuse_at_cloud(
    spec: PipelineSpec | None,
    inputs: Mapping[str, np.ndarray],
    claimed: DataClass | None,
    withheld: Collection[str] = (),
) -> None:
    """At a cloud-tier gateway: PERMISSION_DENIED for a request marked sensitive, or (a pipeline's) carrying a value
    in a sensitive input; the message names the input, never its value."""
    if claimed == SENSITIVE:
        raise permission_denied(f"a request marked {DATA_CLASS_HEADER}: sensitive is never answered by the cloud tier")
    if spec is None:
        return
    carried = sensitive_values(spec, inputs, withheld)
    if carried:
        raise permission_denied(
            f"pipeline {spec.name!r}: input {carried[0]!r} is sensitive and carries a value; the cloud tier never "
            "takes one (send it empty, or to the edge)"
        )


def permission_denied(message: str) -> MeshserveError:
    return error_with_code(grpc.StatusCode.PERMISSION_DENIED, message)
