"""The GPU machine's bundle (`make gpu-bundle`): it builds, fits what one device run may carry, its wheels install
with no index, and its entry script runs the GPU check here with every GPU part skipped, each saying why.

What this proves, and where it stops:
- The bundle's own wheels, built for the GPU machine (CPython 3.12, manylinux x86_64), install into a clean target
  with `--no-index --no-deps` and pip's `--python-version 3.12 --platform ...`: each file is one pip accepts for that
  machine, and no package comes twice. The bundle tool has already checked that every requirement of every carried
  wheel (and of the generated gRPC stubs) is carried or in the image's package list.
- run.sh then runs under a Python made to look like the image: this machine's interpreter in a fresh virtualenv
  holding links to those of the project's installed packages that the image has too (torch, numpy, grpcio,
  onnxruntime, pyyaml, ...) and to nothing else, so no pydantic, OpenTelemetry or watchfiles: whatever the check and
  the model service it starts import beyond the image comes from the bundle, installed by run.sh with --no-index.
  Binary wheels are built per Python version and this machine runs 3.11, so the installer replaces the carried
  cp312 ones by the same versions built for 3.11 (cached by the bundle tool's --host-wheels) and says so.
- The check runs its CPU path (--cpu-reference --quick): heavy_mlp is rebuilt from the bundle's recipe and found
  identical, fraud_mlp is measured in process and served by a real model service driven by the benchmarks'
  closed-loop client. Not proven here: the GPU parts themselves, and Python 3.12 behaviour of the pure-Python code.

The first run downloads the wheels into .gpu-bundle-cache/ (ignored); later runs download nothing.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / ".gpu-bundle-test"  # beside the repository's files, as run.sh expects; ignored like .gpu-bundle
CACHE = ROOT / ".gpu-bundle-cache"
BUNDLE_LIMIT = 40 << 20
CARRY_LIMIT = 64 << 20
SKIPPED_FOR_NO_GPU = (
    "SKIPPED GPU tests: no GPU (",
    "SKIPPED FP16 vs FP32 and GPU batch invariance: no GPU (",
    "SKIPPED GPU memory across reloads: no GPU (",
    "SKIPPED in-process rows/s on the GPU paths (ONNX Runtime CPU measured alone): no GPU (",
    "SKIPPED served GPU paths and GPU utilisation (ONNX Runtime CPU served alone): no GPU (",
    "SKIPPED cost per million: no GPU (",
    "SKIPPED pycuda build and probe: no GPU (",
)

pytestmark = pytest.mark.skipif(
    not (ROOT / "models" / "bench" / "heavy_mlp" / "1" / "model.onnx").is_file(), reason="`make models` not run"
)


@pytest.fixture(scope="module")
def bundle() -> dict:
    """The bundle, built (from the download cache) into BUNDLE with this interpreter's binary wheels cached too."""
    command = [sys.executable, "tools/gpu_bundle.py", "--out", str(BUNDLE), "--cache", str(CACHE), "--host-wheels"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    manifest["printed"] = done.stdout
    return manifest


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_the_bundle_fits_a_device_run_with_room_to_spare(bundle: dict) -> None:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    tree = sum((ROOT / p).stat().st_size for p in tracked.split("\0") if p and (ROOT / p).is_file())
    total = size(BUNDLE)
    assert total <= BUNDLE_LIMIT, f"bundle {total / 2**20:.1f} MiB"
    assert tree + total <= CARRY_LIMIT, f"tree {tree / 2**20:.1f} MiB + bundle {total / 2**20:.1f} MiB"
    assert "a run carries" in bundle["printed"]
    assert {item["name"] for item in bundle["not_carried"]} == {"tensorrt", "onnxruntime-gpu"}
    assert (BUNDLE / "run.sh").stat().st_mode & 0o111
    assert sorted(p.name for p in (BUNDLE / "sdist").iterdir()) == ["pycuda-2026.1.tar.gz"]
    # heavy_mlp's 2 x 65 MiB of weights travel as their recipe; fraud_mlp's files as they are.
    assert (BUNDLE / "models" / "bench" / "heavy_mlp" / "recipe.json").is_file()
    assert not (BUNDLE / "models" / "bench" / "heavy_mlp" / "1").exists()
    assert (BUNDLE / "models" / "fraud_mlp" / "1" / "model.pt").is_file()


def test_the_device_wheels_install_for_python_3_12_with_no_index(bundle: dict, tmp_path: Path) -> None:
    wheels = sorted((BUNDLE / "wheels").glob("*.whl"))
    assert len(wheels) == len(bundle["wheels"])
    platforms = [arg for p in bundle["platforms"] for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--disable-pip-version-check", "--only-binary=:all:", "--implementation", "cp"]
    command += ["--python-version", bundle["python"], *platforms, "--target", str(tmp_path / "site"), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = {canonicalize_name(p.name.split("-")[0]) for p in (tmp_path / "site").glob("*.dist-info")}
    assert installed == {w["name"] for w in bundle["wheels"]}
    assert any((tmp_path / "site" / "pydantic_core").glob("_pydantic_core.cpython-312-x86_64-linux-gnu.so"))


def image_like_python(where: Path) -> Path:
    """A virtualenv of this interpreter holding links to the installed distributions the GPU image has too."""
    image = {
        canonicalize_name(line.strip())
        for line in (ROOT / "tools" / "gpu-image-packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    site = next(where.glob("lib/python3*/site-packages"))
    for dist in importlib.metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in image:
            continue
        origin = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (origin / top).exists() and not (site / top).exists():
                (site / top).symlink_to(origin / top)
    return where / "bin" / "python"


def test_run_sh_runs_the_check_on_an_image_like_python_with_every_gpu_part_skipped(
    bundle: dict, tmp_path: Path
) -> None:
    python = image_like_python(tmp_path / "image")
    lacks = subprocess.run([python, "-c", "import pydantic"], capture_output=True, text=True, cwd=tmp_path)
    assert lacks.returncode != 0, "the image-like python must lack what the bundle carries"
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OUT")}
    env["MESHSERVE_GPU_PYTHON"] = str(python)
    env["MESHSERVE_GPU_BUNDLE_HOST_WHEELS"] = str(CACHE / f"host-cp{sys.version_info.major}{sys.version_info.minor}")
    command = ["bash", str(BUNDLE / "run.sh"), str(out), "--cpu-reference", "--quick", "--seconds", "0.3"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-6000:]
    for line in SKIPPED_FOR_NO_GPU:
        assert line in printed, f"{line!r} missing from:\n{printed[-6000:]}"
    assert "wheels installed into" in printed and "(--no-index)" in printed
    assert "replaced by pydantic_core-2.50.5-cp3" in printed  # said, not hidden
    assert "not carried: tensorrt:" in printed and "not carried: onnxruntime-gpu:" in printed
    assert "heavy_mlp v1 rebuilt from seed 1234" in printed and "weights identical" in printed
    assert "fraud_mlp onnxruntime CPU batching on c=32:" in printed
    report = (out / "report.md").read_text()
    assert "## Summary" in report and "no check failed" in report
    assert "- not run: pycuda build and probe: no GPU (" in report
    figures = {f["name"]: f for f in json.loads((out / "figures.json").read_text())["figures"]}
    assert figures["gpu_check.fraud_mlp.onnxruntime_CPU.in_process.b1"]["value"] > 0
    assert figures["gpu_check.fraud_mlp.onnxruntime_CPU.served.batched.c32.throughput"]["value"] > 0
    assert (out / "check.log").read_text().strip().endswith("figures.json")
    assert (out / "model-service.log").is_file()
