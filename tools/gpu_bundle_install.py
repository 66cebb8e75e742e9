"""Install a device bundle's wheels (tools/gpu_bundle.py) into a fresh target folder with no index: the carried
install wheels, plus each carried fallback whose package the running interpreter lacks or has in a version some
carried wheel does not accept. Standard library and pip only, since it runs before anything is installed.

    python3 tools/gpu_bundle_install.py BUNDLE TARGET [--report install.json]

MESHSERVE_GPU_BUNDLE_HOST_WHEELS names a folder of this interpreter's builds of the carried binary wheels (the
bundle tool's --host-wheels): each carried wheel this interpreter cannot install is replaced by its build of the
same version from there, and said so. Only the bundle's dry run on a machine whose Python is not 3.12 needs it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

try:
    from packaging.specifiers import SpecifierSet
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries its own copy
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.tags import sys_tags  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

HOST_WHEELS_ENV = "MESHSERVE_GPU_BUNDLE_HOST_WHEELS"


def installed_version(name: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(name))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def choose(manifest: dict, wheels: Path) -> tuple[list[Path], list[str]]:
    """The wheel files to install, and a line for each decision worth reading."""
    notes: list[str] = []
    fallbacks = {w["name"]: w for w in manifest["wheels"] if w["role"] == "fallback"}
    chosen = [wheels / w["file"] for w in manifest["wheels"] if w["role"] == "install"]
    for name, specs in manifest["image_requirements"].items():
        have = installed_version(name)
        wanted = SpecifierSet(",".join(specs))
        if have is not None and wanted.contains(have, prereleases=True):
            continue
        shown = f"{name} {have or 'absent'} (needed: {wanted or 'any'})"
        if name in fallbacks:
            chosen.append(wheels / fallbacks[name]["file"])
            notes.append(f"{shown}: installing the carried {fallbacks[name]['version']}")
        else:
            notes.append(f"WARNING {shown}: the image's version does not fit and none is carried")
    return chosen, notes


def host_builds(chosen: list[Path], folder: Path | None) -> tuple[list[Path], list[str]]:
    """`chosen` with each wheel this interpreter cannot install replaced by its build in `folder`."""
    supported = set(sys_tags())
    result, notes = [], []
    for wheel in chosen:
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if tags & supported:
            result.append(wheel)
            continue
        found = None
        if folder is not None:
            for candidate in folder.glob("*.whl"):
                n, v, _, t = parse_wheel_filename(candidate.name)
                if n == name and v == version and t & supported:
                    found = candidate
        here = sys.version.split()[0]
        if found is None:
            raise SystemExit(f"{wheel.name} does not install on Python {here} (set {HOST_WHEELS_ENV})")
        notes.append(f"{wheel.name} replaced by {found.name}: this python is {here}, the bundle's 3.12")
        result.append(found)
    return result, notes


def install(bundle: Path, target: Path) -> dict:
    manifest = json.loads((bundle / "manifest.json").read_text())
    chosen, notes = choose(manifest, bundle / "wheels")
    host = os.environ.get(HOST_WHEELS_ENV)
    chosen, replaced = host_builds(chosen, Path(host) if host else None)
    names = [canonicalize_name(parse_wheel_filename(w.name)[0]) for w in chosen]
    if len(set(names)) != len(names):
        raise SystemExit(f"two versions of one package chosen: {sorted(names)}")
    target.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--disable-pip-version-check", "--target", str(target), *map(str, chosen)]
    subprocess.run(command, check=True)
    return {"target": str(target), "installed": [w.name for w in chosen], "notes": notes + replaced}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 tools/gpu_bundle_install.py", description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    done = install(args.bundle, args.target)
    for line in done["notes"]:
        print(f"bundle: {line}")
    print(f"bundle: {len(done['installed'])} wheels installed into {done['target']} (--no-index)")
    if args.report:
        args.report.write_text(json.dumps(done, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
