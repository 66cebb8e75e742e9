"""OnlineStore's marker reads and writes (`_check`) and its reading of WAITAOF's reply (`_confirmed`), in process:
the commands go to a dict standing in for Redis's keyspace (no server here; tests on a real one are in
tests/integration/feature/test_durability.py)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from services.feature.store import NotDurable, OnlineStore
from services.feature.store.generation import Generation, Loss


class Keyspace:
    """GET and SET NX over a dict; `steal` makes the next SET NX lose to another replica's marker."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.steal: Generation | None = None
        self.sent: list[str] = []

    async def __call__(self, *args: Any) -> Any:
        self.sent.append(args[0])
        if args[0] == "GET":
            return self.keys.get(args[1])
        assert args[0] == "SET" and args[3] == "NX"
        if self.steal is not None:
            self.keys[args[1]], self.steal = self.steal.encode(), None
        if args[1] in self.keys:
            return None
        self.keys[args[1]] = args[2]
        return True


@pytest.fixture()
async def store(refused_url: str) -> Any:
    losses: list[Loss] = []
    s = OnlineStore(refused_url, "p:", max_connections=2, on_loss=losses.append)
    s.losses = losses  # type: ignore[attr-defined]
    yield s
    await s.close()


async def test_a_new_store_gets_a_marker_and_a_wiped_one_a_new_marker_with_its_loss(store: Any) -> None:
    redis = Keyspace()
    await store._check(redis)
    first = Generation.decode(redis.keys["p:generation"])
    assert first is not None and first.reset_at == 0.0 and store.watch.current == first
    await store._check(redis)
    assert redis.sent == ["GET", "SET", "GET"] and store.losses == []  # one GET a check while it is there
    redis.keys.clear()  # FLUSHALL
    await store._check(redis)
    second = Generation.decode(redis.keys["p:generation"])
    assert second is not None and second.id != first.id and second.reset_at > 0
    assert store.watch.reset_at == second.reset_at
    assert store.losses == [Loss(second.reset_at, noticed_here=True)]


async def test_a_replica_that_loses_the_race_adopts_the_winners_marker(store: Any) -> None:
    redis = Keyspace()
    await store._check(redis)
    redis.keys.clear()
    theirs = Generation.new(1_900_000_000.0, reset_at=1_900_000_000.0)
    redis.steal = theirs  # another replica's SET NX lands first
    await store._check(redis)
    assert store.watch.current == theirs and redis.keys["p:generation"] == theirs.encode()
    assert store.losses == [Loss(theirs.reset_at, noticed_here=False)]


def test_waitaof_says_whether_the_write_is_on_disk(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    store._confirmed([1, 0])
    assert store.durable is True
    with pytest.raises(NotDurable):
        store._confirmed([0, 0])  # not fsynced within the timeout
    store._confirmed(ResponseError("ERR unknown command 'WAITAOF'"))  # a server before Redis 7.2
    assert store.durable is False and "unknown command" in store.not_durable_why
    store._confirmed(ResponseError("WAITAOF cannot be used when numlocal is set but appendonly is disabled."))
    assert store.durable is False and "appendonly" in store.not_durable_why
    said = [r for r in caplog.records if "cannot confirm writes on disk" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"  # once, not on every Ingest
