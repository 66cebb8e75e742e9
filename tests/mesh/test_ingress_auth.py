"""Authentication and authorization at the ingress through the real Envoy (istio/'s RequestAuthentication and
AuthorizationPolicies as jwt_authn and RBAC): the gRPC codes a client sees, and what reaches the gateway."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import tokens
from services.mesh import LocalMesh
from tests.mesh.conftest import MeshFactory
from tests.mesh.credentials import Issuer
from tests.mesh.fakes import INFER, FakeReplica, echo

UNLOAD = "/inference.GRPCInferenceService/RepositoryModelUnload"
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
INDEX = "/inference.GRPCInferenceService/RepositoryIndex"
OPERATOR = tokens.OPERATOR_SUBJECT


@pytest.fixture()
def gateway() -> Iterator[FakeReplica]:
    fake = FakeReplica(echo).start()
    yield fake
    fake.stop()


def code_of(mesh: LocalMesh, method: str, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    assert mesh.ingress_address is not None
    with grpc.insecure_channel(mesh.ingress_address) as channel:
        try:
            channel.unary_unary(method)(b"", metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def health(mesh: LocalMesh) -> int:
    assert mesh.ingress_address is not None
    with grpc.insecure_channel(mesh.ingress_address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def reached(gateway: FakeReplica) -> list[str]:
    return [method for method, _ in gateway.calls]


def test_tokens_decide_who_gets_in(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks)
    other = Issuer.new()  # a key the ingress does not know
    expired = issuer.bearer("alice", now=time.time() - 3600, ttl_s=60)
    assert health(mesh) == health_pb2.HealthCheckResponse.SERVING  # probes need no token
    refused = {
        "no token": code_of(mesh, INFER, []),
        "malformed": code_of(mesh, INFER, [("authorization", "Bearer not.a.jwt")]),
        "not bearer": code_of(mesh, INFER, [("authorization", f"Basic {issuer.token('alice')}")]),
        "expired": code_of(mesh, INFER, [expired]),
        "wrong key": code_of(mesh, INFER, [other.bearer("alice")]),
        "wrong issuer": code_of(mesh, INFER, [issuer.bearer("alice", issuer="https://elsewhere")]),
        "wrong audience": code_of(mesh, INFER, [issuer.bearer("alice", audience="another-service")]),
        "wrong audience, admin": code_of(mesh, UNLOAD, [issuer.bearer(OPERATOR, audience="another-service")]),
        "no token, admin": code_of(mesh, UNLOAD, []),
    }
    assert refused == {case: grpc.StatusCode.UNAUTHENTICATED for case in refused}
    assert reached(gateway) == []
    assert code_of(mesh, INFER, [issuer.bearer("alice")]) == grpc.StatusCode.OK
    assert code_of(mesh, INDEX, [issuer.bearer("alice")]) == grpc.StatusCode.OK
    assert reached(gateway) == [INFER, INDEX]
    metadata = gateway.calls[0][1]
    assert metadata["x-meshserve-subject"] == "alice"  # the verified `sub`, for the rate limit and the gateway
    assert metadata["authorization"].startswith("Bearer ")  # forwardOriginalToken: the gateway checks it again


def test_only_the_operator_loads_and_unloads(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks)
    for method in (LOAD, UNLOAD):
        assert code_of(mesh, method, [issuer.bearer("alice")]) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(mesh, method, [issuer.bearer("operator-ish")]) == grpc.StatusCode.PERMISSION_DENIED
    assert reached(gateway) == []
    for method in (LOAD, UNLOAD):
        assert code_of(mesh, method, [issuer.bearer(OPERATOR)]) == grpc.StatusCode.OK
    assert reached(gateway) == [LOAD, UNLOAD]


def test_a_forged_subject_header_never_reaches_the_gateway(
    make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer
) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks)
    forged = ("x-meshserve-subject", OPERATOR)
    assert code_of(mesh, INFER, [issuer.bearer("alice"), forged]) == grpc.StatusCode.OK
    assert code_of(mesh, UNLOAD, [issuer.bearer("alice"), forged]) == grpc.StatusCode.PERMISSION_DENIED
    assert health(mesh) == health_pb2.HealthCheckResponse.SERVING
    assert [md.get("x-meshserve-subject") for _, md in gateway.calls] == ["alice"]


def test_without_authentication_every_caller_gets_in_but_nobody_administers(
    make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer
) -> None:
    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks, authenticate=False)
    assert code_of(mesh, INFER, []) == grpc.StatusCode.OK
    assert code_of(mesh, INFER, [("authorization", "Bearer not.a.jwt")]) == grpc.StatusCode.OK  # not checked
    for method in (LOAD, UNLOAD):
        assert code_of(mesh, method, []) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(mesh, method, [issuer.bearer(OPERATOR)]) == grpc.StatusCode.PERMISSION_DENIED
    assert reached(gateway) == [INFER, INFER]
    assert health(mesh) == health_pb2.HealthCheckResponse.SERVING


def test_a_token_without_an_expiry_is_refused(make_mesh: MeshFactory, gateway: FakeReplica, issuer: Issuer) -> None:
    """Signed with the stack's key, right issuer and audience, but no `exp`: it would never expire."""
    import jwt

    mesh = make_mesh([], gateway=gateway.address, jwks=issuer.topology_jwks)
    claims = {"iss": tokens.LOCAL_ISSUER, "sub": "alice", "aud": tokens.AUDIENCE, "iat": int(time.time())}
    forever = jwt.encode(claims, issuer.key, algorithm=tokens.ALGORITHM, headers={"kid": tokens.KEY_ID})
    assert code_of(mesh, INFER, [("authorization", f"Bearer {forever}")]) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(mesh, UNLOAD, [("authorization", f"Bearer {forever}")]) == grpc.StatusCode.UNAUTHENTICATED
    assert reached(gateway) == []
    lasting = jwt.encode(
        {**claims, "exp": int(time.time()) + 600},
        issuer.key,
        algorithm=tokens.ALGORITHM,
        headers={"kid": tokens.KEY_ID},
    )
    assert code_of(mesh, INFER, [("authorization", f"Bearer {lasting}")]) == grpc.StatusCode.OK
    assert reached(gateway) == [INFER]
