"""`meshserve status` against in-process health servers, and the copy-paste help printed after the demo."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from rich.console import Console

from services.cli.howto import how_to_call
from services.cli.stack.state import STATE_FILE
from services.cli.status import check_all, grpc_status, targets
from tests.helpers.servers import free_port


@pytest.fixture()
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


class Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"LIVE")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def ready_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ready"
    server.shutdown()
    server.server_close()


def test_grpc_status_names_the_serving_state(health_server: tuple[str, health.HealthServicer]) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert grpc_status(address) == "SERVING"
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert grpc_status(address) == "NOT_SERVING"
    assert grpc_status(f"127.0.0.1:{free_port()}", timeout_s=0.5) == "DOWN"


def test_status_reads_the_running_stack_and_reports_each_process(
    tmp_path: Path, health_server: tuple[str, health.HealthServicer], ready_url: str
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    state = {
        "ingress": address,
        "services": [
            {"name": "gateway", "address": address, "health_url": None, "pid": 1},
            {"name": "envoy", "address": None, "health_url": ready_url, "pid": 2},
        ],
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert [(p.name, p.kind, p.target) for p in targets(tmp_path, 8000)] == [
        ("gateway", "grpc", address),
        ("envoy", "http", ready_url),
        ("ingress", "grpc", address),
    ]
    console = Console(record=True, width=200)
    assert check_all(tmp_path, 8000, console) == 0
    printed = console.export_text()
    assert printed.count("SERVING") == 2 and "READY" in printed
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert check_all(tmp_path, 8000, Console(record=True, width=200)) == 1


def test_status_shows_the_replicas_per_subset_and_the_last_decision(
    tmp_path: Path, health_server: tuple[str, health.HealthServicer]
) -> None:
    from services.cli.stack.autoscaler import AUTOSCALE_FILE
    from services.cli.stack.scaling import Decision
    from services.cli.status import replica_rows

    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    down = f"127.0.0.1:{free_port()}"
    state = {
        "services": [
            {"name": "model-v1-a", "address": address, "pid": 1},
            {"name": "model-v2", "address": down, "pid": 2},  # spawned by the autoscaler, not SERVING yet
        ],
        "groups": [
            {"subset": "v1", "model": "fraud_mlp", "min": 1, "max": 1, "replicas": ["model-v1-a"]},
            {"subset": "v2", "model": "fraud_mlp", "min": 0, "max": 1, "replicas": ["model-v2"]},
        ],
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    woke = Decision(1_700_000_000.0, "v2", 0, 1, "activated: demand 2").to_dict()
    scaling = {"groups": {"v2": {"replicas": 0, "running": []}}, "decisions": [woke]}
    (tmp_path / AUTOSCALE_FILE).write_text(json.dumps(scaling))
    assert replica_rows(tmp_path) == [
        ("v1", "1 / 1 / 1", "(fixed)", ""),
        ("v2", "0 / 0 / 1", "fraud_mlp", "2023-11-14T22:13:20.000+00:00: 0 -> 1 (activated: demand 2)"),
    ]
    console = Console(record=True, width=200)
    assert check_all(tmp_path, 8000, console) == 0  # starting is not failing
    printed = console.export_text()
    assert "STARTING" in printed and "model replicas" in printed and "0 / 0 / 1" in printed
    scaling["groups"]["v2"] = {"replicas": 1, "running": ["model-v2"]}  # counted: now it must serve
    (tmp_path / AUTOSCALE_FILE).write_text(json.dumps(scaling))
    console = Console(record=True, width=200)
    assert check_all(tmp_path, 8000, console) == 1 and "DOWN" in console.export_text()


def test_without_a_running_stack_status_checks_the_default_layout(tmp_path: Path) -> None:
    found = {p.name: (p.kind, p.target) for p in targets(tmp_path, 8000)}
    sockets = tmp_path.resolve() / "sockets"  # the services of a stack with this log dir listen there
    assert found["gateway"] == ("grpc", f"unix:{sockets}/gateway.sock")
    assert found["model-v1-a"] == ("grpc", f"unix:{sockets}/model-v1-a.sock")
    assert found["model-v2"] == ("grpc", f"unix:{sockets}/model-v2.sock")
    assert found["cache"] == ("grpc", f"unix:{sockets}/cache.sock")
    assert found["valkey"] == ("redis", "127.0.0.1:8004")


def test_how_to_call_shows_the_address_in_every_example() -> None:
    text = how_to_call("127.0.0.1:18080")
    assert text.count("127.0.0.1:18080") >= 4
    assert 'InferenceServerClient("127.0.0.1:18080")' in text and "grpcurl -plaintext 127.0.0.1:18080" in text
    assert "meshserve infer fraud --address 127.0.0.1:18080" in text


def test_how_to_call_a_secure_ingress_uses_the_ca_and_a_token_everywhere() -> None:
    ca = Path("/logs/secrets/ca.pem")
    text = how_to_call("127.0.0.1:18080", ca, Path("/logs"))
    assert "export TOKEN=$(meshserve token my-client --log-dir /logs)" in text
    assert 'InferenceServerClient("127.0.0.1:18080", ssl=True, root_certificates="/logs/secrets/ca.pem")' in text
    assert 'headers={"authorization": "Bearer " + os.environ["TOKEN"]}' in text
    assert text.count('grpcurl -cacert /logs/secrets/ca.pem -H "authorization: Bearer $TOKEN"') == 2
    assert "--ssl-grpc-use-ssl true --ssl-grpc-root-certifications-file /logs/secrets/ca.pem" in text
    assert '-H "authorization:Bearer $TOKEN"' in text
    assert "-plaintext" not in text and "meshserve infer fraud --address 127.0.0.1:18080 --log-dir /logs" in text


def test_how_to_call_gives_perf_analyzer_from_its_virtualenv_with_rows_the_pipeline_accepts() -> None:
    """perf_analyzer is not on the PATH (it lives in .venv-perf, beside the libcudart it loads), and its default
    random input is refused by the pipeline, so the example names the binary and a file of real rows."""
    import json

    from services.cli.howto import FRAUD_ROWS, PERF_VENV

    text = how_to_call("127.0.0.1:18080", Path("/logs/secrets/ca.pem"), Path("/logs"))
    assert f"{PERF_VENV}/bin/perf_analyzer -m fraud -i grpc -u 127.0.0.1:18080 --input-data {FRAUD_ROWS}" in text
    assert f"export LD_LIBRARY_PATH=$(echo {PERF_VENV}/lib/python3*/site-packages/nvidia/cuda_runtime/lib)" in text
    rows = json.loads(FRAUD_ROWS.read_text())["data"]
    assert rows and {"event_time", "user_id", "amount", "card_present"} <= set(rows[0])
    assert "--input-data zero" not in text and "README shows" not in text
