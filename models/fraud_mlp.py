"""The `fraud_mlp` demo model: features of a synthetic transaction stream from the feature service's code, its MLP."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

from models import transactions
from models.feature_replay import FEATURES_DIR, replay_features
from services.feature.spec import ZScore, load_spec

NAME = "fraud_mlp"
METRIC = "held-out ROC AUC"
FEATURE_SET = "fraud_v1"
N_FEATURES = 64
SEED = 20240601
HELD_OUT = 0.2  # the latest 20% of the labelled events (a split in time, as in production)
EPOCHS = 6
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
VERSIONS = (1, 2)  # the same weights; version 2 is quantized to INT8 by the server (see config.yaml)


@dataclass
class Dataset:
    """Point-in-time features of a stream's labelled (post-warm-up) events, in time order."""

    stream: transactions.Stream
    first: int  # index in stream.rows of the first labelled event (row 0 of x)
    x: np.ndarray  # (n, 64) FP32, exactly what the feature service computes for each event as it arrives
    y: np.ndarray  # (n,) INT64, 1 = fraud

    @property
    def n_train(self) -> int:
        return int(len(self.x) * (1.0 - HELD_OUT))


def make_dataset(
    seed: int = SEED,
    users: int = transactions.N_USERS,
    days: int = transactions.DAYS,
    episodes: int = transactions.FRAUD_EPISODES,
    features_dir: Path = FEATURES_DIR,
) -> Dataset:
    """Generate the stream and replay it through the feature service's code (an embedded Valkey)."""
    stream = transactions.generate(seed, users=users, days=days, episodes=episodes)
    first = int(np.searchsorted(stream.times, stream.warmup_end))
    x = replay_features(FEATURE_SET, stream.rows, compute_from=first, features_dir=features_dir)
    return Dataset(stream, first, x, stream.labels[first:])


def amount_stats(dataset: Dataset) -> tuple[float, float]:
    """Mean and standard deviation of `amount` over the training split (the amount_z statistics)."""
    amounts = np.array([r["amount"] for r in dataset.stream.rows[dataset.first : dataset.first + dataset.n_train]])
    return float(amounts.mean()), float(amounts.std())


def check_zscore_stats(dataset: Dataset, features_dir: Path = FEATURES_DIR) -> None:
    """Fail unless the committed amount_z statistics are those of the training split (to 0.1%)."""
    path = features_dir / f"{FEATURE_SET}.yaml"
    (zscore,) = [f for f in load_spec(path).features if isinstance(f, ZScore) and f.input == "amount"]
    mean, std = amount_stats(dataset)
    if not (np.isclose(zscore.mean, mean, rtol=1e-3) and np.isclose(zscore.std, std, rtol=1e-3)):
        raise ValueError(
            f"{path}: {zscore.name} has mean {zscore.mean}, std {zscore.std} but the training data "
            f"gives mean {mean:.2f}, std {std:.2f}: commit those (and bump the version)"
        )


class FraudMLP(nn.Module):
    """features [batch, 64] FP32 -> fraud score [batch, 1] FP32 in [0, 1].

    The features are standardised inside the model (buffers fitted on the training split), so the
    server feeds it the raw feature tensor.
    """

    def __init__(self, mean: Tensor | None = None, std: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("feature_mean", mean if mean is not None else torch.zeros(N_FEATURES))
        self.register_buffer("feature_std", std if std is not None else torch.ones(N_FEATURES))
        self.layers = nn.Sequential(
            nn.Linear(N_FEATURES, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
            nn.Sigmoid(),
        )

    def logits(self, features: Tensor) -> Tensor:
        """The pre-sigmoid scores (training uses these with BCEWithLogitsLoss, for stability)."""
        return self.layers[:-1]((features - self.feature_mean) / self.feature_std)

    def forward(self, features: Tensor) -> Tensor:
        return self.layers((features - self.feature_mean) / self.feature_std)


def train(dataset: Dataset, seed: int = SEED) -> tuple[FraudMLP, float]:
    """Train on the older events, score the latest HELD_OUT; returns the model (eval mode) and its ROC AUC.

    Seeds torch itself; for bit-identical results run it under `models.build.deterministic`.
    """
    n_train = dataset.n_train
    x_train = torch.from_numpy(dataset.x[:n_train])
    y_train = torch.from_numpy(dataset.y[:n_train]).float().unsqueeze(1)
    x_test, y_test = torch.from_numpy(dataset.x[n_train:]), dataset.y[n_train:]

    torch.manual_seed(seed)
    std = x_train.std(dim=0)
    std = torch.where(std < 1e-3, torch.ones_like(std), std)  # a column constant in training stays as is
    model = FraudMLP(x_train.mean(dim=0), std)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.BCEWithLogitsLoss()
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(EPOCHS):
        order = torch.randperm(n_train, generator=shuffle)
        for start in range(0, n_train, BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model.logits(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        scores = model(x_test).squeeze(1).numpy()
    return model, float(roc_auc_score(y_test, scores))


def save_torchscript(model: nn.Module, path: Path) -> None:
    """Script `model` and save it to `path` atomically (the server watches the repository)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.jit.save(torch.jit.script(model.eval()), str(tmp))
    tmp.replace(path)


def build(model_dir: Path, seed: int = SEED) -> float:
    """Train and write `<model_dir>/<version>/model.pt` for every version; returns the held-out AUC."""
    dataset = make_dataset(seed)
    check_zscore_stats(dataset)
    model, auc = train(dataset, seed)
    for version in VERSIONS:
        save_torchscript(model, model_dir / str(version) / "model.pt")
    return auc
