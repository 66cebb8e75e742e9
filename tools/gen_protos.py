"""Generate the Python gRPC stubs (`_pb2`, `_pb2_grpc`, `.pyi`) from protos/ into services/protos/.

`--check` regenerates into a temporary folder and fails if the committed stubs differ (stale).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "services" / "protos"
PACKAGE = "services.protos"
HEADER = '"""Generated from protos/ by tools/gen_protos.py (`make protos`). Do not edit."""\n'


def generate(out: Path) -> None:
    """Run protoc on every .proto file and rewrite imports to be package-relative."""
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    modules = [Path(p).stem + "_pb2" for p in protos]
    pattern = re.compile(r"^import (" + "|".join(modules) + r") as ", re.MULTILINE)
    pattern_pyi = re.compile(r"^import (" + "|".join(modules) + r") as ", re.MULTILINE)
    for path in out.iterdir():
        text = path.read_text()
        text = pattern.sub(rf"from {PACKAGE} import \1 as ", text)
        text = pattern_pyi.sub(rf"from {PACKAGE} import \1 as ", text)
        text = re.sub(r"^from (" + "|".join(modules) + r") import ", rf"from {PACKAGE}.\1 import ", text, flags=re.M)
        path.write_text(text)
    (out / "__init__.py").write_text(HEADER)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if services/protos is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        if args.check:
            fresh = sorted(p.name for p in out.iterdir())
            current = sorted(p.name for p in OUT_DIR.glob("*") if p.is_file() and p.suffix in {".py", ".pyi"})
            _, mismatch, errors = filecmp.cmpfiles(out, OUT_DIR, fresh, shallow=False)
            if fresh != current or mismatch or errors:
                print(f"services/protos is stale (differs: {mismatch + errors}); run `make protos`")
                return 1
            print("services/protos is up to date")
            return 0
        for old in OUT_DIR.glob("*_pb2*"):
            old.unlink()
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for path in out.iterdir():
            shutil.copy2(path, OUT_DIR / path.name)
    print(f"generated {', '.join(sorted(p.name for p in OUT_DIR.iterdir() if p.is_file()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
