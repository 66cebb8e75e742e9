"""The fuzzer's own strategies (no process needed): arbitrary messages reach every kind of field, mutations make
the mistakes the fuzz module promises, and everything they make serializes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from services.protos import feature_pb2
from services.protos import inference_pb2 as pb
from tests.fuzz.protobuf_strategies import Limits, messages, mutated, raw_bodies
from tests.fuzz.seeds import SEEDS

# Found once is enough: no shrinking.
SETTINGS = settings(
    max_examples=2000,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
INFER = [s.request for s in SEEDS["model"]["ModelInfer"]]


def test_arbitrary_messages_reach_maps_oneofs_repeated_and_nested_fields() -> None:
    infer = messages(pb.ModelInferRequest.DESCRIPTOR, Limits())
    find(infer, lambda m: any(p.WhichOneof("parameter_choice") for p in m.parameters.values()), settings=SETTINGS)
    find(infer, lambda m: any(len(t.contents.fp32_contents) > 1 for t in m.inputs), settings=SETTINGS)
    find(infer, lambda m: any(t.parameters for t in m.inputs) and len(m.raw_input_contents) > 1, settings=SETTINGS)
    rows = messages(feature_pb2.ComputeRequest.DESCRIPTOR, Limits())
    find(
        rows,
        lambda m: any(v.WhichOneof("kind") == "double_value" for r in m.rows for v in r.fields.values()),
        settings=SETTINGS,
    )


def test_mutations_make_the_mistakes_callers_make() -> None:
    change = mutated(INFER, Limits(names=("BYTES", "image")))

    def non_finite(m: pb.ModelInferRequest) -> bool:
        if not m.raw_input_contents or len(m.raw_input_contents[0]) % 4:
            return False
        return bool(np.isnan(np.frombuffer(m.raw_input_contents[0], "<f4")).any())

    find(change, non_finite, settings=SETTINGS)
    find(change, lambda m: any(t.datatype == "BYTES" for t in m.inputs), settings=SETTINGS)
    find(change, lambda m: any(d > 2**31 for t in m.inputs for d in t.shape), settings=SETTINGS)
    find(change, lambda m: any(d < 0 for t in m.inputs for d in t.shape), settings=SETTINGS)
    find(change, lambda m: len(m.model_name) >= 1000 or m.model_name == "image", settings=SETTINGS)
    cut = sum(map(len, INFER[0].raw_input_contents))
    find(change, lambda m: 0 < sum(map(len, m.raw_input_contents)) < cut, settings=SETTINGS)


@settings(max_examples=300, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        messages(pb.ModelInferRequest.DESCRIPTOR, Limits()),
        mutated(INFER, Limits()),
        mutated([s.request for s in SEEDS["gateway"]["ModelInfer"]], Limits()),
    )
)
def test_every_generated_message_serializes(message: pb.ModelInferRequest) -> None:
    body = message.SerializeToString(deterministic=True)
    assert pb.ModelInferRequest.FromString(body).SerializeToString(deterministic=True) == body


def test_raw_bodies_cut_change_and_extend_valid_serializations() -> None:
    valid = INFER[0].SerializeToString()
    bodies = raw_bodies([valid])
    find(bodies, lambda b: 0 < len(b) < len(valid) and valid.startswith(b), settings=SETTINGS)
    find(bodies, lambda b: len(b) == len(valid) and b != valid, settings=SETTINGS)
    find(bodies, lambda b: len(b) > len(valid) and b.startswith(valid), settings=SETTINGS)
