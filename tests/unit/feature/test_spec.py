"""Feature set YAML: the demo set loads with 64 outputs; every error names the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.feature.featureset import FeatureSet, load_feature_sets
from services.feature.settings import ROOT, FeatureSettings
from services.feature.spec import FeatureSetError, load_spec

GOOD = """\
name: toy
version: 2
timestamp_field: ts
inputs:
  ts: int64
  user: string
  amount: double
  color: string
entities:
  user: user
features:
  - name: amount_log
    kind: log
    input: amount
  - name: color
    kind: onehot
    input: color
    categories: [red, blue]
  - name: user_count_1m
    kind: aggregate
    entity: user
    op: count
    window: 1m
    bucket: 10s
  - name: risk
    kind: lookup
    input: color
    table: colors.csv
    column: risk
"""


def write(tmp_path: Path, text: str, name: str = "toy_v2.yaml") -> Path:
    (tmp_path / "colors.csv").write_text("color,risk\nred,0.9\nblue,0.1\n")
    path = tmp_path / name
    path.write_text(text)
    return path


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_fraud_v1_has_64_fp32_outputs() -> None:
    sets = load_feature_sets(ROOT / "features")
    fs = sets["fraud_v1"]
    assert len(fs.names) == 64 and len(set(fs.names)) == 64
    assert fs.spec.outputs == 64 and fs.spec.version == 1
    assert {"request", "online", "static"} == set(fs.groups)


def test_good_file_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    fs = FeatureSet(spec, tmp_path)
    assert fs.id == "toy_v2"
    assert fs.names == ["amount_log", "color_red", "color_blue", "color_other", "user_count_1m", "risk"]


@pytest.mark.parametrize(
    ("old", "new", "needle", "field", "says"),
    [
        ("    window: 1m\n", "    window: 1 minute\n", "window: 1 minute", "features[2].window", "duration"),
        ("    bucket: 10s\n", "    bucket: 7s\n", "bucket: 7s", "features[2].bucket", "does not divide"),
        ("    input: amount\n", "    input: amount\n    extra: 1\n", "extra: 1", "features[0].extra", "not permitted"),
        ("    input: amount\n", "    input: amont\n", "input: amont", "features[0].input", "unknown input 'amont'"),
        ("    kind: log\n", "    kind: square\n", "kind: square", "features[0].kind", "square"),
        ("  amount: double\n", "  amount: float\n", "amount: float", "inputs.amount", "double"),
        ("    entity: user\n", "    entity: card\n", "entity: card", "features[2].entity", "unknown entity"),
        ("    column: risk\n", "    column: danger\n", "column: danger", "features[3].column", "no column 'danger'"),
        ("  color: string\n", "  color: bool\n", "kind: onehot", "features[1]", ""),  # bool onehot is fine
        ("timestamp_field: ts\n", "timestamp_field: amount\n", "timestamp_field", "timestamp_field", "int64"),
        ("version: 2\n", "version: 2\noutputs: 7\n", "outputs: 7", "outputs", "yield 6"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, old: str, new: str, needle: str, field: str, says: str):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    path = write(tmp_path, text)
    if new == "  color: bool\n":
        load_spec(path)  # a control: categoricals may be bool
        return
    with pytest.raises(FeatureSetError) as err:
        load_spec(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line_of(text, needle)}: {field}: "), message
    assert says in message


def test_missing_key_and_file_name(tmp_path: Path) -> None:
    text = GOOD.replace("    column: risk\n", "")
    path = write(tmp_path, text)
    with pytest.raises(FeatureSetError, match=rf"^{path}:{line_of(text, 'name: risk')}: features\[3\]\.column: "):
        load_spec(path)
    wrong = write(tmp_path, GOOD, name="toy_v1.yaml")
    with pytest.raises(FeatureSetError, match=r"must be named toy_v2\.yaml"):
        load_spec(wrong)
    broken = write(tmp_path, GOOD + "  - [unclosed\n", name="toy_v2.yaml")
    with pytest.raises(FeatureSetError, match=rf"^{broken}:\d+: \(yaml\)"):
        load_spec(broken)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_FEATURE_PORT", "9123")
    monkeypatch.setenv("MESHSERVE_REDIS_URL", "redis://example:6379/2")
    settings = FeatureSettings()
    assert settings.port == 9123 and settings.redis_url == "redis://example:6379/2"
    assert settings.features_dir == ROOT / "features" and settings.key_prefix == "meshserve:feature:"
