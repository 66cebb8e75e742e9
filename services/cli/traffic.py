"""Synthetic card transactions for the `fraud` pipeline: users, merchants, devices, countries, channels, amounts.

Each request is, with probability `repeat`, a re-send of an earlier transaction picked Zipf-wise (a few are
sent very often: retries, duplicate submissions, polling clients), so the response cache sees hits; the rest
are new transactions of a seeded population. A share `suspicious` looks like fraud (new device, far country,
card-not-present, risky merchant code, a large amount), so scores spread over the whole range.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

HOME = (["us", "ca", "gb", "de", "fr", "br"], [0.6, 0.1, 0.1, 0.08, 0.07, 0.05])
FAR = ["ng", "ru", "ua", "cn", "id", "in", "vn", "ro"]
MCC = (
    ["5411", "5812", "5999", "5732", "5311", "6011", "7995", "4829"],
    [0.30, 0.25, 0.14, 0.10, 0.13, 0.03, 0.02, 0.03],
)
RISKY_MCC = ["6011", "7995", "4829", "5732"]
CHANNELS = ["web", "app", "pos", "moto"]
FIELDS = (
    "event_time",
    "user_id",
    "merchant_id",
    "device_id",
    "amount",
    "country",
    "channel",
    "mcc",
    "card_present",
    "account_age_days",
)


@dataclass
class User:
    user_id: str
    home: str
    devices: list[str]
    spend: float
    age_days: float
    channels: np.ndarray  # probabilities over CHANNELS


class TrafficGenerator:
    """Seeded stream of fraud-pipeline rows (dicts of the raw fields); `next()` gives one row."""

    def __init__(
        self,
        seed: int = 0,
        users: int = 2000,
        merchants: int = 400,
        repeat: float = 0.3,
        zipf_a: float = 1.3,
        hot_set: int = 500,
        suspicious: float = 0.03,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 <= repeat <= 1 or not 0 <= suspicious <= 1:
            raise ValueError("repeat and suspicious are probabilities")
        if zipf_a <= 1:
            raise ValueError("zipf_a must be > 1")
        self.rng = np.random.default_rng(seed)
        self.repeat = repeat
        self.zipf_a = zipf_a
        self.hot_set = max(1, hot_set)
        self.suspicious = suspicious
        self.clock = clock
        rng = self.rng
        self.users = [
            User(
                user_id=f"u{i}",
                home=str(rng.choice(HOME[0], p=HOME[1])),
                devices=[f"d{i}_0", f"d{i}_1"] if rng.random() < 0.3 else [f"d{i}_0"],
                spend=float(rng.lognormal(np.log(45.0), 0.6)),
                age_days=float(np.clip(rng.lognormal(np.log(500.0), 1.0), 1.0, 3650.0).round(1)),
                channels=rng.dirichlet([2.0, 2.0, 3.0, 0.2]),
            )
            for i in range(users)
        ]
        self.merchant_mcc = rng.choice(MCC[0], size=merchants, p=MCC[1])
        popularity = 1.0 / (np.arange(merchants) + 10.0)
        self.merchant_p = popularity / popularity.sum()
        self.user_p = 1.0 / (np.arange(users) + 20.0)
        self.user_p /= self.user_p.sum()
        self.history: list[dict[str, Any]] = []  # rank order: index 0 is the most popular to re-send
        self.sent = 0
        self.repeats = 0

    def next(self) -> dict[str, Any]:
        """One row: a Zipf-picked re-send of an earlier row (probability `repeat`) or a new transaction."""
        self.sent += 1
        if self.history and self.rng.random() < self.repeat:
            rank = min(int(self.rng.zipf(self.zipf_a)) - 1, len(self.history) - 1)
            self.repeats += 1
            return dict(self.history[rank])
        row = self.transaction()
        if len(self.history) < self.hot_set:
            self.history.append(row)
        elif self.rng.random() < 0.05:  # the hot set drifts slowly (replace a random member)
            self.history[int(self.rng.integers(self.hot_set))] = row
        return dict(row)

    def batch(self, n: int) -> list[dict[str, Any]]:
        return [self.next() for _ in range(n)]

    def transaction(self) -> dict[str, Any]:
        """A new transaction now, of a Zipf-ish popular user at a popular merchant (sometimes suspicious)."""
        rng = self.rng
        user = self.users[int(rng.choice(len(self.users), p=self.user_p))]
        merchant = int(rng.choice(len(self.merchant_mcc), p=self.merchant_p))
        mcc = str(self.merchant_mcc[merchant])
        amount = user.spend * float(rng.lognormal(0.0, 0.5))
        device = user.devices[0] if rng.random() < 0.85 else str(rng.choice(user.devices))
        country = user.home
        channel = str(rng.choice(CHANNELS, p=user.channels))
        if rng.random() < self.suspicious:
            device = f"fd{int(rng.integers(40))}" if rng.random() < 0.7 else device
            country = str(rng.choice(FAR)) if rng.random() < 0.6 else country
            channel = str(rng.choice(["web", "moto", "app"], p=[0.6, 0.25, 0.15]))
            mcc = str(rng.choice(RISKY_MCC)) if rng.random() < 0.6 else mcc
            amount *= float(rng.lognormal(np.log(4.0), 0.6))
        return {
            "event_time": int(self.clock()),
            "user_id": user.user_id,
            "merchant_id": f"m{merchant}",
            "device_id": device,
            "amount": round(amount, 2),
            "country": country,
            "channel": channel,
            "mcc": mcc,
            "card_present": channel == "pos",
            "account_age_days": user.age_days,
        }
