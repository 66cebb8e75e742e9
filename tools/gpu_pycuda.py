"""pycuda on a GPU machine with no registry: build its source distribution in place, then run the TensorRT backend's
device-memory half (primary context, streams, pagelocked and device buffers, copies each way) with it.

    python tools/gpu_pycuda.py build SDIST DEST [--jobs N] [--cuda-root DIR]   # prints the built folder
    python tools/gpu_pycuda.py probe BUILT                                      # one JSON line: what ran, or why not

The build compiles pycuda's C++ (its shipped Boost.Python subset included) with one compiler process per core: the
serial setuptools build takes minutes that a device lease does not have. TensorRT is never imported: the probe
drives `TensorRTModel.forward` and `unload` over an engine stand-in whose one "layer" is a device-to-device copy,
so every byte the check compares went host -> device -> device -> host through the backend's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cuda_root(given: str | None = None) -> Path | None:
    """The CUDA toolkit: `given`, else the first with include/cuda.h of nvcc's parent folder, /usr/local/cuda and
    /usr/local/cuda-*."""
    if given:
        return Path(given)
    candidates = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.insert(0, Path(nvcc).resolve().parents[1])
    return next((c for c in candidates if (c / "include" / "cuda.h").is_file()), None)


def driver_library() -> Path | None:
    """The driver's libcuda.so.1 (where a toolkit has no stub libcuda.so to link against)."""
    try:
        listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        listed = ""
    for line in listed.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return Path(line.split("=>", 1)[1].strip())
    for folder in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/cuda/compat"):
        if (Path(folder) / "libcuda.so.1").exists():
            return Path(folder) / "libcuda.so.1"
    return None


def parallel_compile(jobs: int) -> None:
    """Make setuptools' compiler build an extension's sources `jobs` at a time (it compiles one by one)."""
    from setuptools._distutils import ccompiler  # the compiler classes setuptools builds with

    def compile_all(
        self: Any,
        sources: list[str],
        output_dir: str | None = None,
        macros: Any = None,
        include_dirs: Any = None,
        debug: bool = False,
        extra_preargs: Any = None,
        extra_postargs: Any = None,
        depends: Any = None,
    ) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, [obj for obj in objects if obj in build]))
        return objects

    ccompiler.CCompiler.compile = compile_all


def run_setup(source: Path, jobs: int) -> None:
    """`setup.py build_ext --inplace` in `source`, compiling in parallel (runs in its own process)."""
    parallel_compile(jobs)
    os.chdir(source)
    sys.path.insert(0, str(source))
    sys.argv = ["setup.py", "build_ext", "--inplace"]
    import runpy

    runpy.run_path("setup.py", run_name="__main__")


def built_module(source: Path) -> Path | None:
    found = sorted((source / "pycuda").glob("_driver*.so"))
    return found[0] if found else None


def build(sdist: Path, dest: Path, jobs: int, root: Path | None) -> Path:
    """Unpack `sdist` under `dest` and build pycuda's extensions in place; the source folder, importable."""
    if root is None or not (root / "include" / "cuda.h").is_file():
        raise RuntimeError(f"no CUDA toolkit found (nvcc not on PATH, {root or '/usr/local/cuda'} has no cuda.h)")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(dest, filter="data")
    (source,) = [p for p in dest.iterdir() if p.is_dir() and p.name.startswith("pycuda-")]
    stubs = [str(root / d) for d in ("lib64", "lib64/stubs", "lib", "lib/stubs") if (root / d).is_dir()]
    if not any((Path(d) / "libcuda.so").exists() for d in stubs):
        driver = driver_library()
        if driver is not None:  # no stub to link against: link against the driver itself
            (dest / "driver").mkdir(parents=True, exist_ok=True)
            (dest / "driver" / "libcuda.so").symlink_to(driver)
            stubs.append(str(dest / "driver"))
    (source / "siteconf.py").write_text(
        f"CUDA_ROOT = {str(root)!r}\n"
        f"CUDADRV_LIB_DIR = {stubs!r}\n"
        "CUDA_ENABLE_CURAND = False\n"  # pycuda.curandom only; the backend needs the driver module
        "CUDA_ENABLE_GL = False\n"
        "USE_SHIPPED_BOOST = True\n"
    )
    log = dest / "build.log"
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, __file__, "_setup", str(source), str(jobs)],
            cwd=source,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 or built_module(source) is None:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line[:300] for line in lines if re.search(r"\berror:|fatal error|cannot find", line)]
        shown = "\n".join(errors[-8:] or lines[-15:])
        raise RuntimeError(f"setup.py build_ext exited {done.returncode} (log {log}):\n{shown}")
    return source


class _FakeTrt:
    """The few TensorRT names TensorRTModel touches, over an engine whose one layer copies the input's first rows."""

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            self.level = level

    class TensorIOMode:
        INPUT = "input"
        OUTPUT = "output"

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        trt = self

        class Runtime:
            def __init__(self, logger: Any) -> None:
                self.logger = logger

            def deserialize_cuda_engine(self, plan: bytes) -> Any:
                return _CopyEngine(trt.cuda)

        self.Runtime = Runtime

    @staticmethod
    def nptype(dtype: Any) -> Any:
        import numpy as np

        return np.float32


class _CopyEngine:
    """Input `features` (-1, 64) FP32, output `score` (-1, 1) FP32 = the first `rows` floats of the input buffer."""

    num_io_tensors = 2
    names = ("features", "score")

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda

    def get_tensor_name(self, index: int) -> str:
        return self.names[index]

    def get_tensor_mode(self, name: str) -> str:
        return _FakeTrt.TensorIOMode.INPUT if name == "features" else _FakeTrt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 64) if name == "features" else (-1, 1)

    def create_execution_context(self) -> Any:
        return _CopyContext(self.cuda)


class _CopyContext:
    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.addresses: dict[str, int] = {}
        self.rows = 0

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        self.rows = shape[0]

    def execute_async_v3(self, stream_handle: int) -> bool:
        # A blocking copy on the legacy stream, which waits for the instance's stream (created blocking).
        self.cuda.memcpy_dtod(self.addresses["score"], self.addresses["features"], self.rows * 4)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self.rows, 1)


def probe(source: Path) -> dict[str, Any]:
    """Run TensorRTModel's buffers, streams, copies and unload with the pycuda built in `source`."""
    sys.path.insert(0, str(source))
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import pycuda.driver as cuda

    from services.model.backends.gpu import require_gpu
    from services.model.backends.tensorrt import TensorRTModel
    from services.model.backends.tensorrt_plan import profile_for
    from services.model.config import ModelConfig

    config = ModelConfig.model_validate(
        {
            "name": "copy",
            "backend": "tensorrt",
            "max_batch_size": 128,
            "instance_count": 2,
            "inputs": [{"name": "features", "datatype": "FP32", "dims": [64]}],
            "outputs": [{"name": "score", "datatype": "FP32", "dims": [1]}],
        }
    )
    gpu = require_gpu("the pycuda probe")
    started = time.perf_counter()
    model = TensorRTModel(_FakeTrt(cuda), cuda, gpu, b"", config, profile_for(config))
    checked = 0
    try:
        for rows in (1, 7, 32, 128):
            x = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
            got = model.forward({"features": x})["score"]
            want = x.reshape(-1)[:rows].reshape(rows, 1)
            if got.shape != want.shape or not np.array_equal(got, want):
                raise AssertionError(f"batch {rows}: the copy came back different ({got.shape})")
            checked += rows
    finally:
        model.unload()
    return {
        "pycuda": __import__("pycuda").VERSION_TEXT,
        "driver_version": cuda.get_driver_version(),
        "rows_checked": checked,
        "instances": config.instance_count,
        "seconds": round(time.perf_counter() - started, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["_setup"]:
        run_setup(Path(args[1]), int(args[2]))
        return 0
    parser = argparse.ArgumentParser(prog="python tools/gpu_pycuda.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("sdist", type=Path)
    b.add_argument("dest", type=Path)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    b.add_argument("--cuda-root")
    p = sub.add_parser("probe")
    p.add_argument("built", type=Path)
    parsed = parser.parse_args(args)
    if parsed.command == "build":
        started = time.perf_counter()
        try:
            source = build(parsed.sdist, parsed.dest, parsed.jobs, cuda_root(parsed.cuda_root))
        except Exception as exc:
            print(json.dumps({"built": False, "why": str(exc), "seconds": round(time.perf_counter() - started)}))
            return 1
        print(json.dumps({"built": True, "source": str(source), "seconds": round(time.perf_counter() - started)}))
        return 0
    try:
        found = probe(parsed.built)
    except Exception as exc:
        print(json.dumps({"ran": False, "why": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"ran": True, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
