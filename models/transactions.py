"""A seeded synthetic card-transaction stream with planted fraud, carrying exactly the raw inputs of fraud_v1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

START = 1_717_372_800  # Monday 2024-06-03 00:00 UTC
DAY_S = 86_400
WARMUP_DAYS = 7  # history only (no fraud, no training rows): fills the 7-day windows before the first labelled event
DAYS = 18  # warm-up included
N_USERS = 1_000
N_MERCHANTS = 400
N_FRAUD_DEVICES = 40  # fraudsters reuse devices across victims (device_users_7d)
FRAUD_EPISODES = 170

HOME = (["us", "ca", "gb", "de", "fr", "br"], [0.6, 0.1, 0.1, 0.08, 0.07, 0.05])
TRAVEL = ["us", "ca", "gb", "de", "fr", "br", "in", "cn", "id", "mx"]  # mx: not in the risk table (default)
FAR = ["ng", "ru", "ua", "cn", "id", "in", "vn", "ro"]  # vn, ro: not in the risk table
MCC = (
    ["5411", "5812", "5999", "5732", "5311", "6011", "7995", "4829"],
    [0.30, 0.25, 0.14, 0.10, 0.13, 0.03, 0.02, 0.03],
)
RISKY_MCC = {"6011", "7995", "4829", "5732"}
CHANNELS = ["web", "app", "pos", "moto"]


@dataclass
class Stream:
    """Events sorted by time (raw fraud_v1 inputs, Python scalars), their labels and where warm-up ends."""

    rows: list[dict[str, Any]]
    labels: np.ndarray  # (n,) int64, 1 = fraud
    warmup_end: int  # unix seconds; events before it are history only

    @property
    def times(self) -> np.ndarray:
        return np.array([r["event_time"] for r in self.rows], dtype=np.int64)


def _hour_of_day(rng: np.random.Generator, n: int, night: float = 0.0) -> np.ndarray:
    """Hours of day (float): mostly daytime, a share `night` between 0 and 6 UTC."""
    day = np.clip(rng.normal(15.0, 3.5, n), 6.0, 23.99)
    return np.where(rng.random(n) < night, rng.uniform(0.0, 6.0, n), day)


def generate(seed: int, users: int = N_USERS, days: int = DAYS, episodes: int = FRAUD_EPISODES) -> Stream:
    """The whole stream, deterministic in its arguments.

    Legitimate users keep to a home country, one or two devices, favourite merchants and amounts near their
    own mean, with some noise that looks like fraud (trips abroad, a new phone, a big purchase, quick runs of
    purchases). Fraud comes in episodes on a victim's card after warm-up: mostly a new (often shared)
    device, a far country, card-not-present channels, risky merchant codes, amounts far above the victim's
    mean, night hours and bursts of several transactions minutes apart; each trait is planted by chance, so
    some episodes are subtle.
    """
    rng = np.random.default_rng(seed)
    end = START + days * DAY_S
    warmup_end = START + WARMUP_DAYS * DAY_S
    merchant_mcc = rng.choice(MCC[0], size=N_MERCHANTS, p=MCC[1])
    popularity = 1.0 / (np.arange(N_MERCHANTS) + 10.0)
    popularity /= popularity.sum()
    risky = np.flatnonzero(np.isin(merchant_mcc, list(RISKY_MCC)))

    times: list[np.ndarray] = []
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("user", "merchant", "device", "amount", "country", "channel", "present", "age", "label")
    }

    def add(t: np.ndarray, **values: np.ndarray) -> None:
        times.append(t.astype(np.int64))
        for key, v in values.items():
            cols[key].append(np.broadcast_to(v, t.shape).copy())

    home = rng.choice(HOME[0], size=users, p=HOME[1])
    age = np.clip(rng.lognormal(np.log(500.0), 1.0, users), 1.0, 3650.0).round(1)
    spend = rng.lognormal(np.log(45.0), 0.6, users)
    rate = rng.lognormal(np.log(1.0), 0.6, users)  # events a day
    for u in range(users):
        n = rng.poisson(rate[u] * days)
        if n == 0:
            continue
        t = START + rng.integers(0, days, n) * DAY_S + (_hour_of_day(rng, n, night=0.04) * 3600).astype(np.int64)
        follow = rng.random(n) < 0.12  # a second purchase minutes later (legitimate bursts)
        t = np.concatenate([t, t[follow] + rng.integers(20, 1800, int(follow.sum()))])
        n = len(t)
        favourites = rng.choice(N_MERCHANTS, size=rng.integers(4, 11), replace=False, p=popularity)
        merchant = np.where(rng.random(n) < 0.8, rng.choice(favourites, n), rng.choice(N_MERCHANTS, n, p=popularity))
        devices = [f"d{u}_0", f"d{u}_1"] if rng.random() < 0.3 else [f"d{u}_0"]
        device = np.where(rng.random(n) < 0.85, devices[0], rng.choice(devices, n)).astype(object)
        if rng.random() < 0.06:  # a new phone from some day on
            device[t > START + rng.integers(WARMUP_DAYS, days) * DAY_S] = f"d{u}_new"
        country = np.full(n, home[u], dtype=object)
        if rng.random() < 0.08:  # a trip abroad
            leave = START + rng.integers(0, days) * DAY_S
            country[(t >= leave) & (t < leave + rng.integers(2, 5) * DAY_S)] = rng.choice(TRAVEL)
        mix = rng.dirichlet([2.0, 2.0, 3.0, 0.2])
        channel = rng.choice(CHANNELS, n, p=mix)
        amount = spend[u] * rng.lognormal(0.0, 0.5, n)
        big = rng.random(n) < 0.015  # a big purchase now and then
        amount[big] *= rng.uniform(3.0, 8.0, int(big.sum()))
        add(
            t,
            user=np.full(n, u),
            merchant=merchant,
            device=device,
            amount=amount,
            country=country,
            channel=channel,
            present=channel == "pos",
            age=np.full(n, age[u]),
            label=np.zeros(n, np.int64),
        )

    fraud_devices = [f"fd{i}" for i in range(N_FRAUD_DEVICES)]
    for e in range(episodes):
        u = int(rng.integers(users))
        k = int(rng.integers(3, 10)) if rng.random() < 0.7 else int(rng.integers(1, 3))
        start = warmup_end + int(rng.integers(0, end - warmup_end - DAY_S))
        start = start - start % DAY_S + int(_hour_of_day(rng, 1, night=0.5)[0] * 3600)
        gaps = rng.integers(15, 300, k) if k >= 3 else rng.integers(600, 6 * 3600, k)
        t = start + np.cumsum(gaps) - gaps[0]
        if rng.random() < 0.65:
            device = rng.choice(fraud_devices) if rng.random() < 0.6 else f"fx{e}"
        else:
            device = f"d{u}_0"
        country = rng.choice(FAR) if rng.random() < 0.45 else home[u]
        channel = (
            rng.choice(["web", "moto", "app"], k, p=[0.6, 0.25, 0.15])
            if rng.random() < 0.85
            else rng.choice(CHANNELS, k)
        )
        merchant = rng.choice(risky, k) if rng.random() < 0.5 else rng.choice(N_MERCHANTS, k, p=popularity)
        scale = rng.lognormal(np.log(4.0), 0.6) if rng.random() < 0.55 else rng.lognormal(0.0, 0.3)
        amount = spend[u] * scale * rng.lognormal(0.0, 0.4, k)
        if rng.random() < 0.15:  # card testing: tiny amounts first
            amount[: max(1, k - 1)] = rng.uniform(0.5, 3.0, max(1, k - 1))
        add(
            t,
            user=np.full(k, u),
            merchant=merchant,
            device=np.full(k, device, dtype=object),
            amount=amount,
            country=np.full(k, country, dtype=object),
            channel=channel,
            present=channel == "pos",
            age=np.full(k, age[u]),
            label=np.ones(k, np.int64),
        )

    t_all = np.concatenate(times)
    keep = (t_all >= START) & (t_all < end)
    order = np.argsort(t_all[keep], kind="stable")
    col = {key: np.concatenate(v)[keep][order] for key, v in cols.items()}
    t_sorted = t_all[keep][order]
    rows = [
        {
            "event_time": int(t),
            "user_id": f"u{u}",
            "merchant_id": f"m{m}",
            "device_id": str(d),
            "amount": round(float(a), 2),
            "country": str(c),
            "channel": str(ch),
            "mcc": str(merchant_mcc[m]),
            "card_present": bool(p),
            "account_age_days": float(ag),
        }
        for t, u, m, d, a, c, ch, p, ag in zip(
            t_sorted.tolist(),
            col["user"].tolist(),
            col["merchant"].tolist(),
            col["device"].tolist(),
            col["amount"].tolist(),
            col["country"].tolist(),
            col["channel"].tolist(),
            col["present"].tolist(),
            col["age"].tolist(),
            strict=True,
        )
    ]
    return Stream(rows, col["label"].astype(np.int64), warmup_end)
