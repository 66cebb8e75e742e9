"""The `fraud_mlp` demo model: its synthetic data set, its MLP, and the training that exports it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

NAME = "fraud_mlp"
METRIC = "held-out ROC AUC"
N_FEATURES = 64
FRAUD_RATE = 0.05
SEED = 20240601
N_ROWS = 40_000
HELD_OUT = 0.2
EPOCHS = 6
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
VERSIONS = (1, 2)  # the same weights; version 2 is quantized to INT8 by the server (see config.yaml)


def make_dataset(seed: int = SEED, n: int = N_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """A seeded synthetic data set: X [n, 64] FP32 features, y [n] INT64 labels (1 = fraud, ~5%).

    Fraud is planted by a nonlinear rule over six features (an interaction, a periodic term, a
    square, a linear term and a hinge) plus Gaussian noise; the other 58 features are distractors.
    A later issue replaces this with features computed by the real feature pipeline.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, N_FEATURES))
    risk = (
        1.5 * x[:, 0] * x[:, 1]
        + 1.5 * np.sin(2.0 * x[:, 2])
        + 0.8 * x[:, 3] ** 2
        - x[:, 4]
        + 2.0 * np.maximum(x[:, 5] - 1.0, 0.0)
        + rng.normal(0.0, 0.5, n)
    )
    y = (risk > np.quantile(risk, 1.0 - FRAUD_RATE)).astype(np.int64)
    return x.astype(np.float32), y


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


def train(seed: int = SEED) -> tuple[FraudMLP, float]:
    """Train on the synthetic data set; returns the model (eval mode) and its held-out ROC AUC.

    Seeds torch itself; for bit-identical results run it under `models.build.deterministic`.
    """
    x, y = make_dataset(seed)
    n_train = int(len(x) * (1.0 - HELD_OUT))
    x_train, y_train = torch.from_numpy(x[:n_train]), torch.from_numpy(y[:n_train]).float().unsqueeze(1)
    x_test, y_test = torch.from_numpy(x[n_train:]), y[n_train:]

    torch.manual_seed(seed)
    model = FraudMLP(x_train.mean(dim=0), x_train.std(dim=0).clamp_min(1e-6))
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
    model, auc = train(seed)
    for version in VERSIONS:
        save_torchscript(model, model_dir / str(version) / "model.pt")
    return auc
