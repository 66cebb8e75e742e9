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
from services.model.export import Int8Recipe, export_version, onnx_session, save_rows

NAME = "fraud_mlp"
METRIC = "held-out ROC AUC"
FEATURE_SET = "fraud_v1"
N_FEATURES = 64
SEED = 20240601
HELD_OUT = 0.2  # the latest 20% of the labelled events (a split in time, as in production)
EPOCHS = 6
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
VERSIONS = (1, 2)  # one model: 1 FP32; 2 static INT8 of its equalised copy, the same function (see config.yaml)
VERIFY_ROWS = 1000  # held-out rows the FP32 ONNX must answer as torch does
CALIBRATION_ROWS = 1024  # training rows, evenly spaced in time, version 2 ships and is calibrated on
CALIBRATION_FILE = "calibration.npz"
INT8_MAX_DIFF = 0.02  # INT8 against FP32 on every held-out row
INT8_MAX_AUC_LOSS = 0.005
# INT8 on this small model is a matter of accuracy, not speed. The first layer sees standardised features out to
# |z| ~ 30 and the last makes the score, where one INT8 step moves a score near 0.5 by hundredths, so they stay FP32
# (2/5 of the MACs), as do the layers' outputs; the INT8 layer's input channels are equalised first (EQUALIZE_ALPHA)
# and activation scales clip at the 99.999th percentile of the calibration rows. Measured on the held-out rows:
# every layer INT8 with min/max scales moved scores by up to 0.14; the ends FP32, by 0.038; equalised, by 0.015.
EQUALIZE_ALPHA = 0.8
INT8_RECIPE = Int8Recipe(float_ends=True, quantize_outputs=False, percentile=99.999)


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


def calibration_rows(dataset: Dataset) -> dict[str, np.ndarray]:
    """CALIBRATION_ROWS training rows spread evenly over the training period (never held-out rows)."""
    index = np.linspace(0, dataset.n_train - 1, CALIBRATION_ROWS).astype(np.int64)
    return {"features": np.ascontiguousarray(dataset.x[index])}


def equalized(model: FraudMLP, calibration: np.ndarray, alpha: float = EQUALIZE_ALPHA) -> FraudMLP:
    """The same function with the first hidden layer's channels rescaled for INT8 (as SmoothQuant does): channel i of
    the first ReLU's output is divided by s_i = max|a_i|**alpha / max|W2[:, i]|**(1 - alpha) and the second layer's
    column i multiplied by it (exact, since ReLU(x / s) = ReLU(x) / s for s > 0), so that one per-tensor INT8 scale
    fits every channel of the INT8 layer's input instead of the widest."""
    first, second = model.layers[0], model.layers[2]
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
    copy = FraudMLP(model.feature_mean.clone(), model.feature_std.clone())
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        hidden = copy.layers[:2]((torch.from_numpy(calibration) - copy.feature_mean) / copy.feature_std)
        activation = hidden.abs().max(dim=0).values.clamp(min=1e-5)
        weight = copy.layers[2].weight.abs().max(dim=0).values.clamp(min=1e-5)
        scale = activation**alpha / weight ** (1 - alpha)
        copy.layers[0].weight /= scale[:, None]
        copy.layers[0].bias /= scale
        copy.layers[2].weight *= scale[None, :]
    return copy.eval()


def check_int8(fp32_file: Path, int8_file: Path, dataset: Dataset) -> dict[str, float]:
    """INT8 against FP32 (both ONNX, ONNX Runtime on the CPU) on every held-out row; ValueError past the limits."""
    x_test, y_test = dataset.x[dataset.n_train :], dataset.y[dataset.n_train :]
    fp32 = onnx_session(fp32_file).run(None, {"features": x_test})[0][:, 0]
    int8 = onnx_session(int8_file).run(None, {"features": x_test})[0][:, 0]
    diff = float(np.abs(fp32 - int8).max())
    auc_fp32, auc_int8 = float(roc_auc_score(y_test, fp32)), float(roc_auc_score(y_test, int8))
    if diff > INT8_MAX_DIFF or auc_fp32 - auc_int8 > INT8_MAX_AUC_LOSS:
        raise ValueError(
            f"{int8_file}: INT8 differs from FP32 by up to {diff:.4f} (limit {INT8_MAX_DIFF}) and scores held-out "
            f"ROC AUC {auc_int8:.4f} against {auc_fp32:.4f} (loss limit {INT8_MAX_AUC_LOSS})"
        )
    return {
        "INT8 max |diff| vs FP32 (held-out)": diff,
        "FP32 ONNX held-out ROC AUC": auc_fp32,  # its saturated scores tie more often than torch's (within 1.2e-7)
        "INT8 held-out ROC AUC": auc_int8,
    }


def build(model_dir: Path, seed: int = SEED) -> dict[str, float]:
    """Train and write every version into `model_dir` (its config.yaml already there): model.pt for both, the FP32
    ONNX of version 1 (verified against torch on held-out rows) and version 2's static INT8 Q/DQ ONNX calibrated on
    the training rows it ships (exported from the equalised copy); returns the held-out AUC and the export's checks."""
    dataset = make_dataset(seed)
    check_zscore_stats(dataset)
    model, auc = train(dataset, seed)
    calibration = calibration_rows(dataset)
    int8_ready = equalized(model, calibration["features"])
    save_torchscript(model, model_dir / "1" / "model.pt")
    save_torchscript(int8_ready, model_dir / "2" / "model.pt")  # what the torchscript backend quantizes at load
    save_rows(model_dir / "2" / CALIBRATION_FILE, calibration)
    held_out = {"features": np.ascontiguousarray(dataset.x[dataset.n_train :][:VERIFY_ROWS])}
    report = export_version(model, model_dir.parent, NAME, 1, rows=held_out)
    # Version 2: the equalised copy's export (verified against torch like version 1), then quantized in place.
    int8 = export_version(
        int8_ready,
        model_dir.parent,
        NAME,
        2,
        rows=held_out,
        int8_calibration=calibration,
        int8_version=2,
        int8_recipe=INT8_RECIPE,
    )
    assert int8.int8_path is not None
    return {
        METRIC: auc,
        "FP32 ONNX max |diff| vs torch": report.verification.max_abs_diff["score"],
        **check_int8(report.onnx_path, int8.int8_path, dataset),
    }
