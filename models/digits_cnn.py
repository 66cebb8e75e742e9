"""The `digits_cnn` demo model: a small CNN trained on scikit-learn's bundled 8x8 digits, and its exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor, nn

from services.model.export import export_version

NAME = "digits_cnn"
METRIC = "held-out accuracy"
SEED = 20240602
HELD_OUT = 0.2
EPOCHS = 20
BATCH_SIZE = 32
LEARNING_RATE = 2e-3
VERSIONS = (1,)
VERIFY_ROWS = 1000  # digits the ONNX file must answer as torch does


def make_dataset() -> tuple[np.ndarray, np.ndarray]:
    """The digits as X [n, 1, 8, 8] FP32 in [0, 1] (the 0..16 pixel values divided by 16), y [n] INT64."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    return x, digits.target.astype(np.int64)


class DigitsCNN(nn.Module):
    """image [batch, 1, 8, 8] FP32 -> (probabilities [batch, 10] FP32, label [batch, 1] INT64)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def logits(self, image: Tensor) -> Tensor:
        return self.classifier(self.features(image))

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.classifier(self.features(image))
        return torch.softmax(logits, dim=1), torch.argmax(logits, dim=1, keepdim=True)


def train(seed: int = SEED) -> tuple[DigitsCNN, float]:
    """Train on a stratified split of the digits; returns the model (eval mode) and its held-out accuracy.

    Seeds torch itself; for bit-identical results run it under `models.build.deterministic`.
    """
    x, y = make_dataset()
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=HELD_OUT, random_state=seed, stratify=y)
    x_train, y_train = torch.from_numpy(x_tr), torch.from_numpy(y_tr)

    torch.manual_seed(seed)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(EPOCHS):
        order = torch.randperm(len(x_train), generator=shuffle)
        for start in range(0, len(x_train), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model.logits(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        _, label = model(torch.from_numpy(x_te))
    return model, float((label.squeeze(1).numpy() == y_te).mean())


def save_torchscript(model: nn.Module, path: Path) -> None:
    """Script `model` and save it to `path` atomically (the server watches the repository)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.jit.save(torch.jit.script(model.eval()), str(tmp))
    tmp.replace(path)


def build(model_dir: Path, seed: int = SEED) -> dict[str, float]:
    """Train and write `<model_dir>/1/model.pt` and its ONNX export, verified against torch on VERIFY_ROWS digits;
    returns the held-out accuracy and the export's check."""
    model, accuracy = train(seed)
    for version in VERSIONS:
        save_torchscript(model, model_dir / str(version) / "model.pt")
    x, _ = make_dataset()
    report = export_version(model, model_dir.parent, NAME, 1, rows={"image": np.ascontiguousarray(x[:VERIFY_ROWS])})
    return {
        METRIC: accuracy,
        "FP32 ONNX max |diff| vs torch": report.verification.max_abs_diff["probabilities"],
        "ONNX labels differing from torch": float(report.verification.mismatched["label"]),
    }
