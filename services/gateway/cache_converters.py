"""An answer in the form the cache stores it and back: a converter, since the stored bytes are a serialized v2
`ModelInferResponse` of the model's outputs.

The bytes are protobuf because every gateway replica, of any version, reads what another stored (in Redis and in
its near cache), so the format outlives a release; upb encodes and decodes them in C, which a codec written in
Python would not match on the near cache's hit path.
"""

from __future__ import annotations

from services.cache.api import CachedValue
from services.gateway.domain import Answer
from services.model.api import RawTensor
from services.protos import inference_pb2 as pb


def answer_to_cache_value(answer: Answer, model_name: str) -> bytes:
    """An answer as the cache stores it: a serialized ModelInferResponse of the model's outputs."""
    message = pb.ModelInferResponse(model_name=model_name, model_version=answer.model_version)
    for tensor in answer.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(tensor.raw)
    return message.SerializeToString()


def answer_from_cache(hit: CachedValue, cache: str) -> Answer:
    """A cached answer (`cache`: hit or stale), its version from the value or else from the entry."""
    message = pb.ModelInferResponse.FromString(hit.value)
    outputs = [
        RawTensor(o.name, o.datatype, list(o.shape), raw)
        for o, raw in zip(message.outputs, message.raw_output_contents, strict=True)
    ]
    return Answer(outputs, message.model_version or hit.model_version, cache)
