"""Who may load and unload through the gateway: the admin token, or a JWT (tokens.verify against the configured
JWKS) whose subject is the operator's; another subject is PERMISSION_DENIED, a JWT that does not verify
UNAUTHENTICATED; the forwarded call carries the model service's admin token, never the caller's credential."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.common import tokens
from services.common.errors import MeshserveError
from services.gateway.admission import Admission
from services.gateway.forwarding import Forwarder
from services.gateway.settings import GatewaySettings
from services.model.api import ModelClient
from services.protos import inference_pb2 as pb
from tests.unit.gateway.fake_services import FakeModelService, fake_services

KEY = tokens.new_signing_key()
JWKS = tokens.jwks(KEY)
ADMIN_TOKEN = "gateway-admin-token"
MODEL_TOKEN = "model-admin-token"


def bearer(credential: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"),)


@pytest.fixture()
async def rig() -> AsyncIterator[tuple[Forwarder, FakeModelService]]:
    async with fake_services() as (service, _, channel):
        admission = Admission(total_cap=2, min_limit=1, low_priority_share=0.5, retry_after_ms=50)
        forwarder = Forwarder(
            ModelClient(channel),
            admission,
            ["fraud"],
            admin_token=ADMIN_TOKEN,
            jwks=JWKS,
            model_admin_token=MODEL_TOKEN,
        )
        yield forwarder, service


async def load_and_unload(forwarder: Forwarder, headers: tuple[tuple[str, str], ...]) -> None:
    await forwarder.repository_model_load(pb.RepositoryModelLoadRequest(model_name="m"), 3.0, headers)
    await forwarder.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="m"), 3.0, headers)


async def refused(forwarder: Forwarder, headers: tuple[tuple[str, str], ...]) -> list[MeshserveError]:
    errors = []
    for call in (
        forwarder.repository_model_load(pb.RepositoryModelLoadRequest(model_name="m"), 3.0, headers),
        forwarder.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="m"), 3.0, headers),
    ):
        with pytest.raises(MeshserveError) as info:
            await call
        errors.append(info.value)
    return errors


@pytest.mark.parametrize("credential", [ADMIN_TOKEN, tokens.mint(KEY, tokens.OPERATOR_SUBJECT)])
async def test_the_admin_token_or_an_operator_jwt_passes_and_the_model_token_is_forwarded(
    rig: tuple[Forwarder, FakeModelService], credential: str
) -> None:
    forwarder, service = rig
    await load_and_unload(forwarder, bearer(credential))
    for rpc in ("RepositoryModelLoad", "RepositoryModelUnload"):
        assert service.requests[rpc].model_name == "m"
        assert service.metadata[rpc]["authorization"] == f"Bearer {MODEL_TOKEN}"


async def test_a_jwt_of_another_subject_is_permission_denied(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    for error in await refused(forwarder, bearer(tokens.mint(KEY, "alice"))):
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert "only the operator may (the JWT's subject is not 'operator')" in str(error)
        assert "alice" not in str(error)
    assert service.requests == {}


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (tokens.mint(KEY, tokens.OPERATOR_SUBJECT, ttl_s=-60), "the token has expired"),
        (tokens.mint(tokens.new_signing_key(), tokens.OPERATOR_SUBJECT), "signature does not verify"),
        (tokens.mint(KEY, tokens.OPERATOR_SUBJECT, issuer="https://elsewhere"), "InvalidIssuerError"),
        (tokens.mint(KEY, tokens.OPERATOR_SUBJECT, audience="other"), "InvalidAudienceError"),
        ("aaaa.bbbb.cccc", "the token is not valid"),
    ],
)
async def test_a_jwt_that_does_not_verify_is_unauthenticated(
    rig: tuple[Forwarder, FakeModelService], token: str, says: str
) -> None:
    forwarder, service = rig
    for error in await refused(forwarder, bearer(token)):
        assert error.code == grpc.StatusCode.UNAUTHENTICATED
        assert "the bearer JWT is refused" in str(error) and says in str(error)
        assert token not in str(error)
    assert service.requests == {}


@pytest.mark.parametrize(
    "headers",
    [(), bearer("wrong"), (("authorization", ADMIN_TOKEN),), (("x-admin", ADMIN_TOKEN),), bearer("")],
)
async def test_other_credentials_are_permission_denied_and_say_what_is_expected(
    rig: tuple[Forwarder, FakeModelService], headers: tuple[tuple[str, str], ...]
) -> None:
    forwarder, service = rig
    for error in await refused(forwarder, headers):
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert str(error).endswith(
            "only the operator may (send 'authorization: Bearer <MESHSERVE_GATEWAY_ADMIN_TOKEN>' or "
            "'authorization: Bearer <JWT of subject 'operator'>')"
        )
        assert "wrong" not in str(error) and ADMIN_TOKEN not in str(error)
    assert service.requests == {}


async def test_with_only_a_jwks_the_static_token_means_nothing(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    forwarder.admin_token = ""
    for error in await refused(forwarder, bearer(ADMIN_TOKEN)):
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
        assert str(error).endswith("(send 'authorization: Bearer <JWT of subject 'operator'>')")
    await load_and_unload(forwarder, bearer(tokens.mint(KEY, tokens.OPERATOR_SUBJECT)))
    assert service.metadata["RepositoryModelLoad"]["authorization"] == f"Bearer {MODEL_TOKEN}"


async def test_with_only_a_static_token_a_jwt_is_not_looked_at(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    forwarder.jwks = ""
    for error in await refused(forwarder, bearer(tokens.mint(KEY, tokens.OPERATOR_SUBJECT))):
        assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert service.requests == {}


async def test_the_forwarded_credential_defaults_to_the_admin_token_and_may_be_none(
    rig: tuple[Forwarder, FakeModelService],
) -> None:
    forwarder, service = rig
    forwarder.model_admin_token = None
    await load_and_unload(forwarder, bearer(ADMIN_TOKEN))
    assert service.metadata["RepositoryModelLoad"]["authorization"] == f"Bearer {ADMIN_TOKEN}"
    forwarder.model_admin_token = ""
    await load_and_unload(forwarder, bearer(ADMIN_TOKEN))
    assert "authorization" not in service.metadata["RepositoryModelUnload"]


def test_settings_read_the_jwks_inline_or_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(JWKS + "\n")
    assert GatewaySettings(jwks=JWKS).jwks == JWKS
    assert GatewaySettings(jwks=str(path)).jwks == JWKS
    assert GatewaySettings().jwks == ""
    env = GatewaySettings.env_for(jwks=str(path))
    assert env == {"MESHSERVE_GATEWAY_JWKS": JWKS}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("/no/such/jwks.json", "nor a readable file"),
        ("{not json", "not a JWKS document"),
        ('{"keys": []}', "has no keys"),
        (json.dumps({"kty": "EC"}), "has no keys"),
    ],
)
def test_settings_refuse_a_jwks_that_is_not_one(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        GatewaySettings(jwks=value)


def test_settings_name_the_model_service_credential() -> None:
    assert GatewaySettings(admin_token=ADMIN_TOKEN).model_operator_token() == ADMIN_TOKEN  # type: ignore[arg-type]
    settings = GatewaySettings(admin_token=ADMIN_TOKEN, model_admin_token=MODEL_TOKEN)  # type: ignore[arg-type]
    assert settings.model_operator_token() == MODEL_TOKEN
    assert GatewaySettings(admin_token=ADMIN_TOKEN, model_admin_token="").model_operator_token() == ""  # type: ignore[arg-type]
