"""Every v2 datatype the codec knows has its Triton model-config data type."""

from __future__ import annotations

from services.common.tensor_codec import NUMPY_DTYPES
from services.common.triton_config import MODEL_CONFIG_DATA_TYPES
from services.protos import model_config_pb2 as mc


def test_every_v2_datatype_maps_to_tritons_name_for_it() -> None:
    assert set(MODEL_CONFIG_DATA_TYPES) == set(NUMPY_DTYPES)
    names = {v2: mc.DataType.Name(value) for v2, value in MODEL_CONFIG_DATA_TYPES.items()}
    assert names.pop("BYTES") == "TYPE_STRING"
    assert all(name == f"TYPE_{v2}" for v2, name in names.items()), names
