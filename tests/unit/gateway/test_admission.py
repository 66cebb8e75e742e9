"""Admission control: fixed caps, priority shares, the total cap, and the latency-following limit."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument, ResourceExhausted
from services.gateway.admission import Admission, GradientLimit, Priority, current_permit, parse_priority


def test_a_pool_admits_up_to_its_cap_then_refuses_with_a_retry_hint() -> None:
    admission = Admission(total_cap=100, min_limit=1, low_priority_share=0.5, retry_after_ms=25)
    admission.add_pool("p", cap=4, adaptive=False)
    permits = [admission.acquire("p", Priority.HIGH) for _ in range(4)]
    with pytest.raises(ResourceExhausted) as info:
        admission.acquire("p", Priority.HIGH)
    assert "'p' has 4 in flight (limit 4)" in str(info.value)
    assert info.value.trailers == (("grpc-retry-pushback-ms", "25"),)
    permits[0].release()
    permits[0].release()  # a second release is a no-op
    assert admission.acquire("p", Priority.HIGH).pool.inflight == 4


def test_low_priority_gets_only_its_share() -> None:
    admission = Admission(total_cap=100, min_limit=1, low_priority_share=0.5, retry_after_ms=0)
    admission.add_pool("p", cap=10, adaptive=False)
    for _ in range(5):
        admission.acquire("p", Priority.LOW)
    with pytest.raises(ResourceExhausted, match="50% of it for low priority"):
        admission.acquire("p", Priority.LOW)
    for _ in range(4):  # normal may use 90%
        admission.acquire("p", Priority.NORMAL)
    with pytest.raises(ResourceExhausted):
        admission.acquire("p", Priority.NORMAL)
    admission.acquire("p", Priority.HIGH)  # high may use all of it
    assert admission.pools["p"].shed == {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 1}


def test_the_total_cap_holds_across_pools() -> None:
    admission = Admission(total_cap=3, min_limit=1, low_priority_share=1.0, retry_after_ms=0)
    admission.add_pool("a", cap=10, adaptive=False)
    admission.add_pool("b", cap=10, adaptive=False)
    admission.acquire("a", Priority.HIGH)
    admission.acquire("b", Priority.HIGH)
    admission.acquire("model:x", Priority.HIGH)  # forwarded models get a pool of their own
    with pytest.raises(ResourceExhausted, match="the gateway has 3 requests in flight"):
        admission.acquire("a", Priority.HIGH)


def test_a_parked_request_steps_out_of_its_pool_and_back_and_is_never_a_latency_sample_nor_a_drop() -> None:
    admission = Admission(total_cap=2, min_limit=1, low_priority_share=1.0, retry_after_ms=0)
    admission.add_pool("p", cap=2, adaptive=True)
    permit = admission.acquire("p", Priority.HIGH)
    assert current_permit() is permit  # what the activator finds when this request parks
    pool, limit = permit.pool, permit.pool.limit
    assert limit is not None
    permit.step_out()
    permit.step_out()  # once only
    assert (pool.inflight, admission.total_inflight) == (0, 0)
    others = [admission.acquire("p", Priority.HIGH) for _ in range(2)]  # its slot is free while it waits
    permit.step_in()
    assert (pool.inflight, admission.total_inflight) == (3, 3)  # back in flight even above the limit
    before = limit.limit
    permit.release(sample=True, dropped=True)  # its latency and its deadline were the cold start's
    assert (pool.inflight, limit.limit, limit._window) == (2, before, [])
    for other in others:
        other.release(sample=False)
    stepped = admission.acquire("p", Priority.HIGH)
    stepped.step_out()
    stepped.release(sample=False)  # released while out (its caller went): not counted twice
    stepped.step_in()  # nor again when its wait ends
    assert (pool.inflight, admission.total_inflight) == (0, 0)


def test_the_limit_shrinks_when_latency_rises_and_grows_back() -> None:
    limit = GradientLimit(initial=32, min_limit=4, max_limit=64, window=4, target_s=0.02)
    for _ in range(40):
        limit.on_sample(0.010, inflight=32)
    steady = limit.value
    assert steady >= 32
    for _ in range(80):
        limit.on_sample(0.100, inflight=steady)  # ten times slower: queueing
    shrunk = limit.value
    assert shrunk < steady / 2
    for _ in range(400):
        limit.on_sample(0.010, inflight=max(shrunk, limit.value))
    assert limit.value > shrunk * 2


def test_a_sustained_overload_keeps_the_limit_down() -> None:
    """Queueing past the target that lasts keeps the limit low (the excess is refused) for as long as it goes on,
    and the limit comes back when latency does."""
    limit = GradientLimit(initial=64, min_limit=16, max_limit=64, target_s=0.02)
    for _ in range(2000):
        limit.on_sample(0.010, inflight=limit.value)
    assert limit.value == 64
    for _ in range(9000):  # 5x the quiet latency for 9,000 requests (30 s at 300 req/s)
        limit.on_sample(0.050, inflight=limit.value)
    assert limit.value == 16  # (a symmetric latency baseline was back at the cap, 64, within 2,000)
    for _ in range(2000):
        limit.on_sample(0.010, inflight=limit.value)
    assert limit.value == 64


def test_the_limit_stays_within_bounds_and_backs_off_on_drops() -> None:
    limit = GradientLimit(initial=8, min_limit=4, max_limit=16, window=1)
    for _ in range(200):
        limit.on_sample(0.001, inflight=16)
    assert limit.value == 16
    for _ in range(50):
        limit.on_drop()
    assert limit.value == 4


def test_an_app_limited_pool_does_not_grow() -> None:
    limit = GradientLimit(initial=8, min_limit=1, max_limit=64, window=1)
    for _ in range(100):
        limit.on_sample(0.001, inflight=1)
    assert limit.value == 8


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, Priority.NORMAL),
        (0, Priority.NORMAL),
        (1, Priority.HIGH),
        (2, Priority.NORMAL),
        (7, Priority.LOW),
        ("high", Priority.HIGH),
        ("LOW", Priority.LOW),
    ],
)
def test_priority_parameter(value: str | int | None, expected: Priority) -> None:
    assert parse_priority(value) == expected


def test_a_bad_priority_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="high, normal or low"):
        parse_priority("urgent")


def test_a_slow_minority_does_not_shrink_the_limit() -> None:
    """A third of the answers held 2 s by a stopped replica is not queueing: the median stays put, the limit too."""
    limit = GradientLimit(initial=64, min_limit=16, max_limit=64, window=16, target_s=0.02)
    for _ in range(800):
        limit.on_sample(0.010, inflight=64)
    for i in range(1600):
        limit.on_sample(2.0 if i % 3 == 0 else 0.010, inflight=64)
    assert limit.value == 64


def test_healthy_latency_under_the_target_is_never_refused_more() -> None:
    """Latency that rises with load but stays under the target (bigger micro-batches at 90% of capacity) keeps
    the limit at its cap: only latency past the target is overload."""
    limit = GradientLimit(initial=64, min_limit=16, max_limit=64, target_s=0.25)
    for _ in range(500):
        limit.on_sample(0.020, inflight=64)  # 50% load
    for _ in range(5000):
        limit.on_sample(0.200, inflight=64)  # 90% load: ten times the latency, still under the target
    assert limit.value == 64
