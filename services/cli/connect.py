"""How a CLI client reaches the stack: plaintext or TLS (trusting the stack's CA), with or without a bearer token,
from the `--token` / `--ca` flags or from the running local stack's stack.json and secrets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from services.cli.stack.credentials import SecretsError, StackSecrets
from services.cli.stack.state import read_state

CLI_SUBJECT = "meshserve-cli"
CLI_TOKEN_TTL_S = 3600.0
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class ConnectError(ValueError):
    """The flags or the stack's files do not give a usable connection (the message says which file or flag)."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call: `address`, TLS when `root_certificates` is set, `token` sent as a bearer token."""

    address: str
    root_certificates: bytes | None = None
    token: str | None = None

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata every RPC carries (the authorization header, when there is a token)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)

    def channel(self) -> grpc.Channel:
        if self.root_certificates is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self._credentials())

    def aio_channel(self) -> grpc.aio.Channel:
        if self.root_certificates is None:
            return grpc.aio.insecure_channel(self.address)
        return grpc.aio.secure_channel(self.address, self._credentials())


def same_address(a: str, b: str) -> bool:
    """host:port equal, counting every loopback name as one host."""
    ha, _, pa = a.rpartition(":")
    hb, _, pb = b.rpartition(":")
    return pa == pb and (ha == hb or (ha in LOOPBACK and hb in LOOPBACK))


def stack_endpoint(state: dict, address: str | None = None, subject: str = CLI_SUBJECT) -> Endpoint:
    """The secure stack's ingress as stack.json describes it (or `address`): TLS with its CA, a fresh token for
    `subject` minted from its signing key; the insecure stack's: plaintext, no token."""
    address = address or state.get("ingress") or state["gateway"]
    if state.get("insecure", True) or not state.get("tls_ca"):
        return Endpoint(address)
    try:
        ca = Path(state["tls_ca"]).read_bytes()
        token = StackSecrets(Path(state["secrets_dir"])).mint(subject, CLI_TOKEN_TTL_S)
    except (OSError, KeyError) as e:
        raise ConnectError(f"the stack's TLS CA or signing key cannot be read: {e}") from None
    except SecretsError as e:
        raise ConnectError(str(e)) from None
    return Endpoint(address, ca, token)


def resolve(
    address: str,
    log_dir: Path | None = None,
    token: str | None = None,
    ca: Path | None = None,
    subject: str = CLI_SUBJECT,
) -> Endpoint:
    """The endpoint a command calls at `address`.

    `--ca` (TLS trusting that file) and `--token` win. Otherwise, when `address` is the ingress of the stack whose
    stack.json is in `log_dir` and that stack is secure, TLS with its CA and a token minted from its secrets (for
    `subject`, valid an hour). Anything else (the insecure stack, a gateway's own port): plaintext, no token.
    """
    root = None
    if ca is not None:
        try:
            root = ca.read_bytes()
        except OSError as e:
            raise ConnectError(f"--ca {ca}: {e.strerror}") from None
    state = read_state(log_dir) if log_dir is not None else None
    ours = state is not None and bool(state.get("ingress")) and same_address(address, state["ingress"])
    if ours and state is not None and (root is None or token is None):
        local = stack_endpoint(state, address, subject)
        root = root if root is not None else local.root_certificates
        token = token if token is not None else local.token
    return Endpoint(address, root, token or None)
