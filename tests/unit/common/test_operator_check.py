"""The operator check: which headers carry the operator's bearer token, what a refusal says (the credential
expected, never what was sent), an empty token open to all, and the one line it logs at start."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from services.common.errors import MeshserveError
from services.common.operator_check import OPEN, OperatorCheck, bearer_credential, same_secret

TOKEN = "s3cret-operator-token"
CHECK = OperatorCheck(TOKEN, "MESHSERVE_X_ADMIN_TOKEN", ("Wipe",))


class Context:
    """The one thing the check reads from a grpc.aio.ServicerContext."""

    def __init__(self, *metadata: tuple[str, Any]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self.metadata


@pytest.mark.parametrize(
    ("metadata", "credential"),
    [
        ((), None),
        ((("authorization", f"Bearer {TOKEN}"),), TOKEN),
        ((("authorization", f"bearer   {TOKEN} "),), TOKEN),
        ((("Authorization", f"Bearer {TOKEN}"),), TOKEN),
        ((("authorization", "Bearer "),), None),
        ((("authorization", TOKEN),), None),
        ((("authorization", f"Basic {TOKEN}"),), None),
        ((("authorization", f"Bearer {TOKEN}".encode()),), None),  # a binary value is no credential
        ((("x-token", f"Bearer {TOKEN}"),), None),
        ((("x", "y"), ("authorization", "Basic a"), ("authorization", "Bearer b")), "b"),
    ],
)
def test_the_bearer_credential_of_a_call(metadata: tuple[tuple[str, Any], ...], credential: str | None) -> None:
    assert bearer_credential(metadata) == credential


def test_secrets_compare_by_value() -> None:
    assert same_secret(TOKEN, TOKEN)
    assert not same_secret(TOKEN[:-1], TOKEN)
    assert not same_secret(TOKEN + "x", TOKEN)
    assert not same_secret("", TOKEN)


def test_only_the_operator_token_passes() -> None:
    CHECK.require(Context(("authorization", f"Bearer {TOKEN}")), "Wipe")  # type: ignore[arg-type]
    for sent in ((), (("authorization", "Bearer guess-123"),), (("authorization", TOKEN),)):
        with pytest.raises(MeshserveError) as info:
            CHECK.require(Context(*sent), "Wipe")  # type: ignore[arg-type]
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
        message = str(info.value)
        assert message == (
            "Wipe changes this service's state: only the operator may "
            "(send 'authorization: Bearer <MESHSERVE_X_ADMIN_TOKEN>')"
        )
        assert "guess-123" not in message and TOKEN not in message


def test_without_a_token_every_caller_passes() -> None:
    open_check = OperatorCheck("", "MESHSERVE_X_ADMIN_TOKEN", ("Wipe",))
    assert open_check.open and OPEN.open and not CHECK.open
    open_check.require(Context(), "Wipe")  # type: ignore[arg-type]
    OPEN.require(Context(("authorization", "Bearer anything")), "Wipe")  # type: ignore[arg-type]


def test_it_says_at_start_whether_the_rpcs_are_open(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.operator")
    with caplog.at_level(logging.INFO, logger="test.operator"):
        OperatorCheck("", "MESHSERVE_X_ADMIN_TOKEN", ("Load", "Unload")).announce(log)
        CHECK.announce(log)
    (warning, info) = caplog.records
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        "Load, Unload are open to any caller that reaches this port: MESHSERVE_X_ADMIN_TOKEN is not set "
        "(set it to require the operator)"
    )
    assert info.levelno == logging.INFO
    assert info.getMessage() == "Wipe needs the operator's token (MESHSERVE_X_ADMIN_TOKEN)"
    assert TOKEN not in caplog.text
