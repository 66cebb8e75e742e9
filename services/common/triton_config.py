"""v2 datatype names to Triton model-config data types (shared by the model service and the gateway)."""

from __future__ import annotations

from services.protos import model_config_pb2 as mc

# Triton calls each type TYPE_<v2 name>, except BYTES, which it calls TYPE_STRING.
MODEL_CONFIG_DATA_TYPES = {
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
    "UINT16": mc.TYPE_UINT16,
    "UINT32": mc.TYPE_UINT32,
    "UINT64": mc.TYPE_UINT64,
    "INT8": mc.TYPE_INT8,
    "INT16": mc.TYPE_INT16,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "FP16": mc.TYPE_FP16,
    "FP32": mc.TYPE_FP32,
    "FP64": mc.TYPE_FP64,
    "BF16": mc.TYPE_BF16,
    "BYTES": mc.TYPE_STRING,
}
