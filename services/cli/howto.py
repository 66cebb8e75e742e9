"""What `make run` / `meshserve up --demo` print after the demo: how to call the running endpoint yourself."""

from __future__ import annotations

TRITONCLIENT = """\
import time, numpy as np, tritonclient.grpc as triton
row = {{"event_time": np.array([[int(time.time())]], np.int64), "user_id": np.array([[b"u-42"]], object),
       "merchant_id": np.array([[b"m-7"]], object), "device_id": np.array([[b"d-1"]], object),
       "amount": np.array([[129.5]], np.float32), "country": np.array([[b"US"]], object),
       "channel": np.array([[b"web"]], object), "mcc": np.array([[b"5411"]], object),
       "card_present": np.array([[False]]), "account_age_days": np.array([[420.0]], np.float32)}}
inputs = [triton.InferInput(k, list(v.shape), triton.np_to_triton_dtype(v.dtype)) for k, v in row.items()]
for tensor, value in zip(inputs, row.values()):
    tensor.set_data_from_numpy(value)
result = triton.InferenceServerClient("{address}").infer("fraud", inputs, parameters={{"debug": True}})
print(result.as_numpy("score"), result.get_response(as_json=True)["parameters"])"""

GRPCURL = """\
grpcurl -plaintext {address} list                       # reflection: every service, no .proto needed
grpcurl -plaintext -d '{{"name": "fraud"}}' {address} inference.GRPCInferenceService/ModelMetadata"""

MESHSERVE = """\
meshserve infer fraud --address {address} --debug --json '{{"event_time": 1764680000, "user_id": "u-42",
  "merchant_id": "m-7", "device_id": "d-1", "amount": 129.5, "country": "US", "channel": "web",
  "mcc": "5411", "card_present": false, "account_age_days": 420}}'
meshserve canary set model 25        # live canary weights; also: show, promote, rollback"""


def how_to_call(address: str) -> str:
    """Copy-paste examples against `address` (the ingress, or the gateway without the mesh)."""
    return (
        f"Call the endpoint at {address} yourself:\n\n"
        "# Python, unmodified tritonclient (pip install 'tritonclient[grpc]')\n"
        f"{TRITONCLIENT.format(address=address)}\n\n"
        f"# grpcurl (README shows a full ModelInfer body)\n{GRPCURL.format(address=address)}\n\n"
        f"# the meshserve CLI\n{MESHSERVE.format(address=address)}\n"
    )
