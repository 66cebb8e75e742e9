"""What `meshserve up` prints once the stack is up (with `--demo`, after the demo): how to call the running endpoint
yourself (with the stack's CA and a token when the ingress is secure)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from services.cli.stack.layout import ROOT

# perf_analyzer lives in its own virtualenv and needs libcudart from a wheel there (no GPU is used); its default
# random input is refused by the pipeline (random bits are no unix time), so it sends real rows from this file.
PERF_VENV = ROOT / ".venv-perf"
FRAUD_ROWS = resources.files("services.cli") / "fraud_rows.json"

ROW = """\
import os, time, numpy as np, tritonclient.grpc as triton
row = {{"event_time": np.array([[int(time.time())]], np.int64), "user_id": np.array([[b"u-42"]], object),
       "merchant_id": np.array([[b"m-7"]], object), "device_id": np.array([[b"d-1"]], object),
       "amount": np.array([[129.5]], np.float32), "country": np.array([[b"US"]], object),
       "channel": np.array([[b"web"]], object), "mcc": np.array([[b"5411"]], object),
       "card_present": np.array([[False]]), "account_age_days": np.array([[420.0]], np.float32)}}
inputs = [triton.InferInput(k, list(v.shape), triton.np_to_triton_dtype(v.dtype)) for k, v in row.items()]
for tensor, value in zip(inputs, row.values()):
    tensor.set_data_from_numpy(value)"""

TRITONCLIENT_PLAIN = """\
result = triton.InferenceServerClient("{address}").infer("fraud", inputs, parameters={{"debug": True}})
print(result.as_numpy("score"), result.get_response(as_json=True)["parameters"])"""

TRITONCLIENT_TLS = """\
client = triton.InferenceServerClient("{address}", ssl=True, root_certificates="{ca}")
result = client.infer("fraud", inputs, parameters={{"debug": True}},
                      headers={{"authorization": "Bearer " + os.environ["TOKEN"]}})
print(result.as_numpy("score"), result.get_response(as_json=True)["parameters"])"""

GRPCURL_PLAIN = """\
grpcurl -plaintext {address} list                       # reflection: every service, no .proto needed
grpcurl -plaintext -d '{{"name": "fraud"}}' {address} inference.GRPCInferenceService/ModelMetadata"""

GRPCURL_TLS = """\
grpcurl -cacert {ca} -H "authorization: Bearer $TOKEN" {address} list
grpcurl -cacert {ca} -H "authorization: Bearer $TOKEN" -d '{{"name": "fraud"}}' \\
  {address} inference.GRPCInferenceService/ModelMetadata"""

PERF_ANALYZER_ENV = """\
export LD_LIBRARY_PATH=$(echo {venv}/lib/python3*/site-packages/nvidia/cuda_runtime/lib)"""

PERF_ANALYZER_PLAIN = """\
{venv}/bin/perf_analyzer -m fraud -i grpc -u {address} --input-data {rows} --concurrency-range 4"""

PERF_ANALYZER_TLS = """\
{venv}/bin/perf_analyzer -m fraud -i grpc -u {address} --input-data {rows} --concurrency-range 4 \\
  --ssl-grpc-use-ssl true --ssl-grpc-root-certifications-file {ca} -H "authorization:Bearer $TOKEN\""""

MESHSERVE = """\
meshserve infer fraud --address {address}{log_dir} --debug --json '{{"event_time": 1764680000, "user_id": "u-42",
  "merchant_id": "m-7", "device_id": "d-1", "amount": 129.5, "country": "US", "channel": "web",
  "mcc": "5411", "card_present": false, "account_age_days": 420}}'
meshserve canary set model 25{log_dir}        # live canary weights; also: show, promote, rollback"""


def how_to_call(address: str, ca: Path | None = None, log_dir: Path | None = None) -> str:
    """Copy-paste examples against `address` (the ingress, or the gateway without the mesh).

    With `ca` (a secure ingress), every example uses TLS trusting that CA and sends `$TOKEN`, which the first
    line sets with `meshserve token`; the meshserve CLI finds both itself through the stack's `log_dir` (None: the
    default log dir, which the commands find from any folder).
    """
    flag = f" --log-dir {log_dir}" if log_dir is not None else ""
    perf = {"venv": PERF_VENV, "rows": FRAUD_ROWS}
    perf_head = f"# perf_analyzer (Triton's, from its own virtualenv)\n{PERF_ANALYZER_ENV.format(**perf)}\n"
    grpcurl_head = "# grpcurl (docs/local-stack.md shows a full ModelInfer body)\n"
    if ca is None:
        return (
            f"Call the endpoint at {address} yourself (plaintext, no token: `meshserve up --insecure`):\n\n"
            "# Python, unmodified tritonclient (pip install 'tritonclient[grpc]')\n"
            f"{ROW.format()}\n{TRITONCLIENT_PLAIN.format(address=address)}\n\n"
            f"{grpcurl_head}{GRPCURL_PLAIN.format(address=address)}\n\n"
            f"{perf_head}{PERF_ANALYZER_PLAIN.format(address=address, **perf)}\n\n"
            f"# the meshserve CLI\n{MESHSERVE.format(address=address, log_dir=flag)}\n"
        )
    return (
        f"Call the endpoint at {address} yourself: TLS (the stack's CA is {ca}) and a token per client:\n\n"
        f"export TOKEN=$(meshserve token my-client{flag})   # any client name; --operator for load/unload\n\n"
        "# Python, unmodified tritonclient (pip install 'tritonclient[grpc]')\n"
        f"{ROW.format()}\n{TRITONCLIENT_TLS.format(address=address, ca=ca)}\n\n"
        f"{grpcurl_head}{GRPCURL_TLS.format(address=address, ca=ca)}\n\n"
        f"{perf_head}{PERF_ANALYZER_TLS.format(address=address, ca=ca, **perf)}\n\n"
        f"# the meshserve CLI (TLS and a token from the stack's files)\n"
        f"{MESHSERVE.format(address=address, log_dir=flag)}\n"
    )
