"""The operator check of a service's state-changing RPCs: they pass for `authorization: Bearer <admin token>`
(compared in constant time), or for every caller when the service has no admin token (said once at start)."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence

import grpc

from services.common.errors import MeshserveError, error_with_code

AUTHORIZATION = "authorization"

Metadata = Iterable[tuple[str, str | bytes]]


def bearer_credential(metadata: Metadata | None) -> str | None:
    """The credential of the call's `authorization: Bearer <credential>` header; None when it has none."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION or not isinstance(value, str):
            continue
        scheme, _, credential = value.strip().partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            return credential.strip()
    return None


def same_secret(sent: str, expected: str) -> bool:
    """Whether `sent` is `expected`, in time that depends on neither (both are hashed first, so not even on the
    length of the common prefix or of either value)."""
    return hmac.compare_digest(hashlib.sha256(sent.encode()).digest(), hashlib.sha256(expected.encode()).digest())


def permission_denied(message: str) -> MeshserveError:
    return error_with_code(grpc.StatusCode.PERMISSION_DENIED, message)


class OperatorCheck:
    """The admin token of one service and the check its state-changing `rpcs` make before doing anything.

    `setting` is the environment variable the token comes from: refusals name it (the credential expected),
    never what the caller sent.
    """

    def __init__(self, token: str, setting: str, rpcs: Sequence[str]) -> None:
        self._token = token
        self.setting = setting
        self.rpcs = tuple(rpcs)

    @property
    def open(self) -> bool:
        """True when the service has no admin token: every caller that reaches the port may call `rpcs`."""
        return not self._token

    def announce(self, log: logging.Logger) -> None:
        """One line at start: a WARNING while the RPCs are open, else which credential they need."""
        rpcs = ", ".join(self.rpcs)
        one = len(self.rpcs) == 1
        if self.open:
            log.warning(
                "%s %s open to any caller that reaches this port: %s is not set (set it to require the operator)",
                rpcs,
                "is" if one else "are",
                self.setting,
            )
        else:
            log.info("%s %s the operator's token (%s)", rpcs, "needs" if one else "need", self.setting)

    def allows(self, metadata: Metadata | None) -> bool:
        """Whether a call with these headers may call the state-changing RPCs."""
        if self.open:
            return True
        credential = bearer_credential(metadata)
        return credential is not None and same_secret(credential, self._token)

    def require(self, context: grpc.aio.ServicerContext, rpc: str) -> None:
        """PERMISSION_DENIED (raised, for the shared interceptor to send) unless the caller is the operator."""
        if not self.allows(context.invocation_metadata()):
            raise permission_denied(
                f"{rpc} changes this service's state: only the operator may "
                f"(send 'authorization: Bearer <{self.setting}>')"
            )


OPEN = OperatorCheck("", "", ())
"""No admin token: what a servicer built without one (a test, an embedded use) does."""
