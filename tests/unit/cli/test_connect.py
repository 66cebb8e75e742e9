"""How the CLI reaches the stack: TLS with the stack's CA and a minted token when stack.json says the ingress is
secure, the --ca / --token flags for another stack, plaintext otherwise; against an in-process TLS server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from rich.console import Console
from typer.testing import CliRunner

from services.cli.connect import ConnectError, Endpoint, resolve, same_address
from services.cli.demo import run_demo
from services.cli.infer import infer
from services.cli.main import app
from services.cli.stack.credentials import StackSecrets
from services.cli.stack.state import STATE_FILE
from services.cli.status import check_all, grpc_status
from services.common import tokens
from services.protos import inference_pb2_grpc
from tests.helpers.servers import free_port
from tests.unit.cli.test_client_commands import ROW, FakeGateway


class TokenGateway(FakeGateway):
    """The fake gateway behind an ingress that wants a bearer token signed by the stack's key."""

    def __init__(self, jwks: str) -> None:
        super().__init__()
        self.jwks = jwks
        self.subjects: set[str] = set()

    def _check(self, context: grpc.ServicerContext) -> None:
        header = dict(context.invocation_metadata()).get("authorization", "")
        try:
            self.subjects.add(tokens.verify(header.removeprefix("Bearer "), self.jwks).subject)
        except tokens.TokenError:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Jwt is missing")

    def ModelMetadata(self, request, context):
        self._check(context)
        return super().ModelMetadata(request, context)

    def ModelInfer(self, request, context):
        self._check(context)
        return super().ModelInfer(request, context)


@pytest.fixture()
def secure_stack(tmp_path: Path) -> Iterator[tuple[Path, TokenGateway, str]]:
    """A TLS server with the stack's ingress certificate, and the stack.json that names it as the ingress."""
    secrets = StackSecrets.ensure(tmp_path)
    servicer = TokenGateway(secrets.jwks())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    checks = health.HealthServicer()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = free_port()
    credentials = grpc.ssl_server_credentials([(secrets.ingress_key.read_bytes(), secrets.ingress_cert.read_bytes())])
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    address = f"127.0.0.1:{port}"
    state = {
        "ingress": address,
        "gateway": "127.0.0.1:1",
        "insecure": False,
        "tls_ca": str(secrets.ca_cert),
        "secrets_dir": str(secrets.dir),
        "services": [],
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    yield tmp_path, servicer, address
    server.stop(0)


def test_loopback_names_are_one_host() -> None:
    assert same_address("127.0.0.1:8080", "localhost:8080") and same_address("[::1]:8080", "127.0.0.1:8080")
    assert not same_address("127.0.0.1:8080", "127.0.0.1:8081") and not same_address("10.0.0.1:80", "10.0.0.2:80")


def test_the_secure_stacks_ingress_gets_tls_and_a_minted_token(
    secure_stack: tuple[Path, TokenGateway, str],
) -> None:
    log_dir, servicer, address = secure_stack
    endpoint = resolve(address, log_dir)
    assert endpoint.tls and endpoint.root_certificates == StackSecrets.of(log_dir).ca_pem()
    assert endpoint.token is not None
    assert tokens.verify(endpoint.token, StackSecrets.of(log_dir).jwks()).subject == "meshserve-cli"
    assert dict(endpoint.metadata())["authorization"] == f"Bearer {endpoint.token}"
    assert resolve(address.replace("127.0.0.1", "localhost"), log_dir).tls
    result = infer(endpoint, "fraud", ROW)
    assert result["outputs"] == {"score": [[0.25]]} and "meshserve-cli" in servicer.subjects
    assert grpc_status(address, root_certificates=endpoint.root_certificates) == "SERVING"

    gateway = resolve("127.0.0.1:1", log_dir)  # a gateway's own port: plaintext, as the gateway serves it
    assert gateway == Endpoint("127.0.0.1:1")
    assert resolve(address, tmp_empty := log_dir / "none") == Endpoint(address) and not tmp_empty.exists()


def test_flags_reach_another_stack_and_errors_say_what_is_missing(
    secure_stack: tuple[Path, TokenGateway, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    log_dir, servicer, address = secure_stack
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    secrets = StackSecrets.of(log_dir)
    token = secrets.mint("remote-client")
    endpoint = resolve(address, elsewhere, token=token, ca=secrets.ca_cert)
    assert infer(endpoint, "fraud", ROW)["outputs"] == {"score": [[0.25]]} and "remote-client" in servicer.subjects
    with pytest.raises(ConnectError, match="--ca"):
        resolve(address, elsewhere, ca=elsewhere / "missing.pem")

    runner = CliRunner()
    ok = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", address, "--log-dir", str(log_dir)])
    assert ok.exit_code == 0, ok.output
    flags = ["--ca", str(secrets.ca_cert), "--log-dir", str(elsewhere)]
    no_token = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", address, *flags])
    assert no_token.exit_code == 1 and "UNAUTHENTICATED" in no_token.output and "meshserve token" in no_token.output
    with_token = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", address, *flags, "--token", token])
    assert with_token.exit_code == 0, with_token.output
    plain = runner.invoke(app, ["infer", "fraud", "--json", ROW, "--address", address, "--log-dir", str(elsewhere)])
    assert plain.exit_code == 1 and "UNAVAILABLE" in plain.output


async def test_the_demo_runs_over_tls_with_a_token(secure_stack: tuple[Path, TokenGateway, str]) -> None:
    log_dir, servicer, address = secure_stack
    summary = await run_demo(resolve(address, log_dir, subject="demo"), duration_s=0.5, concurrency=2, live=False)
    assert summary.ok > 0 and not summary.errors and "demo" in servicer.subjects


def test_status_checks_the_secure_ingress_over_tls(secure_stack: tuple[Path, TokenGateway, str]) -> None:
    log_dir, _, address = secure_stack
    console = Console(record=True, width=200)
    assert check_all(log_dir, 8000, console) == 0
    printed = console.export_text()
    assert "ingress" in printed and "SERVING" in printed
    assert grpc_status(address, timeout_s=1.0) == "DOWN"  # plaintext to a TLS port: nothing it understands
