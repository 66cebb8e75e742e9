"""The Redis tier without a Redis: its connection (the shared factory, a 1 s command timeout), the replicas'
invalidation messages, the circuit, and failures that are raised (the handler turns them into misses)."""

from __future__ import annotations

import pytest

from services.cache.domain import Invalidation
from services.cache.redis_tier import (
    COMMAND_TIMEOUT_S,
    FAILURES,
    Circuit,
    RedisTier,
    decode_invalidation,
    encode_invalidation,
    glob_literal,
)
from services.common.redis import CONNECT_TIMEOUT_S


async def test_the_connection_fails_fast_and_never_retries(refused_redis_url: str) -> None:
    tier = RedisTier(refused_redis_url, "p:", circuit_failures=2, probe_interval_s=30, max_connections=7)
    try:
        pool = tier.client.connection_pool
        assert COMMAND_TIMEOUT_S == 1.0
        assert pool.connection_kwargs["socket_timeout"] == COMMAND_TIMEOUT_S
        assert pool.connection_kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S
        assert pool.max_connections == 7
        with pytest.raises(FAILURES) as err:
            await tier.mget([b"k"], budget_s=1.0)
        tier.failed("lookup", err.value)
        assert tier.available() and tier.errors == 1
        tier.failed("lookup", err.value)
        assert not tier.available()  # the second failure in a row opened the circuit (and a probe runs)
        assert not await tier.ping()
    finally:
        await tier.close()


def test_the_circuit_opens_after_consecutive_failures_only() -> None:
    circuit = Circuit(threshold=3)
    assert not circuit.failure() and not circuit.failure()
    circuit.success()  # a success in between starts the count again
    assert not circuit.failure() and not circuit.failure()
    assert circuit.failure() and circuit.open
    assert not circuit.failure()  # already open: opened once
    circuit.close()
    assert not circuit.open and circuit.failures == 0


def test_invalidation_messages_between_replicas() -> None:
    cases = {
        Invalidation(pipeline="fraud"): b"p\0fraud",
        Invalidation(model_name="fraud_mlp", model_version="2"): b"m\0fraud_mlp\x002",
        Invalidation(model_name="fraud_mlp"): b"m\0fraud_mlp\0",  # every version
    }
    for invalidation, message in cases.items():
        assert encode_invalidation(invalidation) == message  # the format every running replica reads
        assert decode_invalidation(message) == invalidation


def test_a_glob_literal_escapes_every_pattern_character() -> None:
    assert glob_literal(b"idx:m:12:probe_glob_?:") == b"idx:m:12:probe_glob_\\?:"
    assert glob_literal(b"a*b[c]d\\e") == b"a\\*b\\[c\\]d\\\\e"
    assert glob_literal(b"plain:name-1") == b"plain:name-1"
