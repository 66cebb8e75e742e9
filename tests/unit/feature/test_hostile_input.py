"""What a hostile or careless caller sends the feature handler, refused before the store is touched: values its
aggregates cannot hold in FP32, oversized strings, non-finite budgets; and error messages that stay short.

The handlers' store refuses connections, so a request that got as far as Redis would fail UNAVAILABLE (ingest)
or degrade (compute) instead of being refused INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.feature.featureset import load_feature_sets
from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings
from services.feature.spec import FeatureSetError
from tests.helpers.fixtures import AGG_YAML, T0, fraud_row

Make = Callable[..., FeatureHandler]
FP32_MAX = float(np.finfo(np.float32).max)
MESSAGE_LIMIT = 300  # characters: every message here stays well under Envoy's header limits


def event(**overrides: object) -> dict[str, object]:
    return {"event_time": T0 - 4000, "user_id": "u", "merchant_id": "m", "device_id": "d", "amount": 1.0, **overrides}


# -- values the aggregates cannot hold -----------------------------------------------------------------


async def test_ingest_refuses_a_value_its_aggregates_cannot_hold_in_fp32(make_offline_handler: Make) -> None:
    handler = make_offline_handler()
    for amount in (1e39, -1e39, FP32_MAX * 1.0001):
        with pytest.raises(InvalidArgument) as err:
            await handler.ingest("fraud_v1", [event(), event(amount=amount)])
        message = str(err.value)
        assert message.startswith("event 1: field 'amount'"), message
        assert "FP32" in message and len(message) < MESSAGE_LIMIT
    with pytest.raises(InvalidArgument, match=r"\|x\| <= 1.4178431e\+37"):  # user_sum_amount_24h: 24 buckets
        await handler.ingest("fraud_v1", [event(amount=3e38)])
    with pytest.raises(Unavailable):  # a value its aggregates hold goes on to the (refusing) store
        await handler.ingest("fraud_v1", [event(amount=1e37)])


async def test_a_summed_value_is_bounded_by_its_longest_sum_window(make_offline_handler: Make, tmp_path: Path) -> None:
    """A sum over n buckets stays finite in FP32 when each bucket holds at most FP32_MAX / n (u_sum_5m: 5)."""
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    handler = make_offline_handler(tmp_path)
    row = {"ts": 1_700_000_000, "user": "u", "merchant": "m"}
    with pytest.raises(InvalidArgument, match=r"^event 0: field 'amount' .*FP32"):
        await handler.ingest("agg_v1", [{**row, "amount": FP32_MAX / 4}])
    with pytest.raises(Unavailable):
        await handler.ingest("agg_v1", [{**row, "amount": FP32_MAX / 6}])


async def test_a_request_value_beyond_fp32_is_the_clients_error(make_offline_handler: Make, tmp_path: Path) -> None:
    """An identity feature of a double that FP32 cannot hold: refused naming row and feature, not sent as Inf."""
    (tmp_path / "raw_v1.yaml").write_text(
        "name: raw\nversion: 1\ntimestamp_field: ts\ninputs: {ts: int64, x: double}\nentities: {}\n"
        "features:\n  - {name: x_raw, kind: identity, input: x}\n  - {name: x_log, kind: log, input: x}\n"
    )
    handler = make_offline_handler(tmp_path)
    ok = await handler.compute("raw_v1", [{"ts": T0, "x": 3e38}])
    assert np.isfinite(ok.matrix).all()
    with pytest.raises(InvalidArgument, match=r"^row 1: feature 'x_raw' .*FP32") as err:
        await handler.compute("raw_v1", [{"ts": T0, "x": 1.0}, {"ts": T0, "x": 1e39}])
    assert len(str(err.value)) < MESSAGE_LIMIT


def test_declared_defaults_and_table_values_must_fit_fp32(tmp_path: Path) -> None:
    """What a degraded row takes (its defaults) and what tables hold can always be sent."""
    (tmp_path / "d_v1.yaml").write_text(
        AGG_YAML.replace("name: agg", "name: d").replace("default: -7", "default: -1.0e39")
    )
    with pytest.raises(FeatureSetError, match="default"):
        load_feature_sets(tmp_path)
    (tmp_path / "d_v1.yaml").unlink()
    (tmp_path / "t.csv").write_text("key,risk\na,1e39\n")
    (tmp_path / "t_v1.yaml").write_text(
        "name: t\nversion: 1\ntimestamp_field: ts\ninputs: {ts: int64, k: string}\nentities: {}\n"
        "features:\n  - {name: k_risk, kind: lookup, input: k, table: t.csv, column: risk}\n"
    )
    with pytest.raises(FeatureSetError, match="FP32"):
        load_feature_sets(tmp_path)


# -- sizes and budgets ---------------------------------------------------------------------------------


def test_max_field_bytes_is_a_documented_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert FeatureSettings().max_field_bytes == 256
    assert FeatureSettings.model_fields["max_field_bytes"].description
    monkeypatch.setenv("MESHSERVE_FEATURE_MAX_FIELD_BYTES", "32")
    assert FeatureSettings().max_field_bytes == 32


@pytest.mark.parametrize("method", ["compute", "ingest"])
async def test_a_string_field_over_the_cap_is_refused_unechoed(make_offline_handler: Make, method: str) -> None:
    handler = make_offline_handler(max_field_bytes=64)
    make, what = (fraud_row, "row") if method == "compute" else (event, "event")
    call = getattr(handler, method)
    huge = "A" * 64 + "SECRET" * 200_000  # about 1.2 MB
    with pytest.raises(InvalidArgument) as err:
        await call("fraud_v1", [make(), make(merchant_id=huge)])
    message = str(err.value)
    assert message.startswith(f"{what} 1: field 'merchant_id' is {len(huge)} bytes; at most 64"), message
    assert "SECRET" not in message and len(message) < MESSAGE_LIMIT
    with pytest.raises(InvalidArgument, match="is 66 bytes"):  # bytes, not characters: 22 three-byte ones
        await call("fraud_v1", [make(user_id="€" * 22)])
    good = [make(device_id="b" * 64)]
    if method == "compute":
        assert (await handler.compute("fraud_v1", good)).degraded.all()  # accepted; the store is down
    else:
        with pytest.raises(Unavailable):
            await handler.ingest("fraud_v1", good)


@pytest.mark.parametrize("budget", [math.nan, math.inf, -math.inf, -1.0])
async def test_a_budget_that_is_not_a_finite_non_negative_number_is_refused(
    make_offline_handler: Make, budget: float
) -> None:
    handler = make_offline_handler()
    with pytest.raises(InvalidArgument, match="budget_ms"):
        await handler.compute("fraud_v1", [fraud_row()], budget_ms=budget)


# -- messages stay short -------------------------------------------------------------------------------


async def test_an_unknown_feature_set_name_is_cut_in_the_message(make_offline_handler: Make) -> None:
    handler = make_offline_handler()
    name = "x" * 64 + "y" * 100_000
    for call in (handler.compute(name, [fraud_row()]), handler.ingest(name, [event()])):
        with pytest.raises(NotFound) as err:
            await call
        message = str(err.value)
        assert "x" * 64 in message and "yy" not in message
        assert f"{len(name)} bytes" in message and len(message) < MESSAGE_LIMIT
    with pytest.raises(NotFound, match=r"unknown feature set 'fraud_v9' \(have: fraud_v1\)"):
        handler.feature_set("fraud_v9")


async def test_the_store_failure_is_not_echoed_to_the_caller(make_offline_handler: Make) -> None:
    """UNAVAILABLE says the store is unavailable and why in a word, not the client library's text (addresses)."""
    handler = make_offline_handler()
    with pytest.raises(Unavailable) as err:
        await handler.ingest("fraud_v1", [event()])
    message = str(err.value)
    assert message.startswith("online store unavailable") and "127.0.0.1" not in message, message
