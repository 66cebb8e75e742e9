"""A local process without the stack's credentials gets nothing from any port of the real local stack (`meshserve up`,
secure and --insecure) but the ingress: every listening TCP socket of its processes, walked from /proc, is the
ingress, or refuses such a caller (/metrics and /recording/* 401 with the line naming the header, the OTLP receiver
UNAUTHENTICATED, the trace UI its 401 page, Valkey NOAUTH), and answers one that holds the internal credential (the
UI: its own token; Valkey: its password). --insecure changes only the ingress; the stack's own users keep working:
`meshserve infer`, `meshserve status`, `meshserve traces ui`."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.cli.stack.credentials import StackSecrets, state_internal_token
from tests.helpers.cli_stack import FRAUD_ROW, NEEDS_STACK, Stack, local_stack, meshserve
from tests.helpers.sockets import walk_listening_sockets

pytestmark = NEEDS_STACK
ROW = {**FRAUD_ROW, "user_id": "closed-1"}
WILDCARD = ("0.0.0.0", "::", "")


@pytest.fixture(scope="module", params=[(), ("--insecure",)], ids=["secure", "insecure"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(tmp_path_factory.mktemp("closed") / "logs", args=request.param) as s:
        yield s


def dial(host: str) -> str:
    return "127.0.0.1" if host in WILDCARD else host


def request(
    host: str, port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(dial(host), port, timeout=10)
    try:
        connection.request(method, path, body=body, headers={"Host": f"127.0.0.1:{port}", **(headers or {})})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def refused_http(host: str, port: int, method: str, path: str, body: bytes | None = None) -> None:
    """401 without a credential and with a wrong one, its body one line naming the header to send."""
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        status, _, text = request(host, port, method, path, headers, body)
        assert status == 401, (port, method, path, headers, status, text[:200])
        assert text.count(b"\n") == 1 and b"Authorization: Bearer" in text, text


def check_internal_http(host: str, port: int, token: str) -> None:
    """/metrics and the recording admin routes refuse a caller without `token` and serve one with it."""
    collect = json.dumps({"trace_ids": [], "collector": "closed-test"}).encode()
    refused_http(host, port, "GET", "/metrics")
    refused_http(host, port, "POST", "/recording/collect", collect)
    refused_http(host, port, "POST", "/recording/trigger", json.dumps({"trace_id": "0" * 32, "trigger": "x"}).encode())
    bearer = {"Authorization": f"Bearer {token}"}
    status, _, text = request(host, port, "GET", "/metrics", bearer)
    assert status == 200 and b"python_info" in text, (port, status, text[:200])
    status, _, text = request(host, port, "POST", "/recording/collect", bearer, collect)
    if status == 405:  # a process that records nothing (the scaler): /metrics only
        return
    assert status == 200 and "lost" in json.loads(text), (port, status, text[:200])


def check_otlp(host: str, port: int, token: str) -> None:
    """Export refused UNAUTHENTICATED without `token` (a forged span never reaches the store), taken with it."""
    with grpc.insecure_channel(f"{dial(host)}:{port}") as channel:
        export = trace_service_pb2_grpc.TraceServiceStub(channel).Export
        for metadata in ((), (("authorization", "Bearer forged"),)):
            with pytest.raises(grpc.RpcError) as caught:
                export(trace_service_pb2.ExportTraceServiceRequest(), metadata=metadata, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value
        export(trace_service_pb2.ExportTraceServiceRequest(), metadata=(("authorization", f"Bearer {token}"),))


def check_ui(host: str, port: int, ui_token: str) -> None:
    """The trace UI's 401 page without its token; its login URL sets the cookie that lets the browser in."""
    for path in ("/", "/api/traces"):
        status, _, text = request(host, port, "GET", path)
        assert status == 401 and b"meshserve traces ui" in text, (path, status, text[:200])
    status, headers, _ = request(host, port, "GET", f"/?token={ui_token}")
    assert status == 303 and headers["Location"] == "/", (status, headers)
    cookie = headers["Set-Cookie"].split(";")[0]
    status, _, text = request(host, port, "GET", "/api/facets", {"Cookie": cookie})
    assert status == 200, (status, text[:200])


def check_valkey(host: str, port: int, password: str) -> None:
    """NOAUTH to a client without the password, PONG after AUTH."""
    with socket.create_connection((dial(host), port), timeout=10) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(200).startswith(b"-NOAUTH")
    with socket.create_connection((dial(host), port), timeout=10) as s:
        s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
        reply = b""
        while b"PONG" not in reply and len(reply) < 200:
            reply += s.recv(200)
        assert reply.startswith(b"+OK"), reply


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_every_listening_socket_but_the_ingress_refuses_a_caller_without_the_credential(stack: Stack) -> None:
    state = stack.state()
    secrets = StackSecrets(Path(state["secrets_dir"]))
    token = state_internal_token(state)
    assert token and token == secrets.internal_token()
    services = state["services"]
    pids = [s["pid"] for s in services if s.get("pid")] + ([state["pid"]] if state.get("pid") else [])
    listening = walk_listening_sockets(pids)
    ingress = port_of(state["ingress"])
    traces = port_of(next(s["address"] for s in services if s["name"] == "traces"))
    ui = urlsplit(state["traces_ui"]).port
    valkeys = {port_of(s["address"]) for s in services if s["protocol"] == "redis"}
    metrics = {s["metrics_port"] for s in services if s.get("metrics_port")}
    checked: dict[int, str] = {}
    for host, port in listening:
        if port == ingress:
            checked[port] = "ingress"
        elif port in valkeys:
            check_valkey(host, port, secrets.valkey_password())
            checked[port] = "valkey"
        elif port == traces:
            check_otlp(host, port, token)
            checked[port] = "otlp"
        elif port == ui:
            check_ui(host, port, secrets.ui_token())
            checked[port] = "trace ui"
        else:  # every other port is an internal HTTP endpoint: /metrics, the trace store's access log records
            check_internal_http(host, port, token)
            checked[port] = "metrics" if port in metrics else "recording"
    assert metrics <= set(checked), f"metrics ports not listening: {metrics - set(checked)}"
    kinds = set(checked.values())
    assert {"ingress", "otlp", "trace ui", "metrics", "recording", "valkey"} <= kinds, checked
    assert len(listening) >= len(metrics) + 5, listening  # nothing listened on the same port twice unchecked


def test_the_stacks_own_users_keep_working(stack: Stack) -> None:
    """A request through the ingress, `meshserve status`, and `meshserve traces ui` printing the UI's address with
    the token `meshserve up` printed (the trace path with the credential: tests/compat/test_retro_tracing_mesh.py)."""
    done = meshserve("infer", "fraud", "--json", json.dumps(ROW), "--log-dir", str(stack.log_dir), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    status = meshserve("status", "--log-dir", str(stack.log_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    ui_token = StackSecrets(Path(stack.state()["secrets_dir"])).ui_token()
    ui = meshserve("traces", "ui", "--db", str(stack.log_dir / "traces.sqlite"), "--no-browser")
    assert ui.returncode == 0 and f"?token={ui_token}" in ui.stdout, ui.stdout + ui.stderr
    assert f"?token={ui_token}" in stack.printed()  # `meshserve up` printed the login URL
