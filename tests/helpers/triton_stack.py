"""An unmodified tritonclient.grpc client of a running `meshserve up`'s ingress, for tests/compat and tests/mesh only
(tritonclient's protobuf stubs must not share a process with services.protos)."""

from __future__ import annotations

from typing import Any

from tests.helpers.cli_stack import Stack


def triton_client(stack: Stack) -> Any:
    """A tritonclient.grpc client of the stack's ingress: TLS trusting the stack's CA when it is secure (send
    `stack.headers()` with each call)."""
    import tritonclient.grpc as triton

    state = stack.state()
    if stack.secure:
        return triton.InferenceServerClient(state["ingress"], ssl=True, root_certificates=state["tls_ca"])
    return triton.InferenceServerClient(state["ingress"])
