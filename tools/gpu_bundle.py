"""`make gpu-bundle`: the folder a GPU machine's run carries (docs/gpu.md), so that the machine, which reaches no
registry, needs no preparation: Python 3.12 manylinux wheels of what its image lacks, the models the GPU check
needs, pycuda's source, a manifest, and run.sh, the one command to run there.

    python tools/gpu_bundle.py [--out .gpu-bundle] [--cache .gpu-bundle-cache] [--host-wheels]

Pins come from pyproject.toml, and from tools/gpu-bundle-requirements.txt for what it does not pin. Downloads are
kept in the cache folder, so a rebuild downloads nothing. Every requirement of every carried wheel is checked here:
carried, or in the image's package list (tools/gpu-image-packages.txt; its versions are checked on the machine by
tools/gpu_bundle_install.py, which installs a carried fallback where the image's is too old). --host-wheels also
caches this interpreter's builds of the carried binary wheels, for a dry run of the bundle here (the wheels proper
are for Python 3.12).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUNDLE = ROOT / ".gpu-bundle"
CACHE = ROOT / ".gpu-bundle-cache"
REQUIREMENTS = ROOT / "tools" / "gpu-bundle-requirements.txt"
IMAGE_PACKAGES = ROOT / "tools" / "gpu-image-packages.txt"
RUN_SCRIPT = ROOT / "tools" / "gpu_bundle_run.sh"
DEVICE_PYTHON = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# The markers a requirement is read with: the GPU machine's interpreter.
DEVICE_ENV = {
    "python_version": DEVICE_PYTHON,
    "python_full_version": f"{DEVICE_PYTHON}.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
LIMIT_BYTES = 40 << 20  # the bundle alone
CARRY_LIMIT_BYTES = 64 << 20  # what one device run takes: the working tree and its carried paths together
NOT_CARRIED = [
    {
        "name": "tensorrt",
        "why": "TensorRT's wheels (tensorrt-cu12 and its libraries) are about 1 GB, past the 64 MiB a run carries; "
        "the tensorrt backend and ONNX Runtime's TensorRT EP are reported missing",
    },
    {
        "name": "onnxruntime-gpu",
        "why": "its CUDA wheel is over 200 MB, past the 64 MiB a run carries, and the image's onnxruntime is the CPU "
        "build: ONNX Runtime's CUDA EP is reported missing and ONNX Runtime runs on the CPU as the reference",
    },
]
MODEL_FILES = {Path("fraud_mlp"): ("model.onnx", "model.pt")}  # version 1's files carried as they are
HEAVY = Path("bench") / "heavy_mlp"  # carried as a recipe (tests/gpu/models.py): 2 x 65 MiB of seeded weights


@dataclass(frozen=True)
class Wanted:
    name: str
    version: str
    role: str  # install, fallback, sdist


def pyproject_pins() -> dict[str, str]:
    """Every `name==version` in pyproject.toml's dependencies and optional dependencies, by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        lines.extend(group)
    pins: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def wanted(path: Path = REQUIREMENTS) -> list[Wanted]:
    """The requirements file's entries, each pinned (by the file, else by pyproject.toml)."""
    pins = pyproject_pins()
    found: list[Wanted] = []
    role = ""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            role = line.strip("[]")
            continue
        name, _, version = line.partition("==")
        name = canonicalize_name(name.strip())
        version = version.strip() or pins.get(name, "")
        if not version:
            raise SystemExit(f"{path.name}: {name} has no pin here or in pyproject.toml")
        if role not in ("install", "fallback", "sdist"):
            raise SystemExit(f"{path.name}: {name} outside a [install], [fallback] or [sdist] section")
        found.append(Wanted(name, version, role))
    names = [w.name for w in found]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise SystemExit(f"{path.name}: listed twice: {doubled} (one version of each package)")
    return found


def image_packages(path: Path = IMAGE_PACKAGES) -> set[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def cached(folder: Path, item: Wanted) -> Path | None:
    """The cached distribution of `item` in `folder`, if any."""
    if not folder.is_dir():
        return None
    for path in folder.iterdir():
        try:
            if path.suffix == ".whl":
                name, version, _, _ = parse_wheel_filename(path.name)
            elif path.name.endswith(".tar.gz"):
                name, version = parse_sdist_filename(path.name)
            else:
                continue
        except ValueError:
            continue
        if name == item.name and str(version) == item.version:
            return path
    return None


def pip_download(items: list[Wanted], folder: Path, device: bool, source: bool = False) -> None:
    """Fetch `items` into `folder`: wheels for the GPU machine (device) or for this interpreter, or sdists."""
    if not items:
        return
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder)]
    if source:
        command += ["--no-binary", ",".join(i.name for i in items)]
    else:
        command += ["--only-binary=:all:"]
    if device and not source:
        command += ["--python-version", DEVICE_PYTHON, "--implementation", "cp"]
        for platform in PLATFORMS:
            command += ["--platform", platform]
    command += [f"{i.name}=={i.version}" for i in items]
    folder.mkdir(parents=True, exist_ok=True)
    print(f"downloading {len(items)} into {folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}")
    subprocess.run(command, check=True)


def fetch(items: list[Wanted], folder: Path, device: bool = True, source: bool = False) -> dict[str, Path]:
    """Each item's file in `folder`, downloading those not cached there yet."""
    pip_download([i for i in items if cached(folder, i) is None], folder, device, source)
    found: dict[str, Path] = {}
    for item in items:
        path = cached(folder, item)
        if path is None:
            raise SystemExit(f"{item.name}=={item.version}: pip downloaded no file into {folder}")
        found[item.name] = path
    return found


def requires(wheel: Path) -> list[Requirement]:
    """A wheel's Requires-Dist that apply on the GPU machine (no extras)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(meta).decode())
    reqs = [Requirement(r) for r in message.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(DEVICE_ENV)]


def stub_requirements() -> list[Requirement]:
    """What the repository's generated gRPC and protobuf modules need at run time: grpcio and protobuf at least as
    new as the versions that generated them."""
    needs: list[Requirement] = []
    protos = ROOT / "services" / "protos"
    generated = r"GRPC_GENERATED_VERSION = '([\d.]+)'"
    grpc_versions = {m for f in protos.glob("*_pb2_grpc.py") for m in re.findall(generated, f.read_text())}
    proto_versions = {
        ".".join(m)
        for f in protos.glob("*_pb2.py")
        for m in re.findall(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", f.read_text())
    }
    if grpc_versions:
        needs.append(Requirement(f"grpcio>={max(grpc_versions, key=_version)}"))
    if proto_versions:
        needs.append(Requirement(f"protobuf>={max(proto_versions, key=_version)}"))
    return needs


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_closure(wheels: dict[str, tuple[Wanted, Path]], image: set[str]) -> dict[str, list[str]]:
    """Every requirement of every carried wheel and of the generated stubs, met by a carried install wheel (version
    checked here) or left to the image (version checked there, a fallback carried or not); returns those left to
    the image, by name: their specifiers. SystemExit naming what nothing provides."""
    from packaging.version import Version

    problems: list[str] = []
    on_image: dict[str, set[str]] = {}
    sources = [(f"{w.name} {w.version}", requires(path)) for w, path in wheels.values() if w.role == "install"]
    sources.append(("services/protos", stub_requirements()))
    for owner, reqs in sources:
        for req in reqs:
            name = canonicalize_name(req.name)
            carried = wheels.get(name)
            if carried and carried[0].role == "install":
                if not req.specifier.contains(Version(carried[0].version), prereleases=True):
                    problems.append(f"{owner} needs {req}, the bundle carries {carried[0].version}")
            elif name in image or (carried and carried[0].role == "fallback"):
                on_image.setdefault(name, set()).add(str(req.specifier))
            else:
                problems.append(f"{owner} needs {req}: neither carried nor in {IMAGE_PACKAGES.name}")
    for name, specs in on_image.items():
        carried = wheels.get(name)
        if carried and carried[0].role == "fallback":
            for spec in specs:
                if spec and not Requirement(f"{name}{spec}").specifier.contains(Version(carried[0].version)):
                    problems.append(f"the fallback {name} {carried[0].version} does not meet {name}{spec}")
    if problems:
        raise SystemExit("the bundle's wheels do not fit together:\n  " + "\n  ".join(problems))
    return {name: sorted(s for s in specs if s) for name, specs in sorted(on_image.items())}


def copy_models(out: Path) -> list[str]:
    """fraud_mlp v1 as built; heavy_mlp's config and recipe (tests/gpu/models.py); the carried paths."""
    from tests.gpu.models import RECIPE_FILE, heavy_recipe

    models = ROOT / "models"
    carried: list[str] = []
    for folder, files in MODEL_FILES.items():
        for name in ("config.yaml", *(f"1/{f}" for f in files)):
            source = models / folder / name
            if not source.is_file():
                raise SystemExit(f"{source.relative_to(ROOT)} is missing: run `make models` first")
            (out / folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, out / folder / name)
            carried.append(str(folder / name))
    if not (models / HEAVY / "1" / "model.onnx").is_file():
        raise SystemExit(f"models/{HEAVY}/1 is not built: run `make models` first")
    (out / HEAVY).mkdir(parents=True, exist_ok=True)
    shutil.copy2(models / HEAVY / "config.yaml", out / HEAVY / "config.yaml")
    (out / HEAVY / RECIPE_FILE).write_text(json.dumps(heavy_recipe(models / HEAVY), indent=2) + "\n")
    carried += [str(HEAVY / "config.yaml"), str(HEAVY / RECIPE_FILE)]
    return carried


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_size() -> int:
    """Bytes of the tracked working tree (what travels with every device run besides the carried paths)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in listed.decode().split("\0") if p and (ROOT / p).is_file())


def host_variants(wheels: dict[str, tuple[Wanted, Path]], cache: Path) -> Path:
    """This interpreter's builds of the carried wheels it cannot install (a dry run here); their folder."""
    folder = cache / f"host-cp{sys.version_info.major}{sys.version_info.minor}"
    supported = set(sys_tags())
    foreign = [w for w, path in wheels.values() if not (parse_wheel_filename(path.name)[3] & supported)]
    fetch(foreign, folder, device=False)
    return folder


def build(out: Path, cache: Path, host_wheels: bool) -> dict[str, Any]:
    """Write the bundle into `out` (replacing it); its manifest."""
    items = wanted()
    image = image_packages()
    binaries = fetch([i for i in items if i.role != "sdist"], cache / f"cp{DEVICE_PYTHON.replace('.', '')}")
    sources = fetch([i for i in items if i.role == "sdist"], cache / "sdist", source=True)
    by_name = {i.name: i for i in items}
    wheels = {name: (by_name[name], path) for name, path in binaries.items()}
    on_image = check_closure(wheels, image)
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    (out / "sdist").mkdir()
    for _, path in wheels.values():
        shutil.copy2(path, out / "wheels" / path.name)
    for path in sources.values():
        shutil.copy2(path, out / "sdist" / path.name)
    models = copy_models(out / "models")
    shutil.copy2(RUN_SCRIPT, out / "run.sh")
    (out / "run.sh").chmod(0o755)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    manifest: dict[str, Any] = {
        "python": DEVICE_PYTHON,
        "platforms": list(PLATFORMS),
        "commit": head,
        "wheels": [
            {"file": path.name, "name": w.name, "version": w.version, "role": w.role}
            for w, path in sorted(wheels.values(), key=lambda x: x[0].name)
        ],
        "image_requirements": on_image,
        "sdists": [path.name for path in sources.values()],
        "models": models,
        "not_carried": NOT_CARRIED,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    manifest["bytes"] = size(out)
    manifest["tree_bytes"] = tree_size()
    if host_wheels:
        manifest["host_wheels"] = str(host_variants(wheels, cache))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu_bundle.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=BUNDLE)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--host-wheels", action="store_true", help="also cache this interpreter's binary wheels")
    args = parser.parse_args(argv)
    manifest = build(args.out.resolve(), args.cache.resolve(), args.host_wheels)
    total, tree = manifest["bytes"], manifest["tree_bytes"]
    roles = {r: sum(1 for w in manifest["wheels"] if w["role"] == r) for r in ("install", "fallback")}
    print(
        f"{args.out}: {total / 2**20:.1f} MiB ({roles['install']} wheels, {roles['fallback']} fallbacks, "
        f"{len(manifest['sdists'])} sdist, {len(manifest['models'])} model files); with the tracked tree "
        f"({tree / 2**20:.1f} MiB) a run carries {(total + tree) / 2**20:.1f} MiB of {CARRY_LIMIT_BYTES >> 20}"
    )
    for item in manifest["not_carried"]:
        print(f"not carried: {item['name']}: {item['why']}")
    if "host_wheels" in manifest:
        print(f"this interpreter's builds of the binary wheels: {manifest['host_wheels']}")
    if total > LIMIT_BYTES or total + tree > CARRY_LIMIT_BYTES:
        limits = f"the bundle may hold {LIMIT_BYTES >> 20} MiB, a run {CARRY_LIMIT_BYTES >> 20}"
        print(f"too large: {limits}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
