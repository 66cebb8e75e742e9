"""Training features are point-in-time: serving a replayed event of the training stream gives what training used."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np
import pytest

from models import transactions
from models.feature_replay import replay
from models.fraud_mlp import FEATURE_SET, SEED
from services.common.server import GrpcService
from services.feature.api import to_row
from services.feature.handler import FeatureHandler
from services.protos import feature_pb2 as pb
from services.protos import feature_pb2_grpc as pb_grpc

Make = Callable[..., FeatureHandler]


@pytest.fixture(scope="module")
def stream() -> transactions.Stream:
    """The training stream of fraud_mlp (same seed, same size)."""
    return transactions.generate(SEED)


def _span(stream: transactions.Stream, days: int) -> tuple[int, int]:
    """Index of the first labelled event and of the first event `days` days after it."""
    times = stream.times
    first = int(np.searchsorted(times, stream.warmup_end))
    return first, int(np.searchsorted(times, stream.warmup_end + days * transactions.DAY_S))


def _pick(stream: transactions.Stream, first: int, end: int) -> list[int]:
    """A handful of events with history worth checking: fraud inside bursts, legitimate repeat customers."""
    rows = stream.rows
    last_seen: dict[str, int] = {}
    burst, repeat = [], []
    for i in range(end):
        user, t = rows[i]["user_id"], rows[i]["event_time"]
        previous = last_seen.get(user)
        if i >= first and previous is not None:
            if stream.labels[i] and t - previous < 600:
                burst.append(i)
            elif not stream.labels[i] and t - previous < 3 * transactions.DAY_S:
                repeat.append(i)
        last_seen[user] = t
    assert len(burst) >= 3 and len(repeat) >= 3
    return sorted([*burst[-3:], *repeat[:: max(1, len(repeat) // 3)][:3]])


async def _ingest(handler: FeatureHandler, rows: Sequence[dict[str, Any]]) -> None:
    for start in range(0, len(rows), handler.settings.max_batch):
        await handler.ingest(FEATURE_SET, rows[start : start + handler.settings.max_batch])


async def test_training_features_equal_serving_features_of_replayed_events(
    stream: transactions.Stream, make_handler: Make, feature_server: GrpcService
) -> None:
    first, end = _span(stream, 1)
    trainer = make_handler(key_prefix="train:", lookup_budget_ms=60_000.0)
    training = await replay(trainer, FEATURE_SET, stream.rows[:end], compute_from=first)
    names = trainer.feature_set(FEATURE_SET).names

    serving: FeatureHandler = feature_server.handler  # type: ignore[attr-defined]
    picked = _pick(stream, first, end)
    ingested = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{feature_server.port}") as channel:
        stub = pb_grpc.FeatureServiceStub(channel)
        for i in picked:  # the stream arrives in time order; each picked event is served as it arrives
            await _ingest(serving, stream.rows[ingested:i])
            ingested = i
            row = stream.rows[i]
            reply = await stub.Compute(pb.ComputeRequest(feature_set=FEATURE_SET, rows=[to_row(row)]), timeout=30)
            over_grpc = np.frombuffer(reply.features, dtype="<f4").reshape(1, 64)[0]
            assert not reply.flags[0].degraded
            in_process = (await serving.compute(FEATURE_SET, [row])).matrix[0]
            expected = training[i - first]
            for got in (over_grpc, in_process):
                differ = [names[j] for j in np.flatnonzero(got != expected)]
                assert not differ, f"event {i}: serving differs from training in {differ}"
            # the event itself (and anything else at its second) does not leak into its own features
            await _ingest(serving, [row])
            ingested = i + 1
            assert np.array_equal((await serving.compute(FEATURE_SET, [row])).matrix[0], expected)

    # the checked events had real history (not just defaults): fraud bursts show in the short windows
    bursts = [training[i - first, names.index("user_since_last")] for i in picked if stream.labels[i]]
    assert max(bursts) < np.log1p(600) and training[:, names.index("user_count_24h")].max() > 0


async def test_later_events_do_not_change_earlier_features(stream: transactions.Stream, make_handler: Make) -> None:
    first, end = _span(stream, 1)
    _, longer = _span(stream, 2)
    short = await replay(
        make_handler(key_prefix="a:", lookup_budget_ms=60_000.0), FEATURE_SET, stream.rows[:end], compute_from=first
    )
    long = await replay(
        make_handler(key_prefix="b:", lookup_budget_ms=60_000.0), FEATURE_SET, stream.rows[:longer], compute_from=first
    )
    assert np.array_equal(short, long[: end - first])
